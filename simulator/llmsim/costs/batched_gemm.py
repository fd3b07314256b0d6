"""A batched GEMM run one matrix per compute unit (a CPU framework's batched matmul).

PyTorch's batched matmul on a CPU without MKL (``torch.bmm`` / ``torch.baddbmm``, the
unfused attention's scores Q·Kᵀ and context P·V) is, in Fujitsu's PyTorch for A64FX,
``_baddbmm_blas_`` (``aten/src/ATen/native/cpu/LinearAlgebra.cpp``, commit ae911ae566
"Add implementation of baddbmm when MKL disabled", branch ``fujitsu_v1.7.0_for_a64fx`` of
github.com/fujitsu/pytorch): it deals the matrices of the batch out to the OpenMP threads
with a greedy least-loaded schedule (``schedule_batch``; equal matrices go round-robin)
and, inside ``at::parallel_for``, each thread calls the BLAS ``sgemm`` on its own
matrices, so each matrix runs single-threaded on one core. A batch of fewer matrices
than cores leaves the other cores idle: with tensor parallelism the batch is the
micro-batch times the heads on the rank, two for a 40-head model at TP 20 on 48 cores.
"""

from __future__ import annotations

import math

from llmsim.specs import Dtype, GemmModel


def one_matrix_per_unit_s(
    m: int,
    n: int,
    k: int,
    batch: int,
    gemm: GemmModel,
    peak_flops: float,
    dtype: Dtype,
    reserved_units: int = 0,
    fraction: float | None = None,
) -> float:
    """Math time, s, of ``batch`` GEMMs of M×N×K, each on one compute unit:

        t = ⌈batch / u⌉ · 2·M·N·K / (peak / compute_units · η)

    with ``u = compute_units − reserved_units`` the units free to take a matrix, each at
    its share of the device's peak (``peak_flops``, FLOP/s) and the library's fraction
    ``η``: ``fraction`` where the caller read it by shape (a CPU BLAS's one-thread curve,
    :mod:`llmsim.costs.cpu_gemm`), else the best one, ``gemm.fraction(dtype)``. A round of
    up to ``u`` matrices takes as long as one matrix alone; there is no tile or wave
    quantisation inside a matrix (one unit runs all of it).
    """
    units = gemm.compute_units - reserved_units
    rounds = math.ceil(batch / units)
    eta = gemm.fraction(dtype) if fraction is None else fraction
    per_unit_flops = peak_flops / gemm.compute_units * eta
    return rounds * 2.0 * m * n * k / per_unit_flops
