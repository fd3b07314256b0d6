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
  (:data:`llmsim.workload.hf_eager.CHAINS` ``rope`` and ``rope_bwd``: 12 and 18 kernels);
* ``complex``: the complex multiply of Meta's LLaMA reference and torchtitan
  (``apply_rotary_emb``: ``torch.view_as_complex(x.float().reshape(..., -1, 2))``, ``* freqs_cis``,
  ``torch.view_as_real(...).flatten(3)``, ``.type_as(x)``; ``torchtitan/models/llama/model.py``,
  eminorhan/frontier-torchtitan at d4ffe60, and ``ComplexRoPE.apply_rotary_emb`` in
  ``torchtitan/models/common/rope.py`` of 2026): on q and k each, the FP32 upcast (``e`` read,
  4 written an element), the complex product (4 read, 4 written: a complex64 holds a pair)
  and the cast back (4 read, ``e`` written), three kernels and ``2e + 16`` bytes an element;
  autograd's backward is the same three in reverse (the cast of the gradient to FP32, its
  product with the conjugate table, the cast back; the views cost nothing). The same under
  ``torch.compile``: Inductor does not generate code for complex operators ("Torchinductor
  does not support code generation for complex operators", quoted by the AuroraGPT fork's
  ``agpt_2b_real``, saforem2/torchtitan at 0065c03, ``config_registry.py``) and runs the
  product eagerly, so the upcast before it and the cast after it stay separate kernels
  (assumed: Inductor could merge the q and k casts into fewer launches; the bytes do not
  change).

The forward (and a recompute that runs the QKV projection again) applies it after the QKV
projection; the backward applies its gradient before the QKV projection's input gradient.
"""

from __future__ import annotations

from collections.abc import Sequence

from llmsim.ops import ComputeOp
from llmsim.specs.training import RopeKernel
from llmsim.workload.hf_eager import FP32, Chain, chain_op, eager_op
from llmsim.workload.step import Op

FUSED_KERNELS = 2
"""Kernels of the fused RoPE in each pass: one on q, one on k."""

COMPLEX = Chain(6, lambda e: (e + FP32) + 2 * FP32 + (FP32 + e))
"""The complex-multiply RoPE on q and k in one pass, forward or backward (``complex``):
three kernels on each, the upcast ``e + 4``, the complex product 8, the cast back ``4 + e``
bytes an element (the table of one sequence is a head's share and not counted)."""


def rope_op(kind: RopeKernel, phase: str, elements: float, e: int) -> ComputeOp:
    """The rotary embedding of one pass over ``elements`` values of q and k."""
    name = "rope_bwd" if phase == "B" else "rope"
    if kind == "unfused":
        return eager_op(name, phase, name, elements, e)
    if kind == "complex":
        return chain_op(name, phase, COMPLEX, elements, e)
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
