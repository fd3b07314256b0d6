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

Where a layer's gather is several all-gathers back to back (``gather_per_module``, or
the routed experts' share over their own group) the later ones join the queue only when
the one before ends, behind whatever was queued meanwhile: :func:`single_transfers` keeps
those steps on SimPy. A pass reaching a layer at the very instant its gather ends waits
on SimPy or not depending on which of two events at the same time it processes first;
the loop does not guess: it raises :class:`SameInstant` and the step runs on SimPy.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from llmsim.engine.devices import Device
from llmsim.ops import CommOp
from llmsim.schedules import Action
from llmsim.trace import Record

if TYPE_CHECKING:
    from llmsim.engine.replay import Engine

new_record = tuple.__new__
"""Makes a :class:`Record` from a tuple of its fields (the named tuple's own ``__new__``
is a Python function: twice the time for the ~10⁵ records of a ZeRO-3 step)."""


class SameInstant(Exception):
    """A pass reached a layer at the instant its gather ended: the step goes to SimPy."""


def single_transfers(engine: Engine) -> bool:
    """Whether every weight gather of ``engine``'s step is one all-gather (one message,
    one part, :meth:`Workload.gather_parts`)."""
    work = engine.work
    if work.gather_messages != 1:
        return False
    for chunk in work.chunks.values():
        first = work.weight_gather(chunk)
        if first is not None and len(work.gather_parts(chunk, first)) != 1:
            return False
    return True


class DeviceGathers:
    """One device's weight gathers in the tight loop: issued at the points of its walk
    where :meth:`WeightGathers._prefetch` issues them, queued on its ``dp`` stream
    (``queue(at_s, seconds) → (start, end)``) and recorded; :meth:`gathered_pass` runs a
    pass layer by layer as :meth:`WeightGathers._gathered_pass` does."""

    def __init__(self, engine: Engine, dev: Device, actions: list[Action],
                 queue: Callable[[float, float], tuple[float, float]],
                 records: list[Record], dp_waits: list[tuple[int, float, float]]) -> None:
        self.engine, self.dev, self.actions = engine, dev, actions
        self.queue, self.records, self.dp_waits = queue, records, dp_waits
        self.prefetching = engine.prefetch_weights
        self.end_s: dict[tuple[int, int, str, int], float] = {}
        """(micro-batch, chunk, kind, layer) → when that gather ends, once issued."""
        self.ops: dict[tuple[int, str], list[tuple[str, str, float]] | None] = {}
        """(chunk, kind) → (name, phase, seconds) of the gather before each part of the
        pass, in the order the pass waits for them (None: the pass gathers nothing)."""
        self.units: dict[tuple[int, str], list[float]] = {}
        """(chunk, block kind) → the durations of the gathered pass's parts."""

    def gathered(self, act: Action) -> bool:
        """Whether ``act``'s pass waits for weight gathers (:meth:`Engine._gather_ops`)."""
        return bool(self.engine._gather_ops(self.dev, act))

    def _parts(self, act: Action) -> list[tuple[str, str, float]]:
        """(name, phase, seconds) of the gather before each part of ``act``'s pass: the
        backward walks the layers in reverse, each layer twice when it regathers for the
        recompute (the indexing of :meth:`WeightGathers._prefetch`)."""
        key = (act.chunk, act.kind)
        parts = self.ops.get(key)
        if parts is None:
            engine, stage = self.engine, self.dev.stage
            ops: list[CommOp] = engine._gather_ops(self.dev, act)
            if act.kind == "F":
                order = ops
            else:
                twice = 2 if engine._regathers(act) else 1
                order = [ops[len(ops) - 1 - j // twice] for j in range(len(ops) * twice)]
            parts = self.ops[key] = [(op.name, op.phase, engine._comm_s(op, stage))
                                     for op in order]
        return parts

    def prefetch(self, i: int, layer: int, now_s: float) -> None:
        """Issue the gather of ``layer`` for action ``i`` at ``now_s``, if that action
        gathers and it is not issued yet."""
        if i >= len(self.actions):
            return
        act = self.actions[i]
        key = (act.microbatch, act.chunk, act.kind, layer)
        if key in self.end_s or not self.gathered(act):
            return
        name, phase, duration_s = self._parts(act)[layer]
        start_s, end_s = self.queue(now_s, duration_s)
        self.end_s[key] = end_s
        self.records.append(new_record(Record, (self.dev.id, self.dev.stage, "dp", name, phase,
                                          -1, -1, start_s, end_s, 0.0, math.inf)))

    def gathered_pass(self, i: int, now_s: float, label: str) -> float:
        """Run pass ``i`` (recorded as ``label``) from ``now_s`` layer by layer, each part
        waiting for its gather; returns when it ends.

        The block is split into :meth:`Engine._gathered_units`; a wait for a gather splits
        the pass's compute record in two and is recorded as a data-parallel wait."""
        engine, dev, act = self.engine, self.dev, self.actions[i]
        kind = engine._kind(act)
        units = self.units.get((act.chunk, kind))
        if units is None:
            units = self.units[(act.chunk, kind)] = engine._gathered_units(
                dev, act, engine._block(dev, act))
        end_s, records, prefetching = self.end_s, self.records, self.prefetching
        device, stage, mb, chunk, pass_kind = dev.id, dev.stage, act.microbatch, act.chunk, \
            act.kind
        last = len(units) - 1
        seg_start, seg_from, offset = now_s, 0.0, 0.0
        for j, unit_s in enumerate(units):
            self.prefetch(i, j, now_s)  # no-op when already issued
            ready_s = end_s[(mb, chunk, pass_kind, j)]
            if ready_s >= now_s:
                if ready_s == now_s:
                    raise SameInstant(f"{label} on device {device} reaches layer part {j} "
                                      "as its gather ends")
                if now_s > seg_start:
                    records.append(new_record(Record, (device, stage, "compute", label, pass_kind,
                                                 mb, chunk, seg_start, now_s, seg_from,
                                                 offset)))
                self.dp_waits.append((device, now_s, ready_s))
                now_s = ready_s
                seg_start, seg_from = now_s, offset
            if prefetching:
                if j < last:
                    self.prefetch(i, j + 1, now_s)
                else:
                    self.prefetch(i + 1, 0, now_s)
            now_s += unit_s
            offset += unit_s
        records.append(new_record(Record, (device, stage, "compute", label, pass_kind, mb, chunk,
                                     seg_start, now_s, seg_from, math.inf)))
        return now_s
