"""Hugging Face LLaMA's norms, rotary embedding and gated MLP as PyTorch runs them eagerly
(``training.pointwise_ops: hf_eager``).

``LlamaForCausalLM`` of transformers 4.31–4.35 (mid- to late 2023; the version DistFlashAttn's
checkpointing patch imports, ``apply_rotary_pos_emb(q, k, cos, sin, position_ids)``, RulinShao/
LightSeq ``lightseq/lightseq_ckpt_monkey_patch.py`` at 135d8d2) writes these as Python over
tensors, one kernel per operator, and autograd runs each operator's backward:

* ``LlamaRMSNorm.forward``: ``x.to(float32)``, ``.pow(2)``, ``.mean(-1, keepdim=True)``,
  ``+ eps``, ``torch.rsqrt``, ``x * rsqrt``, ``.to(input_dtype)``, ``weight * x``;
* ``apply_rotary_pos_emb`` on q and k each: ``q * cos``, ``rotate_half(q)`` (``-x2`` on the
  second half and ``torch.cat((-x2, x1))``), ``* sin`` and the sum (and two gathers of the
  small cos/sin tables by ``position_ids``);
* ``LlamaMLP.forward``: ``down_proj(act_fn(gate_proj(x)) * up_proj(x))``: SiLU and the
  product as two kernels.

Each chain is one op here: the bytes its kernels move per element (16-bit tensors of
``e`` bytes, FP32 intermediates of 4: :data:`CHAINS`), one launch per kernel (``splits``),
at the accelerator's streaming bandwidth (its element-wise rate, not its measured norm
kernels). They replace the fused ops llmsim otherwise prices (``ln1``, ``ln2``, ``act`` and
their backward: one kernel each) in every pass, and the rotary embedding runs as its eager
chain (:mod:`llmsim.workload.rope`, whatever ``training.rope`` says); the output projection GEMMs
and the residual adds are unchanged. The final norm before the LM head (once a step) keeps
its price.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from llmsim.ops import ComputeOp
from llmsim.workload.step import Op

FP32 = 4
"""Bytes of the FP32 intermediates of ``LlamaRMSNorm`` (it upcasts its input)."""


@dataclass(frozen=True)
class Chain:
    """One eager chain of PyTorch kernels over a tensor."""

    kernels: int
    """Kernels it launches."""
    bytes_per_element: Callable[[int], float]
    """HBM bytes its kernels read and write per element of the tensor, for 16-bit tensors
    of ``e`` bytes."""


CHAINS: dict[str, Chain] = {
    # to(fp32) e+4, pow 8, mean 4, (eps, rsqrt: one value a row), x*rsqrt 8, to(e) 4+e,
    # weight*x 2e.
    "rmsnorm": Chain(8, lambda e: (e + FP32) + 8 + 4 + 8 + (FP32 + e) + 2 * e),
    # weight*x: grad·w 2e, grad_w = sum(grad·x) 3e + e; to(e): e+4; x*rsqrt: grad·rsqrt 8,
    # sum(grad·x) 12 + 4; mean: expand/N 4; pow: 2·x·grad 12; the two gradients of the FP32
    # copy summed 12; to(fp32): 4+e.
    "rmsnorm_bwd": Chain(13, lambda e: 6 * e + (e + FP32) + 24 + 4 + 12 + 12 + (FP32 + e)),
    # q*cos 2e, -x2 on half e, cat 2e, *sin 2e, sum 3e (per element of q or k; the cos/sin
    # gathers are a head's share and not counted in the bytes, only their launches).
    "rope": Chain(12, lambda e: 10 * e),
    # grad·cos 2e, grad·sin 2e, -grad on half e, the two slices' backward (zeros of the
    # whole tensor, then the half copied in) 4e, the three gradients of q summed 6e.
    "rope_bwd": Chain(18, lambda e: 15 * e),
    # silu(gate) 2e, silu·up 3e (per element of the intermediate, T·ffn).
    "swiglu": Chain(2, lambda e: 5 * e),
    # grad·up 3e, grad·silu 3e, silu_backward 3e.
    "swiglu_bwd": Chain(3, lambda e: 9 * e),
}
"""The chains, each with its kernel count and bytes per element."""

REPLACED = {"ln1": "rmsnorm", "ln2": "rmsnorm", "act": "swiglu",
            "ln1_bwd": "rmsnorm_bwd", "ln2_bwd": "rmsnorm_bwd", "act_bwd": "swiglu_bwd"}
"""llmsim's fused ops and the eager chain that replaces each (``hf_eager``)."""

EAGER_SWIGLU = {"act": "swiglu", "act_bwd": "swiglu_bwd"}
"""``pointwise_ops: eager_swiglu``: only the gated activation runs eagerly, as the same two
kernels (``F.silu(w1(x)) * w3(x)``: torchtitan's Llama ``FeedForward`` without
``torch.compile``, ``torchtitan/models/llama/model.py``, eminorhan/frontier-torchtitan at
d4ffe60); the norms keep their fused price (``nn.LayerNorm``'s native kernel there)."""

REPLACING = {"hf_eager": REPLACED, "eager_swiglu": EAGER_SWIGLU}
"""Each eager ``training.pointwise_ops`` value and the fused ops it replaces."""


def chain_op(name: str, phase: str, c: Chain, elements: float, e: int) -> ComputeOp:
    """The eager chain ``c`` over ``elements`` values as a memory-bound op of its kernels."""
    return ComputeOp(name, "memory", phase, 0.0, float(elements * c.bytes_per_element(e)),
                     splits=c.kernels, output_bytes=float(elements * e))


def eager_op(name: str, phase: str, chain: str, elements: float, e: int) -> ComputeOp:
    """One of Hugging Face's eager chains (:data:`CHAINS`) over ``elements`` values."""
    return chain_op(name, phase, CHAINS[chain], elements, e)


def _elements(op: ComputeOp, e: int, passes: int) -> float:
    """The elements a fused op of llmsim's touched: its bytes over its passes of ``e``."""
    return op.bytes / (passes * e)


FUSED_PASSES = {"ln1": 2, "ln2": 2, "act": 3, "ln1_bwd": 4, "ln2_bwd": 4, "act_bwd": 4}
"""Passes llmsim's fused ops make over their tensor (:class:`llmsim.workload.LayerBuilder`,
SwiGLU's gated activation and its backward)."""


def hf_eager_pass(ops: Sequence[Op], e: int, replaced: Mapping[str, str] = REPLACED
                  ) -> list[Op]:
    """One pass's ops with the fused ops of ``replaced`` (by default the norms and the
    activation) replaced by Hugging Face's eager chains (the rotary embedding's chain is
    added by :mod:`llmsim.workload.rope`, as ``training.rope: unfused``)."""
    out: list[Op] = []
    for op in ops:
        chain = replaced.get(op.name) if isinstance(op, ComputeOp) else None
        if chain is None:
            out.append(op)
        else:
            elements = _elements(op, e, FUSED_PASSES[op.name])
            out.append(eager_op(op.name, op.phase, chain, elements, e))
    return out


def apply_hf_eager(passes: tuple[list[Op], list[Op], list[Op], list[Op]], e: int,
                   replaced: Mapping[str, str] = REPLACED
                   ) -> tuple[list[Op], list[Op], list[Op], list[Op]]:
    """A block's (F, R, B, W) ops under an eager ``training.pointwise_ops``
    (:func:`hf_eager_pass` on each; ``replaced`` from :data:`REPLACING`)."""
    f, r, b, w = passes
    return (hf_eager_pass(f, e, replaced), hf_eager_pass(r, e, replaced),
            hf_eager_pass(b, e, replaced), list(w))

