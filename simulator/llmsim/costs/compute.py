"""Compute cost model: a roofline per kernel, with GEMM tile and wave quantisation.

Every kernel takes the longer of its math time and its memory time, plus the device's
launch cost per kernel (Williams, Waterman & Patterson, "Roofline", CACM 52(4), 2009)::

    t = max(flops / (peak(dtype) · η), bytes / (hbm_bw · memory fraction(kind))) + launch

(the host's issue, which a pass's short kernels may wait for, is priced per pass:
:mod:`llmsim.costs.host_issue`).

The memory fraction is ``memory_bound_fraction`` for streaming kernels, and the measured
``memory_fraction_by_kind`` for the kinds that run slower (norms and their backward, the
optimizer step) where the catalog has them.

The achieved-efficiency factor η depends on the kernel kind:

* ``gemm``: ``η_gemm = peak_fraction × wave efficiency × K / (K + k_fill)``, applied to the
  FLOPs of the tile-padded problem (tile quantisation), on the fastest of the library's
  tiles and, for a GEMM of less than one wave, splits of K, see :func:`gemm_math_s`;
* ``attention`` (a fused flash kernel): ``accelerator.attention_fraction`` for
  FlashAttention-2, or its measured throughput by sequence length and head dimension
  where the catalog has it (:func:`flash_attention_flops`),
  ``accelerator.cudnn_attention_fraction`` for cuDNN's kernel;
* ``memory``: no math term, only the bandwidth term.

A GEMM op with ``splits`` runs as that many GEMMs of ⌈M/splits⌉ rows, and one with
``reserved_units`` on the compute units other kernels leave it (Transformer Engine's
comm-GEMM overlap, see :func:`gemm_math_s`).

A measured GEMM table (:class:`llmsim.calibration.Calibration`) replaces η_gemm by the
achieved TFLOP/s interpolated among the measured shapes (:class:`GemmTable`); without
one, a shape the catalog timed on the board (``gemm.measured_tflops``) takes its measured
rate (:func:`measured_shape_rates`), and a GEMM with a dimension off the library's 16-byte
alignment (an unpadded vocabulary) the rate measured for such GEMMs (``gemm.unaligned_tflops``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import get_args

from llmsim.costs.allocator import PageRoundTrip
from llmsim.costs.attention_relative import RelativePricing
from llmsim.costs.attention_tables import attention_table
from llmsim.costs.batched_gemm import one_matrix_per_unit_s
from llmsim.costs.clocks import slowdown, slowdowns
from llmsim.costs.cpu_gemm import cpu_gemm_s
from llmsim.costs.flash_curve import flash_attention_flops as flash_attention_flops
from llmsim.costs.flash_curve import flash_pass_flops
from llmsim.costs.gemm_shape import GemmShape, gemm_shape
from llmsim.costs.gemm_tables import GemmTable as GemmTable
from llmsim.costs.gemm_tables import is_aligned, measured_shape_rates, unaligned_rates
from llmsim.costs.grouped_gemms import GroupedGemmRates
from llmsim.costs.host_issue import HostIssue
from llmsim.ops import ComputeOp
from llmsim.specs import Accelerator, AttentionKernel, Dtype, GemmModel, MemoryKind
from llmsim.specs.training import HostPath


def gemm_efficiency(
    m: int, n: int, k: int, batch: int, gemm: GemmModel, dtype: Dtype = "bf16"
) -> float:
    """η_gemm = peak_fraction × wave efficiency × K/(K + k_fill), on the padded FLOPs, for
    the main tile without split-K (:func:`gemm_math_s` prices the fastest configuration).

    ``peak_fraction`` is the best measured fraction of dense peak (a large, well-shaped
    GEMM); wave efficiency is §3.2 of NVIDIA's Matrix Multiplication Background guide;
    ``k_fill`` models the software-pipelined main loop of each tile, which fills
    ``k_fill`` K-elements of stages before its first MMA and drains them at the end
    (CUTLASS multistage main loop; the value per accelerator is in its YAML).
    """
    return _efficiency(gemm_shape(m, n, k, batch, gemm), gemm, dtype)


def _efficiency(shape: GemmShape, gemm: GemmModel, dtype: Dtype) -> float:
    return gemm.fraction(dtype) * shape.wave_efficiency * shape.k_efficiency


_OUTPUT_BYTES: dict[str, int] = {"fp64": 8, "fp32": 4, "tf32": 4}
"""Bytes of one output element by GEMM dtype; 16-bit and FP8 GEMMs write 16-bit outputs."""


def gemm_math_s(
    m: int,
    n: int,
    k: int,
    batch: int,
    gemm: GemmModel,
    peak_flops: float,
    dtype: Dtype = "bf16",
    reserved_units: int = 0,
    splits: int = 1,
    concurrent: int = 1,
    *,
    memory_bytes_per_s: float,
) -> float:
    """Math time of a GEMM: padded FLOPs / (peak · η_gemm), on its fastest configuration.

    Padding (tile quantisation, guide §3.1) is counted as work: an M of 129 with 128-row
    tiles costs as much as an M of 256. Equivalently the time is
    2·tile_m·tile_n·waves·compute_units·(K + k_fill) / (peak · peak_fraction): it grows
    with the number of waves and with K, never with a smaller problem.

    With ``reserved_units`` held by other kernels, the tiles are spread over the
    ``u = compute_units − reserved_units`` left, each at its share of the peak, peak/units:
    waves = ⌈tiles/u⌉, so the GEMM is never faster than on the whole device.

    A GEMM run as ``splits`` GEMMs of ⌈M/splits⌉ rows on one stream pays every chunk's
    waves, the last one partial: ``splits · ⌈tiles_per_chunk / u⌉``. Chunks on
    ``c = min(concurrent, splits) > 1`` streams share the units: at most
    ``min(u, c · tiles_per_chunk)`` tiles are resident at a time, one chunk's tiles fill
    another's partial wave, and all ``splits · tiles_per_chunk`` tiles take
    ``⌈splits · tiles_per_chunk / resident⌉`` waves; a small chunk (Transformer Engine's
    ``tokens/tp`` rows) that fills a third of the units runs three at a time on three
    streams.

    The library's configurations are every tile of :meth:`GemmModel.tiles` and, with
    :attr:`GemmModel.split_k`, every split of K in ``s = 2 … ⌊u / tiles⌋`` parts for a
    chunk whose tiles fill less than one wave: ``s`` times the tiles, each over K/s (and
    its own ``k_fill``), then a reduction kernel that reads the ``s`` FP32 partial sums
    the blocks wrote and writes the output, ``(2·s·4 + out) · rows · N`` bytes at
    ``memory_bytes_per_s``. The GEMM takes the fastest.
    """
    units = gemm.compute_units - reserved_units
    rows = math.ceil(m / splits)
    together = min(concurrent, splits)
    per_tile_s = 2.0 * gemm.compute_units / (peak_flops * gemm.fraction(dtype))
    out_bytes = _OUTPUT_BYTES.get(dtype, 2)
    best = math.inf
    for tile_m, tile_n in gemm.tiles():
        tiles = batch * math.ceil(rows / tile_m) * math.ceil(n / tile_n)
        most = units // tiles if gemm.split_k and tiles < units else 1
        for parts in range(1, most + 1):
            chunk_tiles = tiles * parts
            if together == 1:
                waves = splits * math.ceil(chunk_tiles / units)
            else:
                waves = math.ceil(splits * chunk_tiles / min(units, together * chunk_tiles))
            seconds = per_tile_s * tile_m * tile_n * (k / parts + gemm.k_fill) * waves
            if parts > 1:
                reduced_bytes = splits * batch * rows * n * (2 * 4 * parts + out_bytes)
                seconds += reduced_bytes / memory_bytes_per_s
            best = min(best, seconds)
    return best


class ComputeModel:
    """Roofline prices of compute ops on one accelerator in one dtype (memoised)."""

    def __init__(
        self,
        accelerator: Accelerator,
        dtype: Dtype,
        gemm_table: GemmTable | None = None,
        attention_kernel: AttentionKernel = "flash",
        power_limit_w: float | None = None,
        cuda_graphs: bool = False,
        page_round_trip: PageRoundTrip | None = None,
        host_path: HostPath = "bare",
        host_ahead: bool = False,
    ) -> None:
        self.accelerator = accelerator
        self.page_round_trip = page_round_trip
        """Page faults and ``munmap`` of the outputs a glibc-allocated framework maps
        fresh (``training.allocator: glibc``); None: memory is cached."""
        self.clock_slowdowns = slowdowns(accelerator.clocks, power_limit_w)
        """Factor on the math time of each compute kind from the sustained SM clock under
        the power limit (:mod:`llmsim.costs.clocks`); empty: the catalog's rates."""
        self.attention_fraction = (
            accelerator.cudnn_attention_fraction or 0.0
            if attention_kernel == "cudnn"
            else accelerator.attention_fraction
        )
        self.flash_curve = (
            accelerator.flash_attention_tflops
            if attention_kernel in ("flash", "flash1", "triton_fwd") else None
        )
        self.flash_passes = (
            {"F": accelerator.flash_attention_fwd_tflops,
             "R": accelerator.flash_attention_fwd_tflops,
             "B": accelerator.flash_attention_bwd_tflops}
            if attention_kernel in ("flash", "triton_fwd") else {})
        """FlashAttention-2's own forward and backward curves by phase, where the catalog
        has them (``flash1`` keeps the combined curve: its ratio to FlashAttention-2 was
        timed forward + backward)."""
        self.relative = RelativePricing.of(accelerator, attention_kernel)
        """A kernel priced from FlashAttention-2's time by a side-by-side ratio (``flash1``,
        ``triton_fwd``: :mod:`llmsim.costs.attention_relative`); None for the others."""
        self.attention_table = attention_table(accelerator, attention_kernel)
        """The attention kernel's rates timed by shape on the board
        (``flash_attention_measured``, ``cudnn_attention_measured`` and their blocks)."""
        self.dtype = dtype
        self.peak_flops = accelerator.peak_flops(dtype)
        self.memory_bytes_per_s = accelerator.sustained_memory_bytes_per_s
        self.memory_rates: dict[MemoryKind, float] = {
            kind: accelerator.memory_bytes_per_s(kind) for kind in get_args(MemoryKind)}
        """Bandwidth of each kind of memory-bound kernel, bytes/s (``stream`` is
        :attr:`memory_bytes_per_s`; norms and the optimizer step where the catalog measured
        them, ``memory_fraction_by_kind``)."""
        self.launch_s = accelerator.kernel_launch_us * 1e-6
        self.host_issue = HostIssue.of(accelerator, cuda_graphs, host_path, host_ahead)
        """The host's issue of the compute kernels (:mod:`llmsim.costs.host_issue`)."""
        self.compute_launch_s = self.host_issue.kernel_gap_s
        """Launch cost of each compute kernel on the device, s: ``kernel_launch_us``, or
        where the step's kernels replay from captured CUDA graphs
        (``training.cuda_graphs``) the board's per-kernel cost in a graph
        (``graph_kernel_us``; none where not measured)."""
        self.gemm_table = gemm_table
        self.measured_shapes = measured_shape_rates(accelerator)
        """FLOP/s of the catalog's GEMMs timed by shape (``gemm.measured_tflops``), at the
        clock the catalog's rates are given at; keyed by (dtype, M, N, K)."""
        self.grouped_rates = GroupedGemmRates(accelerator)
        """FLOP/s of the catalog's grouped GEMMs timed by shape (``gemm.grouped_tflops``)."""
        self.unaligned_rates = unaligned_rates(accelerator)
        """FLOP/s of a GEMM off the library's alignment, by dtype, at the clock the catalog's
        rates are given at (``gemm.unaligned_tflops``)."""
        self._cache: dict[tuple[object, ...], float] = {}
        self._math_by_kind: dict[str, Callable[[ComputeOp], float]] = {
            "gemm": self.gemm_math_s,
            "attention": self.attention_math_s if self.relative is None
            else self.relative_math_s,
            "memory": self.memory_math_s,
        }

    def compute_s(self, op: ComputeOp) -> float:
        """Duration of ``op`` in seconds: max(math, memory) + one launch per split (none
        with CUDA graphs), + its output's page round trip under glibc's allocator.

        A GEMM run as ``splits`` equal chunks takes ``splits`` times a chunk's
        max(math, memory) + launch; the chunks' math is in :meth:`gemm_math_s`.
        """
        key = (op.kind, op.flops, op.bytes, op.mnk, op.batch, op.executed_fraction, op.dtype,
               op.splits, op.concurrent_splits, op.reserved_units, op.attention_shape,
               op.memory_kind, op.attention_heads, op.kind == "attention" and op.phase == "B",
               op.output_bytes, op.attention_ring_steps)
        cached = self._cache.get(key)
        if cached is None:
            cached = self._cache[key] = (
                max(self.math_s(op), op.bytes / self.memory_rates[op.memory_kind])
                + op.splits * self.compute_launch_s
            )
            if self.page_round_trip is not None:
                cached = self._cache[key] = cached + self.page_round_trip.op_s(op)
        return cached

    def math_s(self, op: ComputeOp) -> float:
        """Math-bound time of ``op`` by kind: GEMM, fused attention, none for memory; a
        GEMM or attention kernel at the catalog's rate slowed by its kind's sustained SM
        clock (:mod:`llmsim.costs.clocks`). A measured GEMM table already holds the clock
        its board sustained and is not slowed again."""
        seconds = self._math_by_kind[op.kind](op)
        if not self.clock_slowdowns or (op.kind == "gemm" and self._measured(op)):
            return seconds
        return seconds * slowdown(self.clock_slowdowns, op.kind, self._dtype(op))

    def _measured(self, op: ComputeOp) -> bool:
        return (self.gemm_table is not None and op.mnk is not None
                and self.gemm_table.covers(self._dtype(op)))

    def memory_math_s(self, op: ComputeOp) -> float:
        """A memory-bound kernel has no math term: its time is its bytes."""
        return 0.0

    def _dtype(self, op: ComputeOp) -> Dtype:
        return op.dtype or self.dtype  # type: ignore[return-value]

    def gemm_math_s(self, op: ComputeOp) -> float:
        """GEMM: padded FLOPs at η_gemm, or FLOPs at the measured throughput (a calibration
        table, else the catalog's own measured shape, :func:`measured_shape_rates`, or a
        batched GEMM's grouped GEMMs timed by shape, :mod:`llmsim.costs.grouped_gemms`); a GEMM
        with a dimension off the library's alignment at the catalog's measured rate for
        such GEMMs where it has one (``gemm.unaligned_tflops``).

        A GEMM in ``splits`` chunks is priced as that many GEMMs of ⌈M/splits⌉ rows, up to
        ``concurrent_splits`` of them at once, on the compute units its neighbours'
        ``reserved_units`` leave (:func:`gemm_math_s`); a measured table, which has
        no units, prices each chunk at the rate measured for its shape alone, slowed by
        compute_units / (compute_units − reserved_units). A batched GEMM on a library that
        runs one matrix per unit (``gemm.batched``) takes ⌈batch/units⌉ single-unit rounds
        (:func:`llmsim.costs.batched_gemm.one_matrix_per_unit_s`). A CPU BLAS with measured
        square GEMMs (``gemm.square_fraction``) prices its dtype's GEMMs from them instead
        of tiles (:func:`llmsim.costs.cpu_gemm.cpu_gemm_s`).
        """
        dtype = self._dtype(op)
        peak = self.accelerator.peak_flops(dtype)
        gemm = self.accelerator.gemm
        if op.mnk is None:
            # No shape: a large, well-shaped GEMM (no quantisation losses).
            return op.executed_flops / (peak * gemm.fraction(dtype))
        m, n, k = op.mnk
        rows = math.ceil(m / op.splits)
        if self.gemm_table is not None and self.gemm_table.covers(dtype):
            achieved = self.gemm_table.achieved_flops(rows, n, k, op.batch, dtype)
            units = gemm.compute_units
            return op.executed_flops / achieved * units / (units - op.reserved_units)
        measured = (self.measured_shapes.get((dtype, rows, n, k)) if op.batch == 1
                    else self.grouped_rates.flops(dtype, op.batch, rows, n, k)
                    if self.grouped_rates else None)
        if measured is not None:
            units = gemm.compute_units
            return op.executed_flops / measured * units / (units - op.reserved_units)
        unaligned = self.unaligned_rates.get(dtype)
        if unaligned is not None and not is_aligned(rows, n, k, dtype, gemm.alignment_bytes):
            units = gemm.compute_units
            return op.executed_flops / unaligned * units / (units - op.reserved_units)
        cpu = cpu_gemm_s(rows, n, k, op.batch, gemm, peak, dtype, op.reserved_units)
        if cpu is not None:  # a CPU BLAS's measured squares (llmsim.costs.cpu_gemm)
            return op.splits * op.executed_fraction * cpu
        if gemm.batched == "one_matrix_per_unit" and op.batch > 1:
            return op.splits * op.executed_fraction * one_matrix_per_unit_s(
                rows, n, k, op.batch, gemm, peak, dtype, op.reserved_units)
        return op.executed_fraction * gemm_math_s(
            m, n, k, op.batch, gemm, peak, dtype, op.reserved_units, op.splits,
            op.concurrent_splits, memory_bytes_per_s=self.memory_bytes_per_s)

    def relative_math_s(self, op: ComputeOp) -> float:
        """A kernel priced from FlashAttention-2 (``flash1``, ``triton_fwd``): its time
        (:meth:`attention_math_s`) times the measured ratio at the op's shape and phase
        (:class:`llmsim.costs.attention_relative.RelativePricing`)."""
        factor = self.relative.factor(op) if self.relative is not None else 1.0
        return self.attention_math_s(op) * factor

    def attention_math_s(self, op: ComputeOp) -> float:
        """Fused attention: executed FLOPs at the kernel's fraction of peak
        (``attention_fraction`` for FlashAttention-2, ``cudnn_attention_fraction`` for cuDNN).

        Where the accelerator has a measured FlashAttention-2 curve
        (``flash_attention_tflops``) the FlashAttention-2 kernel runs at the curve's
        throughput for its sequence length and head dimension
        (:func:`flash_attention_flops`) instead, the forward and the backward each at its
        own curve where the catalog has them (``flash_attention_fwd_tflops``,
        ``_bwd_tflops``: :func:`flash_pass_flops`), and a kernel timed on the board
        (``flash_attention_measured`` or ``cudnn_attention_measured``: heads and KV heads on
        the device, sequence, head dimension; with context parallelism the ring's
        non-causal steps at the blocks' rates) at the measured forward or backward rate,
        looked up or interpolated (:mod:`llmsim.costs.attention_tables`), before either.

        A device without a fused attention kernel (``attention_fraction == 0``) computes
        the same Q·Kᵀ and P·V products as GEMMs: they are priced at the large-GEMM
        efficiency ``gemm.peak_fraction`` (the op carries no single GEMM shape to
        quantise; the softmax traffic is in its ``bytes``).

        With ``reserved_units`` held by other kernels the attention kernel's blocks run on
        the units left: slower by compute_units / (compute_units − reserved_units) (it is
        priced by its throughput, without waves to quantise).
        """
        units = self.accelerator.gemm.compute_units
        slowed = units / (units - op.reserved_units)
        if self.attention_table:
            seconds = self.attention_table.math_s(op)
            if seconds is not None:  # timed at or around this shape: forward or backward
                return slowed * seconds
        if self.flash_curve and op.attention_shape is not None:
            seq_len, head_dim = op.attention_shape
            return slowed * op.executed_flops / flash_pass_flops(
                self.flash_curve, self.flash_passes.get(op.phase), seq_len, head_dim)
        dtype = self._dtype(op)
        fraction = self.attention_fraction or self.accelerator.gemm.fraction(dtype)
        return slowed * op.executed_flops / (self.accelerator.peak_flops(dtype) * fraction)
