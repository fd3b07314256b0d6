"""DistFlashAttn's load-balanced context-parallel attention (``parallelism.cp_schedule:
distflash``).

Li et al. 2024 (DISTFLASHATTN, arXiv:2310.03294, §3.1–3.2 and Algorithm 2) as its code runs
it (RulinShao/LightSeq at 135d8d2: ``lightseq/async_communication.py``,
``lightseq/lightseq_async_attn.py``). Each of the ``P = cp`` ranks holds one contiguous
chunk of ``c = s/P`` tokens. A pass runs ``⌊P/2⌋ + 1`` time steps: at step 0 every rank
computes its own causal ``c × c`` block; at step ``t ≥ 1`` rank ``r ≥ t`` computes its
queries against the keys and values of rank ``r − t``, fetched at step ``t − 1`` (the fetch
runs beside the step's kernel), and a rank ``r < t``, which has no earlier chunk left,
computes the queries of rank ``r − t + P`` against its own keys and values and sends the
partial output and its softmax statistics back; at the last step (``t = P/2``, even ``P``)
the ranks below ``P/2`` are idle. Every kernel after step 0 is a whole non-causal block.

* **Balance.** The busiest rank computes half a block and ``⌊P/2⌋`` whole ones; the mean is
  ``P/2`` blocks (the causal ``s²/2`` over ``P``), so the busiest rank does
  ``(P + 1)/P`` of the mean: 9/8 at ``P = 8`` (:func:`balance_factor`). The ranks wait for
  each other at every step, so llmsim prices the busiest rank's kernels. The code's steps
  cover the causal square only for an even ``P`` (at ``P = 3`` no rank computes the third
  rank's first block), so an odd ``cp`` is refused.
* **Exchange.** A step's fetch hides behind its kernel: step 0 fetches beside half a
  block, steps ``1 … ⌊P/2⌋ − 1`` beside a whole one, the last fetches nothing
  (:func:`distflash_exposed_s`). The busiest receiver of a forward step takes a key/value
  block, and the partial output with its FP32 max and sum from its helper; of a backward
  step, the queries, output, output gradient and log-sum-exp of a helped rank with the
  key/value gradients of its own block (:func:`step_bytes`). The fetches run at distance
  ``t``: across two boxes several share a link, which llmsim does not model (it prices one
  transfer on the group's path, as for the ring).
* **Synchronisation.** ``torch.cuda.synchronize()`` opens every time step of the forward
  and of the backward ("important for cuda scheduler to execute nccl calls first"): each a
  host gap (:data:`llmsim.host_syncs.HOST_SYNC_GAP_S`) on the attention kernel, and the
  host held until the last step's sync lets it go (``ComputeOp.host_held``,
  ``host_held_tail``: the last step's whole block, 1/(½ + ⌊P/2⌋) of the busiest rank's
  attention, runs after it). The sync is device-wide (``ComputeOp.device_sync``): the
  first step's waits for every stream, FSDP's weight gather in flight included.
* **Bookkeeping.** The backward copies q, k, v, o and the output gradient to
  ``[b, s, heads, d]`` (``rearrange(...).contiguous()``) and adds each step's query gradient
  (``dq += dq_delta``) and, from the second step, a helper's; the forward rescales the
  output by a helper's statistics (``_rescale_kernel``) from the second step: memory-bound
  kernels over the rank's query block (:func:`bookkeeping_ops`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llmsim.context import each_attention, rank_attention
from llmsim.host_syncs import HOST_SYNC_GAP_S
from llmsim.ops import CommOp, ComputeOp

if TYPE_CHECKING:
    from llmsim.workload import LayerBuilder, Op

FP32_BYTES = 4


def steps(cp: int) -> int:
    """Time steps of one DistFlashAttn pass over ``cp`` ranks: ⌊cp/2⌋ + 1."""
    return cp // 2 + 1


def balance_factor(cp: int) -> float:
    """The busiest rank's attention over the mean rank's: (½ + cp/2) / (cp/2) = (cp + 1)/cp
    for the even ``cp`` the schedule takes."""
    return (0.5 + cp // 2) / (cp / 2)


def distflash_exposed_s(step_comm_s: float, attention_s: float, n_steps: int) -> float:
    """Time a DistFlashAttn pass's fetches add to its attention of ``attention_s`` (the
    busiest rank's ½ + ⌊P/2⌋ blocks, ``n_steps`` = ⌊P/2⌋ + 1): the fetch beside the half
    block of step 0 and beside each whole block but the last,
    ``max(0, c − b/2) + (⌊P/2⌋ − 1)·max(0, c − b)``."""
    whole = n_steps - 1
    if whole < 1:
        return 0.0
    block = attention_s / (0.5 + whole)
    return max(0.0, step_comm_s - block / 2) + (whole - 1) * max(0.0, step_comm_s - block)


def step_bytes(builder: LayerBuilder, backward: bool) -> float:
    """Bytes the busiest rank receives in one time step: forward, a key/value block and a
    helper's partial output with its FP32 max and sum; backward, a helped rank's queries,
    output, output gradient and FP32 log-sum-exp, and the key/value gradients of its block
    (module docstring)."""
    b, m = builder, builder.m
    heads, kv_heads = m.heads // b.t, max(m.n_kv_heads // b.t, 1)
    q_block = b.e * b.T * heads * m.head_dim
    kv_block = 2 * b.e * b.T * kv_heads * m.head_dim
    rows = b.T * heads
    if backward:
        return float(3 * q_block + FP32_BYTES * rows + kv_block)
    return float(kv_block + q_block + 2 * FP32_BYTES * rows)


def bookkeeping_ops(builder: LayerBuilder, phase: str, cp: int) -> list[ComputeOp]:
    """The pass's memory-bound kernels beside its attention (module docstring): forward,
    ⌊P/2⌋ − 1 rescales reading the output and the helper's and writing the output; backward,
    the five layout copies (q and o and the output gradient of the query block, k and v of
    the key/value block) and 2·⌊P/2⌋ − 1 query-gradient sums."""
    b, m = builder, builder.m
    q_elements = b.T * m.heads // b.t * m.head_dim
    kv_elements = 2 * b.T * max(m.n_kv_heads // b.t, 1) * m.head_dim
    whole = cp // 2
    if phase == "B":
        copies = 2 * b.e * (3 * q_elements + kv_elements)
        sums = (2 * whole - 1) * 3 * b.e * q_elements
        return [ComputeOp("distflash_bwd_copies", "memory", phase, 0.0, float(copies),
                          splits=5),
                ComputeOp("distflash_dq_sums", "memory", phase, 0.0, float(sums),
                          splits=2 * whole - 1)]
    if whole < 2:
        return []
    return [ComputeOp("distflash_rescale", "memory", phase, 0.0,
                      float((whole - 1) * 3 * b.e * q_elements), splits=whole - 1)]


def apply_distflash(lists: tuple[list[Op], ...], builder: LayerBuilder) -> tuple[list[Op], ...]:
    """A block's op lists with each fused attention kernel as DistFlashAttn's busiest rank
    runs it: ``1/cp`` of the sequence's attention FLOPs times :func:`balance_factor`, at
    the rate of ``s/cp``-token blocks, one host sync a time step, the fetches before it
    (``ring_steps`` = ⌊cp/2⌋ + 1, priced by :func:`distflash_exposed_s`) and its
    bookkeeping kernels after it."""
    cp = builder.par.cp
    if cp == 1:
        return lists
    n = steps(cp)

    def convert(op: ComputeOp) -> list[Op]:
        attention = rank_attention(op, builder, balance_factor(cp),
                                   host_s=op.host_s + n * HOST_SYNC_GAP_S, host_held=True,
                                   host_held_tail=1 / (0.5 + (n - 1)), device_sync=True)
        backward = op.phase == "B"
        fetch = CommOp("cp_distflash_bwd" if backward else "cp_distflash", "send_recv", "cp",
                       op.phase, step_bytes(builder, backward), ring_steps=n,
                       ring_schedule="distflash")
        return [fetch, attention, *bookkeeping_ops(builder, op.phase, cp)]

    return each_attention(lists, convert)
