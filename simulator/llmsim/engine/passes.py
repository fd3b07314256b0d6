"""A pipeline action's pass: priced once, and recorded in parts around its pauses.

A pass (the forward, input-gradient or weight-gradient pass of one chunk for one
micro-batch) runs its chunk's block of ops (:mod:`llmsim.blocks`), priced once per
(stage, chunk, kind, compute units held by other kernels); its record on the compute
stream is split where the pass paused (for a gradient bucket's kernels, or waiting for
a layer's gathered weights).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import simpy

from llmsim.blocks import Block, CostModel, block_kind
from llmsim.costs import HardwareCosts
from llmsim.engine.devices import Device
from llmsim.engine.pairs import PassKey, beside_partner, computation_s
from llmsim.engine.streams import Pause
from llmsim.schedules import Action
from llmsim.trace import Record
from llmsim.workload import Workload


class PassPricing:
    """The :class:`~llmsim.engine.Engine`'s passes, priced and recorded: a part of the
    engine, on the state :meth:`Engine.__init__` sets up (below)."""

    env: simpy.Environment
    work: Workload
    records: list[Record]
    stage_costs: list[CostModel]
    overlap_tp: bool
    split_backward: bool
    priced: dict[tuple[int, int, str, int], Block]
    laid_out: dict[tuple[tuple[int, ...], int, int, float | None], Block]
    blocks: dict[tuple[int, int, str], Block]
    pass_kinds: dict[PassKey, str]

    def _priced(self, stage: int, chunk: int, kind: str, held: int) -> Block:
        """A pass of ``kind`` ("F", "B"; "W" with its gradient accumulation, "w" without,
        the micro-batches before :attr:`Workload.accumulate_from_microbatch`) on ``held``
        compute units fewer, priced once."""
        if "&" in kind:  # a pass of an overlapped pair (llmsim.engine.pairs)
            return self._paired(stage, chunk, kind, held)
        work = self.work.chunks[(stage, chunk)]
        if kind == "W" and not work.accumulate:
            kind = "w"  # nothing to accumulate: the same pass
        key = (stage, chunk, kind, held)
        block = self.priced.get(key)
        if block is None:
            ops = {"F": work.forward, "B": work.backward, "w": work.weight,
                   "W": work.weight + work.accumulate}
            passed, costs = ops[kind], self.stage_costs[stage]
            lead = self._entry_lead_s(stage, chunk, kind, held)
            if type(costs) is not HardwareCosts:  # e.g. jitter: a draw per call
                block = Block.of(passed, costs, self.overlap_tp, held, lead)
            else:
                same = (tuple(map(id, passed)), id(costs), held, lead)
                block = self.laid_out.get(same)
                if block is None:
                    block = self.laid_out[same] = Block.of(passed, costs, self.overlap_tp,
                                                           held, lead)
            self.priced[key] = block
        return block

    def _entry_lead_s(self, stage: int, chunk: int, kind: str, held: int) -> float | None:
        """How far ahead of the device the host enters a pass, s; None: the cost model's
        rule (:attr:`llmsim.costs.host_issue.HostIssue.ahead`). Without a pipeline (one
        stage, one chunk) and with a host that runs ahead, the host's lead is earned: a
        micro-batch's forward starts from a drained queue (the step's first waits for the
        previous step's end; a later one's lead is taken as none too, an upper bound on
        its wait), and its backward and weight passes enter with the lead the pass
        before them left (:attr:`Block.lead_out_s`), so a host slower than its device
        over whole passes sets their pace."""
        issue = self.stage_costs[stage].host_issue
        if not issue.ahead or issue.interval_s <= 0 or len(self.work.chunks) != 1:
            return None
        if kind == "F":
            return 0.0
        before = "B" if kind in ("W", "w") else "F"
        return self._priced(stage, chunk, before, held).lead_out_s

    def _paired(self, stage: int, chunk: int, kind: str, held: int) -> Block:
        """A forward (``F&c``) or backward (``B&c``) run overlapped with a pass of chunk
        ``c``: its all-to-alls beside that partner's computation (the backward's with
        its weight gradients), both computing on the units the all-to-all kernels leave
        (:attr:`Workload.pair_comm_units`), priced once (:mod:`llmsim.engine.pairs`)."""
        key = (stage, chunk, kind, held)
        block = self.priced.get(key)
        if block is None:
            own, partner = kind[0], int(kind[2:])
            held += self.work.pair_comm_units
            partners = ("B", "W") if own == "F" else ("F",)
            partner_s = computation_s(*(self._priced(stage, partner, k, held)
                                        for k in partners))
            block = self.priced[key] = beside_partner(
                self._priced(stage, chunk, own, held), partner_s)
        return block

    @property
    def backward_step(self) -> str:
        """The pass after which a backward step sends its input gradient and posts its
        next receive: "B" where the backward is split (Zero Bubble), else the fused
        backward's last pass, "W"."""
        return "B" if self.split_backward else "W"

    def _kind(self, act: Action) -> str:
        """Which of its chunk's passes ``act`` runs (:func:`block_kind`; a pass of an
        overlapped pair, :attr:`pass_kinds`)."""
        paired = self.pass_kinds.get((act.stage, act.kind, act.microbatch, act.chunk)) \
            if self.pass_kinds else None
        return paired or block_kind(act.kind, act.microbatch,
                                    self.work.accumulate_from_microbatch)

    def _price(self, dev: Device, act: Action) -> Callable[[int], float]:
        """Seconds ``act``'s pass takes on ``dev`` with a given number of units held."""
        kind = self._kind(act)
        return lambda held: self._priced(dev.stage, act.chunk, kind, held).duration_s

    def _block(self, dev: Device, act: Action) -> Block:
        """The block ``act`` runs on ``dev``, alone on the device."""
        return self.blocks[(dev.stage, act.chunk, self._kind(act))]

    def _record_pass(self, dev: Device, act: Action, block: Block, start: float,
                     pauses: list[Pause]) -> None:
        """Record a pass that ran from ``start`` to now, in parts around its ``pauses``."""
        seg_start, seg_from = start, 0.0
        for share, paused, resumed in pauses:
            self._record_part(dev, act, seg_start, seg_from, share * block.duration_s, paused)
            seg_start, seg_from = resumed, share * block.duration_s
        if not pauses or pauses[-1][0] < 1.0:  # a pause at the very end leaves nothing
            self._record_part(dev, act, seg_start, seg_from, math.inf)

    def _record_part(self, dev: Device, act: Action, start: float, block_from: float,
                     block_to: float, end: float | None = None) -> None:
        """Record the part ``[block_from, block_to)`` of a pass's block, run from ``start``
        to ``end`` (now by default)."""
        self.records.append(Record(dev.id, dev.stage, "compute", label(act), act.kind,
                                   act.microbatch, act.chunk, start,
                                   self.env.now if end is None else end,
                                   block_from, block_to))


def label(act: Action) -> str:
    return f"{act.kind}{act.microbatch}" + (f"c{act.chunk}" if act.chunk else "")
