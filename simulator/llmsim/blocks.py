"""Pass templates: the ops of one pass of a chunk, priced and laid out back to back.

A :class:`Block` is what one pipeline action runs on the compute stream (and, for the
blocking tensor-parallel collectives inside it, the ``tp`` stream): the engine prices
each chunk's passes once and replays them as single timeouts. Tensor-parallel
communication overlapped with its GEMM keeps only its exposed part
(:func:`exposed_overlap_s`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import NamedTuple, Protocol

from llmsim.costs.host_issue import HostIssue, pass_queue
from llmsim.cp_schedules import EXPOSED
from llmsim.ops import CommOp, ComputeOp
from llmsim.workload import Op

MOE_DISPATCH_AXES = frozenset({"ep", "tp+ep", "xtp+ep"})
"""Axes whose groups run only a MoE token dispatcher's communication (its all-to-alls and
HybridEP's routing-map all-gather, :mod:`llmsim.moe`): counted with the all-to-alls."""


class CostModel(Protocol):
    """Prices ops in seconds (see :mod:`llmsim.costs`)."""

    def compute_s(self, op: ComputeOp) -> float: ...
    def comm_s(self, op: CommOp) -> float: ...

    @property
    def host_issue(self) -> HostIssue:
        """How the host issues the compute kernels (its interval, 0: no op waits for it;
        whether it enters each pass ahead)."""
        ...


class OpSpan(NamedTuple):
    """Where one op of a block sits inside the block, relative to its start (a frozen
    row, a named tuple: a step's blocks lay out thousands)."""

    name: str
    stream: str
    phase: str
    offset_s: float
    duration_s: float


@dataclass(frozen=True)
class Block:
    """The ops of one pass of a chunk, back to back on the compute (and TP) stream."""

    spans: tuple[OpSpan, ...]
    duration_s: float
    compute_s: float
    tp_s: float
    """The pass's collectives other than all-to-alls and ring exchanges (TP)."""
    a2a_s: float = 0.0
    """The pass's expert-parallel all-to-alls (MoE token dispatch and combine, with
    HybridEP's routing-map all-gather)."""
    cp_s: float = 0.0
    """What the pass's context-parallel ring exchanges add beside attention."""
    lead_out_s: float = math.inf
    """How far ahead of the device the host is when the pass ends: the pass's end less
    the time the host issues the next pass's first kernel, s (negative: behind;
    ``math.inf``: ahead of every kernel, or no host queue)."""
    device_syncs: tuple[int, ...] = ()
    """The spans of the ops whose host sync is device-wide
    (:attr:`llmsim.ops.ComputeOp.device_sync`; the sync at the span's start, its gap in
    the span), by index."""

    @classmethod
    def of(cls, ops: tuple[Op, ...], costs: CostModel, overlap_tp: bool = False,
           reserved_units: int = 0, lead_s: float | None = None) -> Block:
        """Price ``ops`` and lay them out back to back.

        With ``overlap_tp`` (TP communication overlap) a collective that pairs with a GEMM
        keeps only its exposed part (:func:`exposed_overlap_s`), pipelined in the GEMM's
        ``splits`` chunks; an all-to-all that pairs with one (the MoE shared expert's
        overlap) does so without it. A context-parallel ring keeps what the attention
        kernel after it does not hide (its schedule's rule, :data:`llmsim.cp_schedules.EXPOSED`).
        ``reserved_units`` more compute units are held by other kernels (a data-parallel
        collective's) while every compute op runs.

        Where the host issues the kernels one by one (``costs.host_issue.interval_s`` > 0,
        eager mode), an op that the host's dispatch has not reached yet when the op before it
        ends waits for it (:func:`llmsim.costs.host_issue.pass_waits_s`; from the pass's
        first host sync on where the host enters the pass ahead, ``costs.host_issue.ahead``);
        the wait is counted in the op's span and in its kind's time. ``lead_s``: how far
        ahead of the device the host enters the pass, s (None: ahead of every kernel
        before the first sync where ``costs.host_issue.ahead``, else no lead; the engine
        gives a pass at ``pp`` 1 the lead the pass before it left, :attr:`lead_out_s`).
        """
        if reserved_units:
            ops = tuple(replace(op, reserved_units=op.reserved_units + reserved_units)
                        if isinstance(op, ComputeOp) else op for op in ops)
        durations = _prices(ops, costs)
        for i, op in enumerate(ops):  # a context-parallel ring beside the next op
            if isinstance(op, CommOp) and op.ring_steps > 1 and i + 1 < len(ops):
                durations[i] = EXPOSED[op.ring_schedule](durations[i], durations[i + 1],
                                                         op.ring_steps)
        for i, op in enumerate(ops):
            # TP collectives pair with their GEMM under TP overlap; an all-to-all that
            # pairs with a GEMM (the MoE shared expert's overlap) always does.
            a2a = isinstance(op, CommOp) and op.collective == "all_to_all"
            beside_wgrad = isinstance(op, CommOp) and op.beside_weight_grad
            if overlap_tp or a2a or beside_wgrad:
                j = _paired_gemm(ops, i)
                if j is not None:
                    gemm = ops[j]
                    assert isinstance(gemm, ComputeOp)
                    durations[i] = exposed_overlap_s(durations[i], durations[j], gemm.splits)
        issue = costs.host_issue
        lead_out = math.inf
        if issue.interval_s > 0:  # each op's wait for the host's issue, before it starts
            if lead_s is None:
                lead_s = math.inf if issue.ahead else 0.0
            waits, lead_out = pass_queue(ops, durations, issue.interval_s, lead_s,
                                         issue.loop_interval_s, issue.work)
            durations = [w + d for w, d in zip(waits, durations, strict=True)]
        spans, t, compute, tp, a2a, cp = [], 0.0, 0.0, 0.0, 0.0, 0.0
        syncs: list[int] = []
        for op, d in zip(ops, durations, strict=True):
            if isinstance(op, ComputeOp):
                stream = "compute"
                compute += d
                if op.device_sync:
                    syncs.append(len(spans))
            elif op.collective == "all_to_all" or op.axis in MOE_DISPATCH_AXES:
                stream = "ep"  # the MoE dispatcher's stream, whatever group runs them
                a2a += d
            elif op.ring_steps:
                stream = op.axis
                cp += d
            else:
                stream = op.axis
                tp += d
            spans.append(OpSpan(op.name, stream, op.phase, t, d))
            t += d
        return cls(tuple(spans), t, compute, tp, a2a, cp, lead_out, tuple(syncs))


def chained_passes_s(passes: tuple[tuple[Op, ...], ...], costs: CostModel,
                     overlap_tp: bool, alone: bool) -> tuple[float, ...]:
    """Seconds of a chunk's passes in order (forward, backward, weight gradients), each
    one block. Where the chunk is its device's only one (``alone``: no pipeline) and the
    host runs ahead (:attr:`HostIssue.ahead`), the host enters the forward with no lead and
    each later pass with the lead the pass before left (:attr:`Block.lead_out_s`), as the
    engine runs them (``llmsim.engine.passes``); else each pass on the cost model's
    rule. An empty pass takes 0."""
    chained = alone and costs.host_issue.ahead and costs.host_issue.interval_s > 0
    lead: float | None = 0.0 if chained else None
    out = []
    for ops in passes:
        if not ops:
            out.append(0.0)
            continue
        block = Block.of(ops, costs, overlap_tp, 0, lead)
        out.append(block.duration_s)
        if chained:
            lead = block.lead_out_s
    return tuple(out)


def _prices(ops: tuple[Op, ...], costs: CostModel) -> list[float]:
    """Seconds each of ``ops`` takes, from ``costs``; an op object that recurs (a chunk's
    layers share theirs) is priced once. A cost model that prices a pass's ops apart from
    once-per-step ones (``pass_compute_s`` / ``pass_comm_s``: the jitter's mean over the
    step's micro-batches, :mod:`llmsim.costs.jitter`) is asked through those."""
    compute_s = getattr(costs, "pass_compute_s", costs.compute_s)
    comm_s = getattr(costs, "pass_comm_s", costs.comm_s)
    priced: dict[int, float] = {}
    out = []
    for op in ops:
        duration_s = priced.get(id(op))
        if duration_s is None:
            duration_s = priced[id(op)] = (compute_s(op) if isinstance(op, ComputeOp)
                                           else comm_s(op))
        out.append(duration_s)
    return out


def exposed_overlap_s(comm_s: float, gemm_s: float, chunks: int) -> float:
    """Time a TP collective adds to the GEMM it is overlapped with.

    Transformer Engine's overlap (Megatron-LM ``--tp-comm-overlap``) splits the GEMM and
    its all-gather or reduce-scatter into ``chunks`` pieces and moves one piece while the
    GEMM works on another (Wang et al. 2023, "Overlap communication with dependent
    computation via decomposition", ASPLOS). Two pipelined operations take
    ``max(c, g) + min(c, g)/n``: the longer one, plus one piece of the shorter that has
    nothing to hide behind (the first transfer, or the last reduction). A transfer in
    bulk (``chunks = 1``) runs beside a GEMM it does not depend on: ``max(c, g)``. What
    the collective adds is that minus the GEMM's own time ``g``, which already includes
    the chunking and the compute units the transfers hold
    (:class:`~llmsim.ops.ComputeOp` ``splits`` and ``reserved_units``).
    """
    if chunks == 1:
        return max(comm_s, gemm_s) - gemm_s
    return max(comm_s, gemm_s) + min(comm_s, gemm_s) / chunks - gemm_s


def _paired_gemm(ops: tuple[Op, ...], i: int) -> int | None:
    """Index of the GEMM that collective ``ops[i]`` pairs with, or None.

    Searches in the op's ``pairs_with`` direction, past memory-bound ops (an FP8 cast)
    but not past another collective.
    """
    op = ops[i]
    if not isinstance(op, CommOp) or op.pairs_with is None:
        return None
    step = 1 if op.pairs_with == "next" else -1
    j = i + step
    while 0 <= j < len(ops):
        other = ops[j]
        if isinstance(other, CommOp):
            return None
        if other.kind == "gemm":
            return j
        j += step
    return None


def block_kind(kind: str, microbatch: int, accumulate_from: int) -> str:
    """Key of a pass's block: its kind, or "w" for a weight pass that adds no gradients to
    the buffer (a micro-batch before ``accumulate_from``)."""
    return "w" if kind == "W" and microbatch < accumulate_from else kind
