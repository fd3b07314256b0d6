"""Context parallelism: each sequence split over ``cp`` ranks, attention by ring exchange.

Megatron-Core with Transformer Engine (``--context-parallel-size``,
``cp_comm_type p2p``; Liu et al. 2023, "Ring Attention with Blockwise Transformers"):
every rank holds ``s/cp`` tokens of each sequence — two chunks of ``s/(2·cp)``, the
``i``-th and the ``(2·cp − 1 − i)``-th, so that every rank does the same share of the
causal attention — and runs every op but attention on them alone. Attention runs in
``cp`` steps: at each, the rank computes its queries against one rank's keys and values
while it sends the block it holds to the next rank of the ring and receives the next
one; the backward passes the key/value blocks round again with their gradients. Each
rank does ``1/cp`` of the sequence's attention FLOPs.

The ring's time beside the attention kernel of FLOP time ``g`` (all ``cp`` steps) and a
transfer of ``c`` per step: the first step computes on the local block, each of the
``cp − 1`` others waits for the slower of its compute and its transfer,
``g/cp + (cp − 1)·max(g/cp, c)``; it exposes what exceeds ``g``
(:func:`ring_exposed_s`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from llmsim.ops import CommOp, ComputeOp

if TYPE_CHECKING:
    from llmsim.workload import LayerBuilder, Op


def ring_exposed_s(step_comm_s: float, attention_s: float, steps: int) -> float:
    """Time a ring exchange of ``steps`` blocks adds to the attention kernel it runs
    beside: ``g/cp + (cp − 1)·max(g/cp, c) − g`` (module docstring)."""
    if steps <= 1:
        return 0.0
    block = attention_s / steps
    return block + (steps - 1) * max(block, step_comm_s) - attention_s


@dataclass(frozen=True, slots=True)
class RingBlock:
    """One step's attention kernel on one rank of a load-balanced causal ring: ``q_tokens``
    queries against ``kv_tokens`` keys and values, causal (the diagonal step) or full."""

    q_tokens: int
    kv_tokens: int
    causal: bool

    @property
    def executed_area(self) -> float:
        """Query-key pairs the kernel computes (a causal square computes its lower
        half)."""
        area = float(self.q_tokens * self.kv_tokens)
        return area / 2 if self.causal else area


def ring_blocks(seq_len: int, cp: int, rank: int) -> list[RingBlock]:
    """The attention kernels rank ``rank`` of a ``cp``-rank ring runs, step by step, for a
    sequence of ``seq_len`` tokens cut into ``2·cp`` chunks of ``c = s/(2·cp)`` (rank ``i``
    holds chunks ``i`` and ``2·cp − 1 − i``; Transformer Engine's
    ``AttnFuncWithCPAndKVP2P``, ``cp_comm_type p2p``): step 0 its own two chunks, causal
    (``2c × 2c``); at a later step the block of a rank before it in the ring (step ≤
    rank) gives both query chunks against that block's first chunk (``2c × c``, full), the
    block of a rank after it its second query chunk against both (``c × 2c``, full).
    Every rank computes ``s²/(2·cp)`` query-key pairs, the causal half over ``cp``
    (:func:`apply_context_parallel` prices them as one kernel of ``s/cp`` tokens at that
    count)."""
    c = seq_len // (2 * cp)
    blocks = [RingBlock(2 * c, 2 * c, True)]
    for step in range(1, cp):
        blocks.append(RingBlock(2 * c, c, False) if step <= rank else RingBlock(c, 2 * c, False))
    return blocks


def kv_block_bytes(builder: LayerBuilder) -> float:
    """Bytes of one rank's key and value block: its ``s/cp`` tokens' K and V for the
    heads of its TP rank (MLA: keys of ``d_qk``, values of ``d_v`` per head)."""
    b, m = builder, builder.m
    if m.mla is not None:
        per_token = m.heads // b.t * (m.mla.qk_nope_head_dim + m.mla.qk_rope_head_dim
                                      + m.mla.v_head_dim)
    else:
        per_token = 2 * max(m.n_kv_heads // b.t, 1) * m.head_dim
    return float(b.e * b.T * per_token)


def rank_attention(op: ComputeOp, builder: LayerBuilder, flops_factor: float = 1.0,
                   **changes: object) -> ComputeOp:
    """Attention op ``op`` as one rank of a ``cp`` group computes it: ``1/cp`` of the
    sequence's FLOPs (times ``flops_factor``) at the efficiency of ``s/cp``-token blocks,
    as ``cp`` ring steps; ``changes`` set further fields."""
    cp = builder.par.cp
    shape = (builder.trn.seq_len // cp, op.attention_shape[1]) if op.attention_shape else None
    return replace(op, flops=op.flops / cp * flops_factor, attention_shape=shape,
                   attention_ring_steps=cp, **changes)


def each_attention(lists: tuple[list[Op], ...],
                   convert: Callable[[ComputeOp], list[Op]]) -> tuple[list[Op], ...]:
    """``lists`` with every fused attention op replaced by ``convert(op)``."""
    return tuple([new for op in ops for new in (
        convert(op) if isinstance(op, ComputeOp) and op.kind == "attention" else [op])]
        for ops in lists)


def apply_context_parallel(lists: tuple[list[Op], ...],
                           builder: LayerBuilder) -> tuple[list[Op], ...]:
    """A block's op lists with each fused attention kernel doing ``1/cp`` of the
    sequence's attention FLOPs (at the efficiency of ``s/cp``-token blocks) and, before
    it, the ring exchange it runs beside: the key/value block forward, the key/value
    block and its gradient backward (``ring_steps`` = cp). The builder's token count is
    already the rank's ``s/cp``."""
    cp = builder.par.cp
    if cp == 1:
        return lists
    kv = kv_block_bytes(builder)

    def convert(op: ComputeOp) -> list[Op]:
        backward = op.phase == "B"
        ring = CommOp("cp_kv_ring_bwd" if backward else "cp_kv_ring", "send_recv", "cp",
                      op.phase, 2 * kv if backward else kv, ring_steps=cp)
        return [ring, rank_attention(op, builder)]

    return each_attention(lists, convert)
