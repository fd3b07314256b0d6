"""The tight loop's weight gathers: ZeRO's per-layer all-gathers replayed without SimPy.

ZeRO-3 gathers each layer's weights before its forward and its backward, ZeRO-1/2 with
``overlap_param_gather`` before each chunk's first forward (:mod:`~llmsim.engine.gathers`).
On a device alone in its data-parallel group (reduced fidelity) whose collectives hold no
compute units, a gather is one transfer on the device's ``dp`` FIFO stream: it starts when
it is issued and the transfer queued before it has ended, and takes its priced time. The
SimPy path issues it as a process that joins the stream's queue at the instant it is
issued, in the order the device issued it beside its gradient buckets; :class:`DeviceGathers`
queues it on the tight loop's stream at the same point of the device's walk, so both
make the same sums in the same order.

A layer's gather may be several all-gathers back to back (``gather_per_module``, or the
routed experts' share over their own group, :meth:`Workload.gather_parts`): the first
joins the queue when issued, each later one when the one before it ends, behind whatever
the device queued meanwhile (a micro-batch's gradient reduce-scatters). The loop keeps
the gather in flight as a chain whose next message joins at a known time, and queues it
before anything the device queues later (:meth:`DeviceGathers.advance`). Where two things
would join the stream, or a pass would reach a layer, at the very instant a gather's
message ends, SimPy's order of two events at one time decides; the loop does not guess:
it raises :class:`SameInstant` and the step runs on SimPy.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from llmsim.engine.devices import Device
from llmsim.ops import CommOp
from llmsim.schedules import Action
from llmsim.trace import Record

if TYPE_CHECKING:
    from llmsim.engine.replay import Engine
    from llmsim.engine.uncontended import Stream

new_record = tuple.__new__
"""Makes a :class:`Record` from a tuple of its fields (the named tuple's own ``__new__``
is a Python function: twice the time for the ~10⁵ records of a ZeRO-3 step)."""


class SameInstant(Exception):
    """Something met a gather's message ending at the same instant (or two gathers would
    be in flight at once): the step goes to SimPy, whose order of events decides."""


Message = tuple[str, str, float]
"""One all-gather of a layer's gather: (name, phase, seconds)."""


class DeviceGathers:
    """One device's weight gathers in the tight loop: issued at the points of its walk
    where :meth:`WeightGathers._prefetch` issues them, queued on its ``dp`` stream and
    recorded; :meth:`gathered_pass` runs a pass layer by layer as
    :meth:`WeightGathers._gathered_pass` does."""

    def __init__(self, engine: Engine, dev: Device, actions: list[Action], stream: Stream,
                 records: list[Record], dp_waits: list[tuple[int, float, float]]) -> None:
        self.engine, self.dev, self.actions = engine, dev, actions
        self.stream, self.records, self.dp_waits = stream, records, dp_waits
        by_pass: dict[tuple[int, str, bool], list[tuple[Message, ...]] | None] = {}
        self.parts: list[list[tuple[Message, ...]] | None] = []
        """Action index → the all-gathers of the gather before each part of its pass, in
        the order the pass reaches them (None: the pass gathers nothing)."""
        gathers_before: dict[tuple[str, int], bool] = {}  # (kind, micro-batch) → whether
        for act in actions:
            gathers = gathers_before.get((act.kind, act.microbatch))
            if gathers is None:
                gathers = gathers_before[(act.kind, act.microbatch)] = \
                    engine.work.gathers_before(act.kind, act.microbatch)
            key = (act.chunk, act.kind, gathers)
            if key not in by_pass:
                by_pass[key] = self._parts(act) if gathers and engine._gather_ops(dev, act) \
                    else None
            self.parts.append(by_pass[key])
        self.end_s: list[list[float]] = [[] for _ in actions]
        """Action index → when each gather it issued so far ends, once its last all-gather
        is queued (they are issued in the order its pass reaches them)."""
        self.pending: tuple[list[float], tuple[Message, ...], int, float] | None = None
        """The gather in flight whose later all-gathers are not queued yet: (the ends of
        its action, its all-gathers, the next one's index, when that one joins)."""
        self.units: dict[tuple[int, str], list[float]] = {}
        """(chunk, block kind) → the durations of the gathered pass's parts."""

    def _parts(self, act: Action) -> list[tuple[Message, ...]]:
        """The all-gathers of the gather before each part of ``act``'s pass: the backward
        walks the layers in reverse, each layer twice when it regathers for the recompute
        (the indexing of :meth:`WeightGathers._prefetch`); each gather is its parts
        (:meth:`Workload.gather_parts`), each :attr:`Workload.gather_messages` times, once a
        call (:attr:`Workload.gather_calls`), in :meth:`WeightGathers._gather`'s order."""
        engine, stage, work = self.engine, self.dev.stage, self.engine.work
        chunk = work.chunks[(stage, act.chunk)]
        ops: list[CommOp] = engine._gather_ops(self.dev, act)
        if act.kind == "F":
            order = ops
        else:
            twice = 2 if engine._regathers(act) else 1
            order = [ops[len(ops) - 1 - j // twice] for j in range(len(ops) * twice)]
        messages: dict[int, tuple[Message, ...]] = {}
        for op in order:
            if id(op) not in messages:
                messages[id(op)] = tuple(
                    (part.name, part.phase, engine._comm_s(part, stage))
                    for part in work.gather_parts(chunk, op) * work.gather_calls
                    for _ in range(work.gather_messages))
        return [messages[id(op)] for op in order]

    def _queue(self, message: Message, at_s: float) -> float:
        """Queue one all-gather at ``at_s`` on the ``dp`` stream and record it: it starts
        when the stream is free; returns when it ends."""
        name, phase, duration_s = message
        stream = self.stream
        start_s = at_s if at_s > stream.free_s else stream.free_s
        end_s = stream.free_s = start_s + duration_s
        self.records.append(new_record(Record, (self.dev.id, self.dev.stage, "dp", name,
                                                phase, -1, -1, start_s, end_s, 0.0, math.inf)))
        return end_s

    def advance(self, at_s: float) -> None:
        """Queue the all-gathers of the gather in flight that join the stream before
        ``at_s`` (each when the one before it ends): call before the device queues
        anything else at ``at_s``."""
        while self.pending is not None:
            ends, messages, k, join_s = self.pending
            if join_s >= at_s:
                if join_s == at_s:
                    raise SameInstant(f"device {self.dev.id} queues on its dp stream at the "
                                      f"instant an all-gather of {messages[k][0]} joins it")
                return
            end_s = self._queue(messages[k], join_s)
            if k + 1 == len(messages):
                ends.append(end_s)
                self.pending = None
            else:
                self.pending = (ends, messages, k + 1, end_s)

    def _issue(self, messages: tuple[Message, ...], now_s: float, ends: list[float]) -> None:
        """Issue a gather at ``now_s``: its first all-gather queued, the others in flight."""
        if self.pending is not None:
            self.advance(now_s)
            if self.pending is not None:
                raise SameInstant(f"device {self.dev.id} issues a gather while another's "
                                  "all-gathers are still to join its dp stream")
        end_s = self._queue(messages[0], now_s)
        if len(messages) == 1:
            ends.append(end_s)
        else:
            self.pending = (ends, messages, 1, end_s)

    def prefetch(self, i: int, now_s: float) -> None:
        """Issue at ``now_s`` the gather of action ``i``'s first part, if its pass gathers
        and it is not issued yet (:meth:`WeightGathers._prefetch` with layer 0)."""
        if i < len(self.actions):
            parts, ends = self.parts[i], self.end_s[i]
            if parts is not None and not ends and (self.pending is None
                                                   or self.pending[0] is not ends):
                self._issue(parts[0], now_s, ends)

    def gathered(self, i: int) -> bool:
        """Whether action ``i``'s pass waits for weight gathers (:meth:`Engine._gather_ops`)."""
        return self.parts[i] is not None

    def gathered_pass(self, i: int, now_s: float, label: str, woken: bool = False) -> float:
        """Run pass ``i`` (recorded as ``label``) from ``now_s`` layer by layer, each part
        waiting for its gather; returns when it ends.

        The block is split into :meth:`Engine._gathered_units`; a wait for a gather splits
        the pass's compute record in two and is recorded as a data-parallel wait. Part j's
        gather is issued when part j−1 starts (with ``prefetch_weights`` for the pass; else
        when part j is reached), the next pass's first when the last part starts. A gather still in
        flight when its part is reached is queued whole: the device queues nothing else
        until it has ended.

        ``woken``: the device reached the pass on a message that came in at ``now_s`` (in
        SimPy an event scheduled at that instant): a first part's gather ending then has
        ended first, its last all-gather's timeout scheduled earlier
        (:meth:`~llmsim.engine.contended_gathers.GatheredPasses.ended_first`); any other
        such tie goes to SimPy."""
        engine, dev, act = self.engine, self.dev, self.actions[i]
        kind = engine._kind(act)
        units = self.units.get((act.chunk, kind))
        if units is None:
            units = self.units[(act.chunk, kind)] = engine._gathered_units(
                dev, act, engine._block(dev, act))
        parts, ends, issue = self.parts[i], self.end_s[i], self._issue
        assert parts is not None and len(parts) == len(units)
        records, waits = self.records, self.dp_waits
        ahead, ahead_next = (engine.prefetches(self.actions, n) for n in (i, i + 1))
        device, stage, mb, chunk, pass_kind = dev.id, dev.stage, act.microbatch, act.chunk, \
            act.kind
        last = len(units) - 1
        seg_start, seg_from, offset = now_s, 0.0, 0.0
        for j, unit_s in enumerate(units):
            if len(ends) == j:
                if self.pending is None or self.pending[0] is not ends:
                    issue(parts[j], now_s, ends)  # not issued ahead: issued when reached
                if self.pending is not None:
                    self.advance(math.inf)
            ready_s = ends[j]
            if ready_s >= now_s and not (woken and j == 0 and ready_s == now_s
                                         and parts[0][-1][2] > 0):
                if ready_s == now_s:
                    raise SameInstant(f"{label} on device {device} reaches layer part {j} "
                                      "as its gather ends")
                if now_s > seg_start:
                    records.append(new_record(Record, (device, stage, "compute", label,
                                                       pass_kind, mb, chunk, seg_start, now_s,
                                                       seg_from, offset)))
                waits.append((device, now_s, ready_s))
                now_s = ready_s
                seg_start, seg_from = now_s, offset
            if j < last:
                if ahead:
                    issue(parts[j + 1], now_s, ends)
            elif ahead_next:
                self.prefetch(i + 1, now_s)
            now_s += unit_s
            offset += unit_s
        records.append(new_record(Record, (device, stage, "compute", label, pass_kind, mb,
                                           chunk, seg_start, now_s, seg_from, math.inf)))
        return now_s
