"""FP8 around a MoE layer's grouped expert GEMMs, as Transformer Engine and Megatron-Core
run them (docs/moe.md, "FP8 around the grouped GEMMs"): the kernels that quantise a grouped
GEMM's operand expert by expert, and whether the routed rows are copied into FP8-aligned
blocks first. Read in Transformer Engine release_v2.16 and Megatron-LM 4415119414, the
versions of Megatron-Bridge 26.04. And, with ``training.fp8_activation_cache``, DeepSeek-V3's
own FP8 path (the DeepEP row DSV3-01): its tokens quantised once, tile-wise, before the
dispatch, and the stored tiles re-quantised transposed for the weight gradients.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from llmsim.experts import FP8_CACHED_BYTES
from llmsim.ops import ComputeOp

if TYPE_CHECKING:
    from llmsim.specs import Parallelism
    from llmsim.specs.model import MoE


def split_quantize_kernels(local: int, scaling: Literal["delayed", "current"]) -> tuple[int, int]:
    """Kernels Transformer Engine launches to quantise a grouped GEMM's operand split into
    ``local`` experts' row blocks, as (amax kernels, cast kernels): ``tex.split_quantize``
    (``transformer_engine/pytorch/csrc/extensions/cast.cpp``, ``multi_tensor_quantize_impl``,
    release_v2.16, the Transformer Engine of Megatron-Bridge 26.04) runs one fused
    ``nvte_multi_cast_transpose`` over every block for delayed-scaling quantizers only,
    (0, 1); for current scaling it calls each block's
    ``Float8CurrentScalingQuantizer::quantize_impl`` (``csrc/quantizer.cpp``): a zero-fill of
    the amax and the amax reduction (``launch_amax_kernel``,
    ``common/recipe/current_scaling.cu``), then ``nvte_compute_scale_from_amax`` and the
    cast-transpose ``nvte_quantize_v2`` — ``(2·local, 2·local)``, one C++ call for all."""
    if scaling == "current":
        return 2 * local, 2 * local
    return 0, 1


def split_quantize_ops(name: str, phase: str, elements: float, local: int,
                       scaling: Literal["delayed", "current"]) -> list[ComputeOp]:
    """The ops that quantise an operand of ``elements`` split into ``local`` row blocks
    (:func:`split_quantize_kernels`): the cast-transpose reads 2 and writes 1 + 1 bytes per
    element (``fp8_cast_<name>``); under current scaling the amax kernels read the operand
    once more first, 2 bytes per element (``fp8_amax_<name>``); each one host call."""
    amax, cast = split_quantize_kernels(local, scaling)
    ops = [ComputeOp(f"fp8_cast_{name}", "memory", phase, 0.0, 4.0 * elements,
                     splits=cast, host_calls=1)]
    if amax:
        ops.insert(0, ComputeOp(f"fp8_amax_{name}", "memory", phase, 0.0, 2.0 * elements,
                                splits=amax, host_calls=1))
    return ops


FP8_ALIGN_ROWS = 16
"""Rows an expert's block is padded to a multiple of before an FP8 grouped GEMM:
``get_align_size_for_quantization`` (Transformer Engine ``pytorch/quantization.py``,
release_v2.16) gives 16 for per-tensor FP8 (32 for MXFP8, 128 for NVFP4)."""


def pads_expert_rows(moe: MoE, par: Parallelism, fp8: bool, rows_per_expert: float) -> bool:
    """Whether Megatron-Core's ``TEGroupedMLP`` copies the routed rows into FP8-aligned
    blocks before its grouped GEMMs and back after (``Fp8Padding`` / ``Fp8Unpadding``,
    Megatron-LM ``moe/experts.py`` at 4415119414): under FP8, unless the dispatcher already
    padded them — HybridEP does (``skip_routed_expert_padding``, ``moe_utils.py``), as does
    the router with ``moe_router_padding_for_quantization``, which no validation recipe
    sets — and unless every block is already a multiple of :data:`FP8_ALIGN_ROWS`
    (``Fp8Padding.forward`` returns its input then). Dropless routing gives random block
    sizes (llmsim takes them unaligned); a capacity gives every expert ``rows_per_expert``.
    llmsim prices it for the ``alltoall`` dispatcher only: the one DeepEP row (DSV3-01)
    runs DeepSeek's own framework, not Megatron-Core's expert module."""
    if not fp8 or moe.experts == 1 or par.moe_dispatcher != "alltoall":
        return False
    return moe.capacity_factor is None or rows_per_expert % FP8_ALIGN_ROWS != 0


def tile_cast_bytes_per_element(element_bytes: float) -> float:
    """Bytes one element of DeepSeek-V3's tile-wise FP8 cast moves: the 16-bit (``element_bytes``)
    read and the FP8 write with its FP32 scale per 1×128 tile (``1 + 4/128``). The amax of
    each 1×128 tile is taken online inside the same kernel (DeepSeek-V3 report,
    arXiv:2412.19437, §3.3.2 "Fine-Grained Quantization": "we calculate the maximum absolute
    value online for each 1x128 activation tile ... and then quantize the activation ...
    online"), so no separate amax pass; no transposed copy is written (§3.5.2, "Support for
    Transposed GEMM Operations": the 1×128 tiles are stored and the backward re-quantises
    them into 128×1 tiles, :func:`tile_requant_bytes_per_element`)."""
    return element_bytes + FP8_CACHED_BYTES


def tile_requant_bytes_per_element() -> float:
    """Bytes one element of DeepSeek-V3's backward re-quantisation moves: the stored 1×128
    FP8 tiles read, "dequantized, transposed, re-quantized into 128x1 tiles, and stored in
    HBM" (DeepSeek-V3 report §3.5.2), ``2·(1 + 4/128)``; the weight gradient's GEMM needs its
    operands tiled along the tokens it reduces over."""
    return 2.0 * FP8_CACHED_BYTES


def token_cast_op(name: str, phase: str, elements: float, element_bytes: float) -> ComputeOp:
    """With ``training.fp8_activation_cache``, DeepSeek-V3's FP8 cast of a rank's
    ``elements = T_s × h`` token values before the all-to-all that carries them in FP8:
    forward the up-projections' input before the dispatch ("we quantize the activation
    before MoE up-projections into FP8 and then apply dispatch components"), backward the
    down-projections' output gradient before the combine's gradient all-to-all ("a similar
    strategy is applied to the activation gradient before MoE down-projections"; DeepSeek-V3
    report §3.3.3; DeepEP's ``Buffer.dispatch`` takes the tokens so cast, an ``x`` of the
    ``float8_e4m3fn`` tensor and its ``hidden // 128`` FP32 scales a token,
    ``deep_ep/buffer.py``). Once a token, not once each of its ``top_k`` routed rows; one kernel,
    :func:`tile_cast_bytes_per_element` bytes a value (op ``fp8_cast_<name>``)."""
    return ComputeOp(f"fp8_cast_{name}", "memory", phase, 0.0,
                     tile_cast_bytes_per_element(element_bytes) * elements, host_calls=1)


def requant_op(name: str, elements: float) -> ComputeOp:
    """The weight gradient's re-quantisation of a :func:`token_cast_op` operand on the
    expert side: the received ``elements = R × h`` FP8 values read, transposed and written
    as 128×1 tiles (:func:`tile_requant_bytes_per_element`), one kernel in the W pass (op
    ``fp8_requant_<name>``)."""
    return ComputeOp(f"fp8_requant_{name}", "memory", "W", 0.0,
                     tile_requant_bytes_per_element() * elements, host_calls=1)
