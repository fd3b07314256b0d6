"""The MI250X GCD's matrix rate with every GCD of every node busy: OpenMxP on Crusher.

The one in-situ measurement found of 16-bit matrix work on both GCDs of every MI250X package
at once, for minutes, in the ROCm 5 era of the LUMI23 rows: ORNL's HPL-MxP code OpenMxP
(at-aaims/OpenMxP, ``doc/crusher_example_32x32.out`` at 7c9b35f, run of 2023-03-27) on 128
Crusher nodes, 1,024 ranks, eight a node, one GCD each (``doc/OpenMxP.slurm``: ROCm 5.1.0,
``--ntasks-per-node=8 --gpus-per-task=1``). Crusher "contains identical hardware ... as" Frontier
(olcf/olcf-user-docs ``systems/crusher_quick_start_guide.rst``). The LU's trailing updates are
``rocblas_gemm_ex`` with FP16 A and B, FP32 C and FP32 compute (``src/rocm_device_macros.h``,
``GPUBLAS_SGEMM_EX`` with ``GPU_R_16F`` / ``GPU_R_32F``), which a CDNA2 GCD runs at its BF16
matrix rate (both 1,024 FLOP per clock per CU, the catalog's 191.5 TFLOP/s). The log prints the
LU's running rate per GCD every 10 of its 1,568 panel steps: 137.9 at the start, 146.52 at its
highest (step 160, 14.5 % of the work done), 136.36 at the end (308.86 s for the LU).

What it says (docs/validation.md section 8, "The MI250X GEMM level under load"): the package's
shared 560 W does not pull a GCD's large GEMMs below llmsim's rate. Over the whole LU, panel
factorisations and broadcasts included, the GCDs ran above llmsim's GEMM at the trailing
update's shape; so a ``clocks:`` entry slowing the MI250X's GEMMs would move llmsim away from this
run, and what the MI250X training rows miss is not the matrix rate under load.
"""

from __future__ import annotations

import pytest
from helpers import load_script

from llmsim.costs.compute import gemm_math_s
from llmsim.loader import load_spec
from llmsim.validation import load_runs

GRID = 32
"""P = Q = 32: the log's 'PxQ 32x32' over 1,024 ranks."""
LOCAL_N = 125_440
"""Each rank's share of the matrix's side (the log's ln=125440)."""
PANEL = 2_560
"""The panel width b: the K of every trailing-update GEMM (the log's b=2560)."""
RANKS = 1_024
LU_S = 308.86
"""'LU factorization 308.86 sec'."""
LU_TFLOPS_PER_GCD = 136.36
"""The log's last running rate, step 1,560, 308.80 s."""
HIGHEST_TFLOPS_PER_GCD = 146.52
"""The log's highest running rate: step 160, 79.31 s, 72.41 % of the work left."""


def _gcd():
    return load_spec("accelerators", "mi250x-gcd")


def _model_tflops(m: int, n: int, k: int, precision: str) -> float:
    gcd = _gcd()
    seconds = gemm_math_s(m, n, k, 1, gcd.gemm, gcd.peak_flops(precision), precision,
                          memory_bytes_per_s=gcd.sustained_memory_bytes_per_s)
    return 2 * m * n * k / seconds / 1e12


def test_the_log_is_transcribed_consistently() -> None:
    """N = P × LN (the log's n=4014080), and the LU's 2/3 N³ over its time and ranks is the
    last running rate the log prints (136.36 TFLOP/s per GCD)."""
    n = GRID * LOCAL_N
    assert n == 4_014_080
    assert 2 / 3 * n**3 / LU_S / RANKS / 1e12 == pytest.approx(LU_TFLOPS_PER_GCD, rel=1e-3)
    # FP16 inputs with FP32 accumulation run at the BF16 matrix rate on a GCD
    assert _gcd().dense_tflops.fp16 == _gcd().dense_tflops.bf16 == 191.5


def test_llmsim_prices_the_trailing_update_below_the_whole_lu_under_load() -> None:
    """llmsim gives the first trailing update (125,440 × 125,440 × 2,560, FP16) 129.9 TFLOP/s:
    0.95 of the whole LU's rate and 0.89 of its highest, though the LU's rates include its
    panels and broadcasts. So with all eight GCDs of each node running matrix work the GEMMs
    were at least 1.13 × llmsim's rate: the shared power limit costs no more than the
    catalog's level already leaves out."""
    model = _model_tflops(LOCAL_N, LOCAL_N, PANEL, "fp16")
    assert model == pytest.approx(129.9, abs=0.2)
    assert model < LU_TFLOPS_PER_GCD < HIGHEST_TFLOPS_PER_GCD
    assert model / HIGHEST_TFLOPS_PER_GCD == pytest.approx(0.887, abs=0.005)
    # a quarter of the way in, the trailing matrix is still 0.87 of the side: the same rate
    assert _model_tflops(109_000, 109_000, PANEL, "fp16") == pytest.approx(model, rel=0.01)


def test_the_rows_gaps_would_need_gemms_far_below_the_in_situ_rate() -> None:
    """If the GEMMs alone had to close LUMI23-06 (−27 %) or LUMIRF25-03 (−25 %), they would
    have to run at 0.67 and 0.69 of llmsim's rate: 0.59–0.61 of what the GCDs sustained in the
    OpenMxP run (146.5 / 129.9 = 1.13 × llmsim). The rows' missing time is not the matrix rate
    under the power limit."""
    script = load_script("benchmarks/mi250x_decomposition.py", "mi250x_decomposition_insitu")
    in_situ = HIGHEST_TFLOPS_PER_GCD / _model_tflops(LOCAL_N, LOCAL_N, PANEL, "fp16")
    for row, needed in (("LUMI23-06", 0.67), ("LUMIRF25-03", 0.69)):
        d = script.decompose(next(r for r in load_runs(row) if r.id == row))
        fraction = d.gemm_s / (d.gemm_s + d.shortfall_s)
        assert fraction == pytest.approx(needed, abs=0.01)
        assert fraction / in_situ < 0.62
