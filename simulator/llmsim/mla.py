"""Multi-head latent attention (DeepSeek-V2 §2.1): the ops that replace a block's fused
QKV GEMM, and the attention core's shapes.

Megatron-Core's ``MLASelfAttention`` (and DeepSeek's ``modeling_deepseek.py``) computes,
per token, ``c_q = W_DQ·x`` (``q_lora_rank``), ``q = W_UQ·norm(c_q)`` (``heads ×
(qk_nope + qk_rope)``), ``[c_kv, k_rope] = W_DKV·x`` (``kv_lora_rank + qk_rope``) and
``[k_nope, v] = W_UKV·norm(c_kv)`` (``heads × (qk_nope + v_head)``). The down
projections are replicated on every TP rank (each computes them for all ``T`` tokens),
the up projections split by heads over ``tp``. The attention core multiplies
``heads·(qk_nope + qk_rope)``-wide queries and keys and ``heads·v_head``-wide values:
``2·b·s²·heads·(d_qk + d_v)`` FLOPs forward, which is the usual ``4·b·s²·heads·d`` with
``d = (d_qk + d_v)/2``; the output projection is the usual ``heads·v_head × h``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from llmsim.ops import ComputeOp
from llmsim.specs import Model, Parallelism, Training

if TYPE_CHECKING:
    from llmsim.workload import LayerBuilder, Op


def mla_head_dims(builder: LayerBuilder) -> tuple[int, int]:
    """(query/key width, value width) of one head."""
    a = builder.m.mla
    assert a is not None
    return a.qk_nope_head_dim + a.qk_rope_head_dim, a.v_head_dim


def _projections(builder: LayerBuilder) -> list[ComputeOp]:
    """The four MLA projection GEMMs of one micro-batch, forward, in order, and the two
    latents' RMSNorms (read and write each latent)."""
    b, a = builder, builder.m.mla
    assert a is not None
    heads = b.m.heads // b.t
    d_qk, d_v = mla_head_dims(b)
    T, h = b.T, b.m.hidden
    return [
        b._gemm("mla_q_down", "F", T, a.q_lora_rank, h),
        b._mem("mla_q_norm", "F", T * a.q_lora_rank, 2, kind="rmsnorm"),
        b._gemm("mla_q_up", "F", T, heads * d_qk, a.q_lora_rank),
        b._gemm("mla_kv_down", "F", T, a.kv_lora_rank + a.qk_rope_head_dim, h),
        b._mem("mla_kv_norm", "F", T * a.kv_lora_rank, 2, kind="rmsnorm"),
        b._gemm("mla_kv_up", "F", T, heads * (a.qk_nope_head_dim + d_v), a.kv_lora_rank),
    ]


def apply_mla(lists: tuple[list[Op], ...], builder: LayerBuilder) -> tuple[list[Op], ...]:
    """A dense block's op lists (forward, recompute, input-gradient, weight-gradient) with
    the fused QKV GEMM (``qkv``, ``qkv_dx``, ``qkv_dw``) replaced by the MLA projections
    and the attention core and output projection given MLA's head widths."""
    b = builder
    fwd = _projections(b)
    gemms = [op for op in fwd if op.kind == "gemm"]
    grads = [b._gemm_grads(op) for op in gemms]
    norms_bwd = [replace(op, name=f"{op.name}_bwd", phase="B", bytes=2 * op.bytes,
                         memory_kind="norm_backward")
                 for op in fwd if op.kind == "memory"]
    dx = [g[0] for g in reversed(grads)] + norms_bwd
    dw = [g[1] for g in reversed(grads)]
    d_qk, d_v = mla_head_dims(b)
    heads = b.m.heads // b.t

    def convert(op: Op, phase: str) -> list[Op]:
        if op.name == "qkv":
            return [replace(p, phase=phase) for p in fwd]
        if op.name == "qkv_dx":
            return dx
        if op.name == "qkv_dw":
            return dw
        if op.name in ("attn_proj", "attn_proj_dx", "attn_proj_dw"):  # heads·v_head → h
            proj = b._gemm("attn_proj", "F", b.T, b.m.hidden, heads * d_v)
            new = proj if op.name == "attn_proj" else \
                b._gemm_grads(proj)[0 if op.name.endswith("dx") else 1]
            # keep the pass and any TP-overlap splitting of the op it replaces
            return [replace(op, flops=new.flops, bytes=new.bytes, mnk=new.mnk)]
        if isinstance(op, ComputeOp) and op.kind == "attention":
            return [_mla_attention(op, b, d_qk, d_v)]
        return [op]

    phases = ("F", "R", "B", "W")
    return tuple([new for op in ops for new in convert(op, "R" if p == "R" else op.phase)]
                 for ops, p in zip(lists, phases, strict=True))


def _mla_attention(op: ComputeOp, b: LayerBuilder, d_qk: int, d_v: int) -> ComputeOp:
    """The fused attention kernel with MLA's head widths: FLOPs scaled from ``head_dim``
    to ``(d_qk + d_v)/2``, bytes from Q, K, V, O of ``(2·d_qk + 2·d_v)`` per head."""
    d = b.m.head_dim
    scale = (d_qk + d_v) / 2 / d
    io_scale = (2 * d_qk + 2 * d_v) / (4 * d)
    shape = (op.attention_shape[0], d_qk) if op.attention_shape else None
    return replace(op, flops=op.flops * scale, bytes=op.bytes * io_scale,
                   attention_shape=shape)


def mla_activation_bytes_delta(model: Model, par: Parallelism, training: Training,
                               element_bytes: int) -> float:
    """What an MLA block stores for its backward beyond the (grouped-query) attention
    tensors :func:`llmsim.memory.activation_bytes_per_layer` counts, bytes per micro-batch
    and device (0 without MLA; full recompute keeps only the block input).

    Stored: the query latent before and after its norm (``2·q_lora``), the key/value
    latent likewise (``2·kv_lora``) and the shared rotary key (``qk_rope``), all
    replicated over TP; per head on this rank the query and key (``d_qk`` each), the
    value and the attention output (``d_v`` each). They replace the query and attention
    output (``h/t`` each) and the key and value (``kv/t`` each) of the usual count.
    With ``recompute_norms_and_up_proj`` (DeepSeek-V3 report §3.2.3) the normalised
    latents and the queries, keys and values are recomputed in the backward from the
    stored latents: ``q_lora + kv_lora + qk_rope`` and the attention output are kept.
    """
    a = model.mla
    if a is None or par.recompute == "full":
        return 0.0
    t, sb = par.tp, par.micro_batch * training.seq_len
    d_qk, d_v = a.qk_nope_head_dim + a.qk_rope_head_dim, a.v_head_dim
    heads = model.heads // t
    if par.recompute_norms_and_up_proj:
        mla = a.q_lora_rank + a.kv_lora_rank + a.qk_rope_head_dim + heads * d_v
    else:
        mla = (2 * a.q_lora_rank + 2 * a.kv_lora_rank + a.qk_rope_head_dim
               + heads * (2 * d_qk + 2 * d_v))
    usual = 2 * model.hidden / t + 2 * max(model.n_kv_heads // t, 1) * model.head_dim
    return element_bytes * sb * (mla - usual)
