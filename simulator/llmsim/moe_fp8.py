"""FP8 around a MoE layer's grouped expert GEMMs, as Transformer Engine and Megatron-Core
run them (docs/moe.md, "FP8 around the grouped GEMMs"): the kernels that quantise a grouped
GEMM's operand expert by expert, and whether the routed rows are copied into FP8-aligned
blocks first. Read in Transformer Engine release_v2.16 and Megatron-LM 4415119414, the
versions of Megatron-Bridge 26.04.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

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
