"""The contended loop's weight gathers: ZeRO's per-layer all-gathers as collectives on the
``dp`` stream beside passes that share compute units (:mod:`~llmsim.engine.contended`).

ZeRO-3 gathers each layer's weights before its forward and backward, ZeRO-1/2 with
``overlap_param_gather`` before each chunk's first forward (:mod:`~llmsim.engine.gathers`).
Each all-gather is a collective on the device's ``dp`` stream like a gradient bucket: it
starts when the one queued before it ends and holds the node's collective units while it
runs (:meth:`GradientTraffic._collective`). A layer's gather of several all-gathers
(``gather_per_module``, the routed experts' share) is a :class:`Chain`: its first joins the
stream when the gather is issued, each later one when the one before it ends, behind
whatever was queued meanwhile (:meth:`WeightGathers._gather`). A gathered pass runs layer
by layer, each part a pass segment priced at the units held
(:meth:`WeightGathers._gathered_pass`).

SimPy orders the work of one instant by its events; two things that join a device's
``dp`` stream at one instant from different processes (the device's walk and a gather's
chain) or a pass that reaches a layer at the instant its gather ends could go either way.
The loop does not guess: it raises :class:`SameInstant` and the step runs on SimPy.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING

from llmsim.engine.contended_units import DeviceState, Op
from llmsim.engine.uncontended_gathers import DeviceGathers, Message, SameInstant, new_record
from llmsim.schedules import Action
from llmsim.trace import Record

if TYPE_CHECKING:
    from llmsim.engine.replay import Engine

_PASS, _AT, _GATHER = 0, 3, 5
"""What a walk yields (:mod:`~llmsim.engine.contended`): run a pass (or a part of one);
wait until a time; wait for a :class:`Chain` (a gather, or a gradient bucket issued by
:meth:`GatheredPasses.prepared`)."""


class Chain:
    """One layer's gather: its all-gathers, joined one after the other."""

    __slots__ = ("end_s", "messages", "next", "waiter")

    def __init__(self, messages: tuple[Message, ...]) -> None:
        self.messages = messages
        self.next = 0
        """Index of the next all-gather to join the stream."""
        self.end_s: float | None = None
        """When the last all-gather ended (None: not yet)."""
        self.waiter: DeviceState | None = None
        """The device whose pass waits for it."""


class PartPrices(dict):
    """Units held → seconds part ``j`` of a gathered pass takes beside them
    (:meth:`Engine._gathered_units` of the pass priced at those units)."""

    __slots__ = ("act", "ds", "engine", "j")

    def __init__(self, engine: Engine, ds: DeviceState, act: Action, j: int,
                 units: list[float]) -> None:
        super().__init__({0: units[j]})
        self.engine, self.ds, self.act, self.j = engine, ds, act, j

    def __missing__(self, held: int) -> float:
        engine, act = self.engine, self.act
        block = engine._priced(self.ds.dev.stage, act.chunk, engine._kind(act), held)
        out = self[held] = engine._gathered_units(self.ds.dev, act, block)[self.j]
        return out


class GatheredPasses:
    """The weight gathers of a contended-loop replay: a part of its state
    (:class:`~llmsim.engine.contended._Contended`, below)."""

    engine: Engine
    records: dict[int, list[Record]]
    dp_waits: list[tuple[int, float, float]]
    now: float
    ready: deque[DeviceState]
    units: int
    collective_start: object

    def setup_gathers(self) -> None:
        self.gather_parts: dict[int, list[list[tuple[Message, ...]] | None]] = {}
        """Device → action index → the all-gathers of each part's gather (None: none)."""
        self.chains: dict[int, dict[tuple[int, int], Chain]] = {}
        """Device → (action index, part) → its gather, once issued."""
        self.joined: dict[int, tuple[float, object]] = {}
        """Device → (when, by whom) something last joined its ``dp`` stream."""
        self.part_prices: dict[tuple[int, int, str], list[PartPrices]] = {}
        """(device, chunk, block kind) → the prices of a gathered pass's parts."""

    def device_gathers(self, ds: DeviceState, actions: list[Action]) -> bool:
        """Set up ``ds``'s gathers; whether it has any."""
        self.chains[ds.dev.id] = {}
        if self.engine.hooks_closed_form:  # no pass gathers weights in this step
            self.gather_parts[ds.dev.id] = []
            return False
        parts = DeviceGathers(self.engine, ds.dev, actions, None, [], []).parts  # type: ignore[arg-type]
        self.gather_parts[ds.dev.id] = parts
        return any(p is not None for p in parts)

    def join(self, ds: DeviceState, op: Op, by: object) -> None:
        """Queue ``op`` on ``ds``'s ``dp`` stream now, ``by`` its walk (``ds``) or a chain."""
        device = ds.dev.id
        last = self.joined.get(device)
        if last is not None and last[0] == self.now and last[1] is not by:
            raise SameInstant(f"two processes queue on device {device}'s dp stream at "
                              f"{self.now} s")
        self.joined[device] = (self.now, by)
        ds.dp_queue.append(op)
        if len(ds.dp_queue) == 1:
            self.collective_start(ds)  # type: ignore[operator]

    def issue(self, ds: DeviceState, i: int, j: int) -> None:
        """Issue the gather before part ``j`` of action ``i``'s pass, if it gathers and it
        is not issued yet (:meth:`WeightGathers._prefetch`)."""
        parts = self.gather_parts[ds.dev.id]
        if i >= len(parts) or parts[i] is None:
            return
        chains = self.chains[ds.dev.id]
        if (i, j) not in chains:
            chain = chains[(i, j)] = Chain(parts[i][j])  # type: ignore[index]
            self.chain_next(ds, chain, ds)

    def chain_next(self, ds: DeviceState, chain: Chain, by: object) -> None:
        name, phase, duration_s = chain.messages[chain.next]
        chain.next += 1
        self.join(ds, Op(ds, None, self.units, duration_s, name=name, phase=phase,
                         chain=chain), by)

    def chain_end(self, ds: DeviceState, chain: Chain) -> None:
        """An all-gather of ``chain`` ended now: its next joins the stream, or the gather
        is done and wakes the pass waiting for it."""
        if chain.next < len(chain.messages):
            self.chain_next(ds, chain, chain)
            return
        chain.end_s = self.now
        if chain.waiter is not None:
            self.ready.append(chain.waiter)
            chain.waiter = None

    def prepared(self, ds: DeviceState, chunk: int, wait: bool) -> Iterator[tuple[int, object]]:
        """Issue every gradient bucket of ``chunk`` in turn, each after the kernels the
        compute stream runs on it first (recorded as kind "D"; :meth:`Workload.grad_sync_prep`),
        as :meth:`GradientTraffic._issue` does; ``wait``: each reduction waited for
        before the next bucket's kernels, as the reductions after the last pass without
        overlap are (:meth:`Engine._device`'s ``_prepared`` loop)."""
        engine, dev = self.engine, ds.dev
        stage, records = dev.stage, self.records[dev.id]
        for op in engine._grad_ops(engine.work.chunks[(stage, chunk)]):
            for name, duration_s in engine._prep(op, stage):
                start = self.now
                yield _AT, start + duration_s
                records.append(new_record(Record, (dev.id, stage, "compute", name, "D", -1, -1,
                                                   start, self.now, 0.0, math.inf)))
            chain = Chain(((op.name, op.phase, engine._comm_s(op, stage)),))
            self.chain_next(ds, chain, ds)
            if wait and chain.end_s is None:
                chain.waiter = ds
                yield _GATHER, None

    def record_paused(self, ds: DeviceState, act: Action, label: str, start_s: float) -> None:
        """Record a pass that ran from ``start_s`` to now in parts around its pauses for
        buckets' kernels (:attr:`DeviceState.pauses`), as :meth:`PassPricing._record_pass`
        does."""
        dev, records = ds.dev, self.records[ds.dev.id]
        duration_s = self.engine._block(dev, act).duration_s
        seg_start, seg_from = start_s, 0.0
        for share, paused, resumed in ds.pauses or ():
            records.append(new_record(Record, (dev.id, dev.stage, "compute", label, act.kind,
                                               act.microbatch, act.chunk, seg_start, paused,
                                               seg_from, share * duration_s)))
            seg_start, seg_from = resumed, share * duration_s
        if not ds.pauses or ds.pauses[-1][0] < 1.0:  # a pause at the very end leaves nothing
            records.append(new_record(Record, (dev.id, dev.stage, "compute", label, act.kind,
                                               act.microbatch, act.chunk, seg_start, self.now,
                                               seg_from, math.inf)))

    def ended_first(self, ds: DeviceState, chain: Chain) -> bool:
        """Whether SimPy ends ``chain`` before a pass reaching its part now, woken by an
        event of this instant (a message in, a send ended): the gather's last all-gather
        started earlier, so its timeout was scheduled earlier and runs first among the
        events of this instant (SimPy orders them by time, then priority, then when they
        were scheduled), and it succeeds the gather's event in the same step
        (:meth:`WeightGathers._gather`)."""
        if chain.end_s is not None:  # already ended in the loop, at this instant
            return chain.messages[-1][2] > 0
        op = ds.dp_queue[0] if ds.dp_queue else None
        return (op is not None and op.chain is chain and chain.next == len(chain.messages)
                and op.start_s < self.now and op.start_s + op.duration_s == self.now)

    def gathered_pass(self, ds: DeviceState, i: int, actions: list[Action], label: str,
                      woken: bool = False) -> Iterator[tuple[int, object]]:
        """Run action ``i``'s pass layer by layer, each part waiting for its gather, as
        :meth:`WeightGathers._gathered_pass` does; yields each part and wait to the loop.

        ``woken``: the walk reached the pass on an event of this instant (:meth:`ended_first`
        decides a first part's gather ending now); else such a tie goes to SimPy."""
        engine, dev, act = self.engine, ds.dev, actions[i]
        ahead, ahead_next = engine.prefetches(actions, i), engine.prefetches(actions, i + 1)
        key = (dev.id, act.chunk, engine._kind(act))
        prices = self.part_prices.get(key)
        if prices is None:
            units = engine._gathered_units(dev, act, engine._block(dev, act))
            prices = self.part_prices[key] = [PartPrices(engine, ds, act, j, units)
                                              for j in range(len(units))]
        chains, records = self.chains[dev.id], self.records[dev.id]
        device, stage, mb, chunk, kind = dev.id, dev.stage, act.microbatch, act.chunk, \
            act.kind
        last = len(prices) - 1
        seg_start, seg_from, offset = self.now, 0.0, 0.0
        for j, price in enumerate(prices):
            self.issue(ds, i, j)
            chain = chains[(i, j)]
            if (chain.end_s is None or chain.end_s >= self.now) and not (
                    woken and j == 0 and self.ended_first(ds, chain)):
                if chain.end_s is not None:
                    raise SameInstant(f"{label} on device {device} reaches part {j} as "
                                      "its gather ends")
                if self.now > seg_start:
                    records.append(new_record(Record, (device, stage, "compute", label, kind,
                                                       mb, chunk, seg_start, self.now,
                                                       seg_from, offset)))
                wait_start = self.now
                chain.waiter = ds
                yield _GATHER, None
                if self.now == wait_start:
                    raise SameInstant(f"{label} on device {device} reaches part {j} as "
                                      "its gather ends")
                self.dp_waits.append((device, wait_start, self.now))
                seg_start, seg_from = self.now, offset
            if j < last:
                if ahead:
                    self.issue(ds, i, j + 1)
            elif ahead_next:
                self.issue(ds, i + 1, 0)
            yield _PASS, (price, [])
            offset += price[0]
        records.append(new_record(Record, (device, stage, "compute", label, kind, mb, chunk,
                                           seg_start, self.now, seg_from, math.inf)))
