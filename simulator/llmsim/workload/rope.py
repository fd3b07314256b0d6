"""The rotary position embedding (RoPE) on q and k, in every pass of a model that has one
(``model.position_embedding: rope``), as its framework runs it (``training.rope``):

* ``fused``: one kernel each on q and on k, forward and backward: Transformer Engine's
  fused RoPE (``FusedRoPEFunc``, ``transformer_engine/pytorch/attention.py``), which
  Megatron-LM calls under ``--apply-rope-fusion`` (``megatron/core/models/common/embeddings/
  rotary_pos_embedding.py``, ``apply_rotary_pos_emb(..., fused=True)``) and NeMo's LLaMA
  recipes set. Each reads its tensor and writes it (2 × ``e`` bytes an element; the cos/sin
  table of one sequence is a head's share and not counted) — memory-bound;
* ``unfused``: PyTorch's eager operators on q and k each (``t * cos + rotate_half(t) * sin``
  and the concatenation), Megatron-LM's ``_apply_rotary_pos_emb_bshd`` without the fusion
  flag and Hugging Face LLaMA's ``apply_rotary_pos_emb``, priced as Hugging Face's chain
  (:data:`llmsim.workload.hf_eager.CHAINS` ``rope`` and ``rope_bwd``: 12 and 18 kernels).

The forward (and a recompute that runs the QKV projection again) applies it after the QKV
projection; the backward applies its gradient before the QKV projection's input gradient.
"""

from __future__ import annotations

from collections.abc import Sequence

from llmsim.ops import ComputeOp
from llmsim.specs.training import RopeKernel
from llmsim.workload.hf_eager import eager_op
from llmsim.workload.step import Op

FUSED_KERNELS = 2
"""Kernels of the fused RoPE in each pass: one on q, one on k."""


def rope_op(kind: RopeKernel, phase: str, elements: float, e: int) -> ComputeOp:
    """The rotary embedding of one pass over ``elements`` values of q and k."""
    name = "rope_bwd" if phase == "B" else "rope"
    if kind == "unfused":
        return eager_op(name, phase, name, elements, e)
    return ComputeOp(name, "memory", phase, 0.0, float(elements * 2 * e),
                     splits=FUSED_KERNELS, output_bytes=float(elements * e))


def with_rope(ops: Sequence[Op], kind: RopeKernel, elements: float, e: int) -> list[Op]:
    """One pass's ops with the rotary embedding after the QKV projection (forward,
    recompute) or before its input gradient (backward)."""
    out: list[Op] = []
    for op in ops:
        if isinstance(op, ComputeOp) and op.name == "qkv_dx":
            out.append(rope_op(kind, op.phase, elements, e))
        out.append(op)
        if isinstance(op, ComputeOp) and op.name == "qkv":
            out.append(rope_op(kind, op.phase, elements, e))
    return out


def apply_rope(passes: tuple[list[Op], list[Op], list[Op], list[Op]], kind: RopeKernel,
               elements: float, e: int) -> tuple[list[Op], list[Op], list[Op], list[Op]]:
    """A block's (F, R, B, W) ops with the rotary embedding of ``kind``
    (:func:`with_rope` on F, R and B)."""
    f, r, b, w = passes
    return (with_rope(f, kind, elements, e), with_rope(r, kind, elements, e),
            with_rope(b, kind, elements, e), list(w))
