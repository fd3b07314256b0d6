"""Accelerator spec: what one OS-visible device can compute and move."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, PositiveFloat, PositiveInt, model_validator

from llmsim.specs._base import Name, Spec
from llmsim.specs.clocks import SustainedClocks
from llmsim.specs.host_pages import HostPageCosts
from llmsim.specs.power import DevicePower

Dtype = Literal["fp64", "fp32", "tf32", "bf16", "fp16", "fp8"]

MemoryKind = Literal["stream", "layernorm", "rmsnorm", "norm_backward", "optimizer"]
"""What a memory-bound kernel does, where kinds run at different shares of the HBM
bandwidth: ``stream`` elementwise kernels (copies, casts, activations, residual adds),
``layernorm`` and ``rmsnorm`` a norm's forward (a reduction over each row, then a pass),
``norm_backward`` a norm's backward (input gradient and the weight and bias gradients),
``optimizer`` the multi-tensor Adam step over the local shard."""


class DenseTflops(Spec):
    """Dense (no structured sparsity) peak throughput per data type, TFLOP/s."""

    fp64: PositiveFloat | None = None
    """FP64 peak (matrix units where present), TFLOP/s."""
    fp32: PositiveFloat | None = None
    """FP32 peak (vector or packed), TFLOP/s."""
    tf32: PositiveFloat | None = None
    """TF32 tensor peak, dense, TFLOP/s."""
    bf16: PositiveFloat | None = None
    """BF16 tensor/matrix peak, dense, TFLOP/s."""
    fp16: PositiveFloat | None = None
    """FP16 tensor/matrix peak, dense, TFLOP/s."""
    fp8: PositiveFloat | None = None
    """FP8 tensor peak, dense, TFLOP/s."""


MeasuredGemm = tuple[PositiveInt, PositiveInt, PositiveInt, PositiveFloat]
"""One GEMM timed on a board: M, N, K and its achieved TFLOP/s."""


MeasuredGroupedGemm = tuple[PositiveInt, PositiveInt, PositiveInt, PositiveInt, PositiveFloat]
"""One grouped GEMM timed on a board: experts E, rows per expert T, N, K and its achieved
TFLOP/s (E GEMMs of [T × K]·[K × N] in one kernel, 2·E·T·N·K FLOPs)."""


MeasuredAttention = tuple[PositiveInt, PositiveInt, PositiveInt, PositiveInt, PositiveFloat,
                          PositiveFloat]
"""One causal flash attention kernel timed on a board: query heads and key-value heads (times
the micro-batch), sequence length, head dimension, then its forward and backward TFLOP/s with
FLOPs counted as llmsim's attention ops execute them (the causal half; the backward 2.5× the
forward)."""


MeasuredAttentionBlock = tuple[PositiveInt, PositiveInt, PositiveInt, PositiveInt, PositiveInt,
                               PositiveFloat, PositiveFloat]
"""One non-causal attention kernel timed on a board: query heads and key-value heads, query
tokens, key-value tokens, head dimension, then its forward and backward TFLOP/s (FLOPs
4·heads·q·kv·d forward, the backward 2.5× the forward): the off-diagonal steps of a
context-parallel ring."""


class GemmModel(Spec):
    """Achieved GEMM throughput model: best-case fraction of peak, then tile effects.

    The GEMM is cut into ``tile_m × tile_n`` output tiles spread over ``compute_units``;
    the last partial wave wastes units (wave quantisation), and each tile pays a
    pipeline fill of ``k_fill`` K-elements before it streams (small-K penalty). Where the
    library has more than one tile shape (``extra_tiles``) or splits K over several
    thread blocks (``split_k``), each GEMM takes its fastest configuration.
    """

    peak_fraction: float = Field(gt=0, le=1)
    """Best fraction of dense peak reached by large, well-shaped GEMMs (e.g. MAMF)."""
    compute_units: PositiveInt
    """Units that output tiles are distributed over (SMs, CUs, Xe-cores, cores)."""
    tile_m: PositiveInt = 128
    """Rows of one output tile of the library's large-GEMM kernel."""
    tile_n: PositiveInt = 128
    """Columns of one output tile."""
    k_fill: float = Field(default=0.0, ge=0)
    """Per-tile pipeline prologue/epilogue, in equivalent K elements."""
    peak_fraction_by_dtype: dict[Dtype, Annotated[float, Field(gt=0, le=1)]] = Field(
        default_factory=dict)
    """Measured best fraction for data types that differ from ``peak_fraction`` (e.g. fp8)."""
    extra_tiles: list[tuple[PositiveInt, PositiveInt]] = Field(default_factory=list)
    """Other output tiles (rows, columns) the library's kernels use beside
    ``tile_m × tile_n``, each at ``peak_fraction``: a GEMM runs on the tile that finishes it
    first (a smaller tile wastes less padding and fills more units)."""
    split_k: bool = False
    """The library splits K into up to ⌊units / tiles⌋ parts, one thread block per tile
    and part, when a GEMM's tiles fill less than one wave (parallel split-K: each block
    writes an FP32 partial sum, a reduction kernel adds them), where that is faster."""
    batched: Literal["tiled", "one_matrix_per_unit"] = "tiled"
    """How the library runs a batched GEMM (the unfused attention's scores and context):
    ``tiled``, the tiles of all its matrices spread over the units together (cuBLAS's
    strided-batched kernels); ``one_matrix_per_unit``, each matrix a single-threaded GEMM
    on one unit, the matrices dealt out over the units in ⌈batch / units⌉ rounds (a CPU
    framework calling its BLAS from inside a parallel loop,
    :func:`llmsim.costs.batched_gemm.one_matrix_per_unit_s`)."""

    measured_tflops: dict[Dtype, list[MeasuredGemm]] = Field(default_factory=dict)
    """GEMMs timed on the board, by dtype: (M, N, K, achieved TFLOP/s) at the sustained
    clock of the accelerator's ``clocks.measured`` point for its kind (at the board's power
    limit). A GEMM of one of these shapes runs at its measured rate instead of the model's
    (:class:`llmsim.costs.compute.ComputeModel`); every other shape keeps the model."""
    grouped_tflops: dict[Dtype, list[MeasuredGroupedGemm]] = Field(default_factory=dict)
    """Grouped GEMMs (a mixture-of-experts layer's expert GEMMs in one kernel) timed on the
    board, by dtype (see :data:`MeasuredGroupedGemm`), at the sustained clock as
    ``measured_tflops`` are. A batched GEMM of a timed (N, K) runs at the rate
    interpolated over its experts and rows per expert
    (:mod:`llmsim.costs.grouped_gemms`); every other shape keeps the model."""
    unaligned_tflops: dict[Dtype, PositiveFloat] = Field(default_factory=dict)
    """Achieved TFLOP/s, by dtype, of a GEMM one of whose M, N, K is not a multiple of
    ``alignment_bytes`` worth of elements (an unpadded vocabulary split over tensor ranks:
    50,257 / 8 = 6,283 columns), measured on the board at the sustained clock of its kind
    as ``measured_tflops`` are: the library cannot use its vectorised (TMA) kernels and
    falls back to slower ones. A dtype not given prices such a GEMM like any other."""
    square_fraction: dict[Dtype, dict[PositiveInt, Annotated[list[tuple[PositiveInt, Annotated[
        float, Field(gt=0, le=1)]]], Field(min_length=1)]]] = Field(default_factory=dict)
    """A CPU BLAS's square GEMMs (m = n = k) measured by dtype and thread count:
    ``[size, fraction of the threads' peak]``. Where given for a GEMM's dtype and thread
    count (``compute_units`` for a multi-threaded call, 1 for a matrix of a batch run one
    per core) it replaces ``peak_fraction`` and the tiles: the GEMM is read at the square of
    its volume (:mod:`llmsim.costs.cpu_gemm`)."""
    framework_share: float | None = Field(default=None, gt=0, le=1)
    """Share of the library's measured square rate (``square_fraction``) that a GEMM
    reaches when a framework calls the library, the same at every shape and thread count;
    None: the library's own rate, at most ``peak_fraction`` (:mod:`llmsim.costs.cpu_gemm`)."""
    alignment_bytes: PositiveInt = 16
    """Leading-dimension alignment, bytes, that the library's fast GEMM kernels need
    (cuBLAS: 16 bytes, NVIDIA's Matrix Multiplication Background guide, "Tensor Core
    Requirements"): 8 BF16 elements, 16 FP8 ones."""

    @model_validator(mode="after")
    def _check_framework_share(self) -> GemmModel:
        """``framework_share`` scales the measured square curve; without one it would be
        silently ignored."""
        if self.framework_share is not None and not self.square_fraction:
            raise ValueError(
                f"gemm.framework_share: {self.framework_share} is a share of the library's "
                "measured square rate, and gemm.square_fraction is not given; give the "
                "curve, or remove framework_share")
        return self

    def tiles(self) -> list[tuple[int, int]]:
        """Every output tile (rows, columns) the library runs, the main one first."""
        return [(self.tile_m, self.tile_n), *self.extra_tiles]

    def fraction(self, dtype: Dtype) -> float:
        """Best fraction of the dense peak of ``dtype`` reached by large GEMMs."""
        return self.peak_fraction_by_dtype.get(dtype, self.peak_fraction)


class Accelerator(Spec):
    """One device as the OS and the framework see it (an MI250X GCD, a PVC stack, ...)."""

    name: Name
    """Catalog name, e.g. ``a100-sxm4-80gb``."""
    description: str = ""
    """Human-readable name."""
    vendor: str = ""
    """Manufacturer."""
    device_unit: Literal["package", "gcd", "stack", "chip", "numa_domain"] = "package"
    """What one device is: a whole package, one GCD of a multi-die package, one stack, a chip,
    or one NUMA domain of a chip (an A64FX CMG, when a process runs on each)."""
    dense_tflops: DenseTflops
    """Dense peak per data type, TFLOP/s."""
    hbm_gb: PositiveFloat
    """Device memory capacity, GB (10^9 bytes)."""
    hbm_tbps: PositiveFloat
    """Peak device memory bandwidth, TB/s."""
    gemm: GemmModel
    """Achieved GEMM efficiency model."""
    memory_bound_fraction: float = Field(gt=0, le=1)
    """Achieved fraction of peak HBM bandwidth for streaming (memory-bound) kernels."""
    memory_fraction_by_kind: dict[MemoryKind, Annotated[float, Field(gt=0, le=1)]] = Field(
        default_factory=dict)
    """Measured fraction of peak HBM bandwidth for kinds of memory-bound kernel that differ
    from ``memory_bound_fraction`` (norms, their backward, the optimizer step), counting
    the bytes llmsim counts for the kernel; a kind not given runs at
    ``memory_bound_fraction``."""
    attention_fraction: float = Field(default=0.0, ge=0, le=1)
    """Achieved fraction of dense peak of a fused (flash) attention kernel; 0 = no fused kernel."""
    cudnn_attention_fraction: float | None = Field(default=None, gt=0, le=1)
    """The same for cuDNN's fused flash attention (``training.attention_kernel: cudnn``);
    None where the catalog has no measurement of it."""
    flash_attention_tflops: dict[PositiveInt, dict[PositiveInt, PositiveFloat]] | None = None
    """Measured FlashAttention-2 forward + backward throughput with a causal mask, TFLOP/s,
    by head dimension, then sequence length (FLOPs counted as the kernel's own benchmark
    counts them: the causal half, the backward 2.5× the forward). Where given, it prices
    ``training.attention_kernel: flash`` shape by shape in place of ``attention_fraction``
    (:func:`llmsim.costs.flash_curve.flash_attention_flops`)."""
    flash_attention_fwd_tflops: dict[PositiveInt, dict[PositiveInt, PositiveFloat]] | None = None
    """Measured FlashAttention-2 forward-only throughput with a causal mask, TFLOP/s, by head
    dimension, then sequence length (the forward's FLOPs, the causal half). With
    ``flash_attention_bwd_tflops`` it prices the forward and recompute attention ops in place
    of ``flash_attention_tflops``, which stays the fallback beyond the shapes it timed
    (:func:`llmsim.costs.flash_curve.flash_pass_flops`); None: both passes at the combined
    curve."""
    flash_attention_bwd_tflops: dict[PositiveInt, dict[PositiveInt, PositiveFloat]] | None = None
    """The same for FlashAttention-2's backward alone (its FLOPs 2.5× the forward's)."""
    flash1_vs_flash2_tflops: dict[
        PositiveInt, dict[PositiveInt, tuple[PositiveFloat, PositiveFloat]]] | None = None
    """FlashAttention 1.x's and FlashAttention-2's forward + backward throughput with a
    causal mask, TFLOP/s, timed side by side in one benchmark on this accelerator, by head
    dimension, then sequence length: ``(flash1, flash2)``. Their ratio prices
    ``training.attention_kernel: flash1`` from FlashAttention-2's rate
    (:mod:`llmsim.costs.flash1`); None where not measured (``flash1`` is then refused)."""
    triton_fwd_vs_flash2_ms: dict[
        PositiveInt, dict[PositiveInt, tuple[PositiveFloat, PositiveFloat]]] | None = None
    """The forward times, ms, of Triton's fused-attention tutorial kernel and of
    FlashAttention-2 at one causal shape, timed side by side in one benchmark on this
    accelerator, by head dimension, then sequence length: ``(triton, flash2)``. Their ratio
    prices the forward of ``training.attention_kernel: triton_fwd`` from FlashAttention-2's
    rate (:mod:`llmsim.costs.attention_relative`); None where not measured (``triton_fwd`` is
    then refused)."""
    flash_attention_measured: list[MeasuredAttention] = Field(default_factory=list)
    """Flash attention kernels timed on the board by shape (heads, KV heads, sequence,
    head dimension, forward and backward TFLOP/s; see :data:`MeasuredAttention`). An attention
    op of one of these shapes under ``training.attention_kernel: flash`` runs at its measured
    rate instead of ``flash_attention_tflops`` or ``attention_fraction``, and a shape between
    them at the rate interpolated over heads and sequence
    (:mod:`llmsim.costs.attention_tables`); a sequence shorter than the table's shortest
    keeps those."""
    cudnn_attention_measured: list[MeasuredAttention] = Field(default_factory=list)
    """The same for cuDNN's fused attention (``training.attention_kernel: cudnn``), in
    place of ``cudnn_attention_fraction``."""
    flash_attention_blocks_measured: list[MeasuredAttentionBlock] = Field(default_factory=list)
    """Non-causal flash attention kernels timed on the board (see
    :data:`MeasuredAttentionBlock`): with context parallelism the ring's off-diagonal steps
    run at these rates (:mod:`llmsim.costs.attention_tables`)."""
    cudnn_attention_blocks_measured: list[MeasuredAttentionBlock] = Field(default_factory=list)
    """The same for cuDNN's fused attention."""
    kernel_launch_us: float = Field(default=0.0, ge=0)
    """Device time per kernel launched eagerly (launch and tail), microseconds."""
    host_dispatch_us: float = Field(default=0.0, ge=0)
    """Host time between two kernels an eager framework issues (its dispatch per op),
    microseconds: a pass's kernels wait for it where they are shorter
    (:mod:`llmsim.costs.host_issue`); 0 where not measured (no queue)."""
    host_module_dispatch_us: float = Field(default=0.0, ge=0)
    """Host time between two kernels when a model's layers issue them as Python modules
    under autograd (``training.host_path: modules``), microseconds: the module calls,
    autograd's graph and the dispatcher on top of ``host_dispatch_us``; 0 where not
    measured (that path then refuses the accelerator)."""
    host_ckpt_node_us: float = Field(default=0.0, ge=0)
    """Host time each backward matmul node (``MmBackward0``) of a layer recomputed by a
    reentrant ``torch.utils.checkpoint`` takes beyond the same node without checkpointing,
    microseconds (``training.host_path: hugging_face``); 0 where not measured."""
    host_fsdp_forward_us: float = Field(default=0.0, ge=0)
    """Host time of FSDP's hooks around one call of a ``FULL_SHARD`` unit's forward
    (``_pre_forward`` and ``_post_forward``), microseconds (``training.host_path:
    hugging_face``); 0 where not measured."""
    host_fsdp_backward_us: float = Field(default=0.0, ge=0)
    """Host time of FSDP's hooks around one unit's backward (``_pre_backward_hook`` with its
    prefetch and ``_post_backward_hook``), microseconds (``training.host_path:
    hugging_face``); 0 where not measured."""
    graph_kernel_us: float = Field(default=0.0, ge=0)
    """Fixed cost per kernel replayed from a captured CUDA graph
    (``training.cuda_graphs``), microseconds: the GPU's own launch and tail, without the
    host's; 0 where not measured."""
    tdp_w: PositiveFloat | None = None
    """Thermal design power, W."""
    power: DevicePower | None = None
    """Measured board power by kind of work; None: derived from ``tdp_w``
    (:meth:`DevicePower.from_tdp`)."""
    clocks: SustainedClocks | None = None
    """Measured SM clock by kind of work under the board's power limit; None: the
    catalog's rates at every power limit (nothing measured)."""
    host_pages: HostPageCosts | None = None
    """A CPU device's measured page round-trip rates (``training.allocator: glibc``);
    None: not measured, or a device whose framework caches its memory."""
    retention_wake_ms: PositiveFloat | None = None
    """Time an idle CPU core in its low-power retention state takes to run again,
    milliseconds (Fugaku's ``retention_state`` power knob, ``System.retention_state``;
    :mod:`llmsim.costs.retention`); None: the device has no such state."""
    sources: dict[str, str] = Field(default_factory=dict)
    """Where each number comes from: field name → citation."""
    notes: str = ""
    """Caveats, in prose."""

    @model_validator(mode="after")
    def _has_a_tensor_dtype(self) -> Accelerator:
        if not any(v for v in self.dense_tflops.model_dump().values()):
            raise ValueError(
                f"accelerator {self.name!r}: dense_tflops gives no data type; "
                "add at least one, e.g. bf16: 312"
            )
        return self

    @model_validator(mode="after")
    def _flash_curve_has_points(self) -> Accelerator:
        if self.flash_attention_tflops == {}:
            raise ValueError(
                f"accelerator {self.name!r}: flash_attention_tflops is empty; give TFLOP/s by "
                "head dimension and sequence length, e.g. {128: {2048: 155}}, or leave it out"
            )
        for field, example in (("flash_attention_tflops", "2048: 155"),
                               ("flash_attention_fwd_tflops", "2048: 155"),
                               ("flash_attention_bwd_tflops", "2048: 155"),
                               ("flash1_vs_flash2_tflops", "2048: [120, 155]"),
                               ("triton_fwd_vs_flash2_ms", "2048: [1.2, 1.05]")):
            for head_dim, by_seq in (getattr(self, field) or {}).items():
                if not by_seq:
                    raise ValueError(
                        f"accelerator {self.name!r}: {field}[{head_dim}] has no "
                        f"sequence lengths; give at least one, e.g. {example}"
                    )
        passes = (self.flash_attention_fwd_tflops, self.flash_attention_bwd_tflops)
        if any(p is not None for p in passes) and (
                not all(passes) or not self.flash_attention_tflops):
            raise ValueError(
                f"accelerator {self.name!r}: flash_attention_fwd_tflops and "
                "flash_attention_bwd_tflops go together and need flash_attention_tflops "
                "(the combined curve beyond the shapes they timed); give all three, or "
                "leave both per-pass curves out"
            )
        return self

    def peak_flops(self, dtype: Dtype) -> float:
        """Dense peak for ``dtype`` in FLOP/s, or raise if the device has no such unit."""
        tflops = getattr(self.dense_tflops, dtype)
        if tflops is None:
            have = [k for k, v in self.dense_tflops.model_dump().items() if v]
            raise ValueError(
                f"{self.name} has no {dtype} units; use one of its data types: {', '.join(have)}"
            )
        return tflops * 1e12

    def supports(self, dtype: Dtype) -> bool:
        """Whether the device has units for ``dtype``."""
        return getattr(self.dense_tflops, dtype) is not None

    @property
    def hbm_bytes(self) -> float:
        """Memory capacity in bytes."""
        return self.hbm_gb * 1e9

    @property
    def hbm_bytes_per_s(self) -> float:
        """Peak memory bandwidth in bytes/s."""
        return self.hbm_tbps * 1e12

    @property
    def sustained_memory_bytes_per_s(self) -> float:
        """Bandwidth memory-bound kernels reach, bytes/s (peak × ``memory_bound_fraction``)."""
        return self.hbm_bytes_per_s * self.memory_bound_fraction

    def memory_bytes_per_s(self, kind: MemoryKind) -> float:
        """Bandwidth a memory-bound kernel of ``kind`` reaches, bytes/s: peak × its
        ``memory_fraction_by_kind``, else × ``memory_bound_fraction``."""
        return self.hbm_bytes_per_s * self.memory_fraction_by_kind.get(
            kind, self.memory_bound_fraction)
