"""Transformer Engine's FP8 bookkeeping around the GEMMs: the weights' FP8 copies and the
delayed-scaling amax history, and the casts of each linear layer's operands
(:func:`operand_casts`, which :mod:`llmsim.workload.layer` places).

Sizes come from the tensors: a weight's cast reads its 16-bit copy and writes the FP8
copy and its transpose; the amax history holds ``training.fp8_amax_history_len`` FP32
values per FP8 tensor.
"""

from __future__ import annotations

from collections.abc import Iterable

from llmsim.moe_fp8 import split_quantize_kernels, split_quantize_ops
from llmsim.ops import CommOp, ComputeOp
from llmsim.specs import Training

ChunkEnds = tuple[list[CommOp | ComputeOp], list[CommOp | ComputeOp]]
"""A chunk's forward and backward ops."""

FP8_TENSORS_FORWARD = 3
"""FP8 tensors per linear layer in the forward's scaling state: input, weight, output
(Transformer Engine's ``fp8_meta["scaling_fwd"]``, ``num_gemms * 3``)."""
FP8_TENSORS_BACKWARD = 2
"""FP8 tensors per linear layer in the backward's: output gradient, input gradient
(``fp8_meta["scaling_bwd"]``, ``num_gemms * 2``)."""
FP8_LINEARS_PER_LAYER = 4
"""FP8 linear layers (GEMMs) per transformer layer: QKV, attention output, MLP up, down."""
FP8_MODULES_PER_LAYER = 3
"""Transformer Engine modules per transformer layer, each with its own scaling state:
``LayerNormLinear`` (QKV), ``Linear`` (attention output), ``LayerNormMLP`` (both MLP GEMMs;
TE's ``TransformerLayer``)."""
AMAX_BYTES = 4
"""An amax, a scale and an inverse scale are FP32 values."""
TP_AMAX_REDUCTIONS = (2, 2)
"""One-value (:data:`AMAX_BYTES`) TP all-reduces (MAX) of an amax per transformer layer and
micro-batch, (forward, backward), under current scaling with sequence parallelism and
``tp > 1``: Transformer Engine release_v2.16's ``_customize_quantizers_float8_current_
scaling`` (``module/linear.py``, ``layernorm_linear.py``, ``layernorm_mlp.py``) sets
``with_amax_reduction`` over ``tp_group`` on a column-parallel layer's input quantizer
(QKV, MLP up: forward) and a row-parallel layer's output-gradient quantizer (attention
output, MLP down: backward), the tensors it quantises sequence-split before their
all-gather. ``Float8CurrentScalingQuantizer::quantize_impl`` (``csrc/quantizer.cpp``) runs
the amax kernel, then ``allreduce(...)->wait()``, then the scale and the cast: on the
critical path. ``GroupedLinear`` (MoE experts) sets none."""


def weight_cast_bytes_per_element(training: Training) -> int:
    """HBM bytes to cast one weight element to FP8 for the forward and the input-gradient
    GEMMs: Transformer Engine's ``fp8_cast_transpose_fused`` reads the 16-bit weight (2)
    and writes the FP8 copy (1) and its transpose (1); with current scaling
    (``training.fp8_scaling: current``) an amax kernel reads the weight first (2 more)."""
    return 4 + (2 if training.fp8_scaling == "current" else 0)


_NOT_FP8_LINEARS = ("attn_scores", "attn_context", "lm_head")
"""GEMMs of a forward that are no FP8 linear layer: the unfused attention's products (no
weights; batched, unless one head of one sequence) and the framework's own LM head."""


def weight_elements(forward_ops: Iterable[object]) -> int:
    """Weight elements of the FP8 linear layers among a pass's ops: every GEMM with one
    (M, N, K) problem (the weight is K × N) but the unfused attention's products (no
    weights) and the LM head, which the framework runs in 16 bits outside Transformer
    Engine."""
    total = 0
    for op in forward_ops:
        if (isinstance(op, ComputeOp) and op.kind == "gemm" and op.mnk is not None
                and op.batch == 1 and op.name not in _NOT_FP8_LINEARS):
            _, n, k = op.mnk
            total += n * k
    return total


def step_weight_casts(training: Training, elements: int, matrices: int) -> ComputeOp | None:
    """The FP8 copies of a stage's weights made once per step
    (``training.fp8_weight_cast: per_step``), or None.

    Megatron-LM and NeMo pass ``is_first_microbatch`` to Transformer Engine's layers
    (True on the first micro-batch of each step); TE then casts each weight once and keeps
    the FP8 copy and its transpose for the step's other micro-batches (``weight_fp8`` /
    ``weight_t_fp8``; NeMo's ``ParallelTransformer``: "Cache FP8 weight and transpose at
    the first micro-batch in each global-batch"). Per weight matrix, the kernels of one
    quantised tensor (:func:`llmsim.moe_fp8.split_quantize_kernels` of one block): the
    cast-transpose under delayed scaling; under current scaling also the amax's zero-fill
    and reduction and the scale (``Float8CurrentScalingQuantizer::quantize_impl``).
    """
    if training.precision != "fp8" or training.fp8_weight_cast != "per_step" or not elements:
        return None
    per_matrix = sum(split_quantize_kernels(1, training.fp8_scaling))
    return ComputeOp("fp8_weight_cast", "memory", "O", 0.0,
                     float(elements * weight_cast_bytes_per_element(training)),
                     splits=per_matrix * max(1, matrices))


def amax_history_updates(training: Training, linears: int
                         ) -> tuple[list[ComputeOp], list[ComputeOp]]:
    """The amax-history and scale updates of a chunk's forward and backward under delayed
    scaling (``training.fp8_amax_update``), or none.

    ``per_region`` (Transformer Engine 1.x, ``FP8GlobalStateManager.
    reduce_and_update_fp8_tensors`` in ``fp8.py``): at the end of each ``fp8_autocast``
    region's pass, ``torch.cat`` gathers the latest amax of every FP8 tensor of the region
    (reads and writes one FP32 each), the all-reduce follows where asked
    (``training.fp8_amax_reduction``, priced apart), then one fused kernel
    (``fused_amax_and_scale_update_after_reduction``) rolls each tensor's history of
    ``fp8_amax_history_len`` FP32 values (reads and writes it), takes its max and writes
    the scale and inverse scale: two kernels per pass.

    ``per_module`` (Transformer Engine 0.8, ``module.py``: ``prepare_forward`` and
    ``_prepare_backward``): each TE module (:data:`FP8_MODULES_PER_LAYER` per layer)
    updates its own state before its forward and its backward: with the amax reduction
    ``copy_amax_from_global_buffer`` copies the reduced amax into its history (one
    kernel), and the TorchScript ``fused_amax_and_scale_update`` (nvFuser enabled by TE's
    ``set_jit_fusion_options``) takes the amax (``clone`` or ``max`` over the history),
    rolls the history when it holds more than one value (``torch.roll``), zeroes its first
    row (``fill_``, in place: not fused) and computes the scale and inverse scale: counted
    as one fused kernel for the amax and the scales, the roll and the fill: 2–4 kernels per
    module and pass, the same bytes as above. llmsim runs a chunk's updates together at
    the end of its pass (the same time on the same stream).
    """
    if training.precision != "fp8" or training.fp8_scaling != "delayed" or not linears:
        return [], []
    history = training.fp8_amax_history_len

    def update(name: str, phase: str, tensors: int) -> ComputeOp:
        per_tensor = 2 + 2 * history + 2 * 2  # cat (or copy-in); roll; scale, inverse scale
        if training.fp8_amax_update == "per_region":
            kernels = 2
        else:
            modules = linears * FP8_MODULES_PER_LAYER // FP8_LINEARS_PER_LAYER
            per_module = (1 + (history > 1) + 1
                          + (1 if training.fp8_amax_reduction else 0))
            kernels = modules * per_module
        return ComputeOp(name, "memory", phase, 0.0, float(AMAX_BYTES * per_tensor * tensors),
                         splits=kernels)

    return ([update("fp8_scale_update", "F", FP8_TENSORS_FORWARD * linears)],
            [update("fp8_scale_update_bwd", "B", FP8_TENSORS_BACKWARD * linears)])


def operand_casts(gemm: ComputeOp, operand: str, trn: Training) -> list[ComputeOp]:
    """FP8 cast-transpose of a linear layer's input (forward) or output gradient.

    Transformer Engine quantises each GEMM operand it does not already hold in FP8: it
    reads the 16-bit tensor and writes the FP8 copy and its transpose (the transpose feeds
    the weight-gradient GEMM): 2 + 1 + 1 bytes per element. With ``training.fp8_scaling:
    current`` an amax kernel reads the tensor first (2 bytes per element); with delayed
    scaling the cast records the amax as it goes. The kernels per tensor are
    :func:`llmsim.moe_fp8.split_quantize_kernels` of one block: under current scaling
    ``Float8CurrentScalingQuantizer::quantize_impl`` zeroes the amax, reduces it, computes
    the scale and casts (4 kernels, one C++ call); delayed scaling's cast-transpose is one.
    With ``training.fp8_weight_cast: per_microbatch`` the forward also casts the weight
    (:func:`weight_cast_bytes_per_element`, as many kernels); per step, the casts are the
    stage's (:func:`step_weight_casts`). None for a GEMM without a shape.
    """
    if gemm.mnk is None:
        return []
    m, n, k = gemm.mnk
    elements = m * (k if operand == "input" else n)
    casts = split_quantize_ops(gemm.name, gemm.phase, elements, 1, trn.fp8_scaling)
    if operand == "input" and trn.fp8_weight_cast == "per_microbatch":
        # The weight too, before every forward (no is_first_microbatch).
        casts.insert(0, ComputeOp(
            f"fp8_weight_cast_{gemm.name}", "memory", gemm.phase, 0.0,
            float(n * k * weight_cast_bytes_per_element(trn)),
            splits=sum(split_quantize_kernels(1, trn.fp8_scaling)), host_calls=1))
    return casts


def amax_reductions(training: Training, layers: int) -> ChunkEnds:
    """The FP8 amax all-reduces of a chunk's forward and backward
    (``training.fp8_amax_reduction``), or none.

    Transformer Engine all-reduces (MAX) one float per FP8 tensor over the stage's ranks:
    each linear layer's input, weight and output in the forward, its output and input
    gradients in the backward (``fp8_meta`` of TE 0.x: three and two tensors per GEMM).
    The chunk's layers run inside one ``fp8_autocast`` region (NeMo's and Megatron's
    transformer block), so each pass ends with one reduction.
    """
    if not training.fp8_amax_reduction or layers == 0:
        return [], []
    linears = FP8_LINEARS_PER_LAYER * layers
    forward_bytes = float(AMAX_BYTES * FP8_TENSORS_FORWARD * linears)
    backward_bytes = float(AMAX_BYTES * FP8_TENSORS_BACKWARD * linears)
    return ([CommOp("fp8_amax_reduce", "all_reduce", "stage", "F", forward_bytes)],
            [CommOp("fp8_amax_reduce_bwd", "all_reduce", "stage", "B", backward_bytes)])


def amax_bookkeeping(training: Training, layers: int) -> ChunkEnds:
    """The end of a chunk's forward and backward under FP8: the amax all-reduce where the
    run asks for it, then the delayed-scaling history and scale update
    (:func:`amax_history_updates`)."""
    reduce_f, reduce_b = amax_reductions(training, layers)
    update_f, update_b = amax_history_updates(training, FP8_LINEARS_PER_LAYER * layers)
    return [*reduce_f, *update_f], [*reduce_b, *update_b]
