"""The contended loop: a step whose passes share compute units, replayed without SimPy.

Where pipeline sends and receives are posted one by one on each pair's communicator
(Megatron-LM's overlapped interleaved schedule, :attr:`Engine.rendezvous`) or where the
data-parallel collectives hold compute units (``node.collective_units``), a pass runs
slower while other work holds units (:class:`~llmsim.engine.streams.Contention`), so a
device's times depend on when its peers post and complete theirs: the tight loop
(:mod:`.uncontended`), which walks each device on its own, does not apply. Everything
else is as there when each device is alone in its tensor- and data-parallel groups.
ZeRO's weight gathers on the ``dp`` stream, and the kernels the compute stream runs on a
gradient bucket before its reduction (which pause the pass that launches it), are
replayed here too, with or without units held (:mod:`.contended_gathers`).

:func:`replay` runs such a step on one heap of times (a pass's segment end, a send's or
a collective's end, a wait's end) instead of SimPy's events, processes and conditions.
Each device walks its actions as :meth:`Engine._device` does, in a plain generator that
stops at each pass and wait. A pass advances by segments at the rate its held units
give, ``(target − done) · price(held)`` seconds to its next mark or its end, and a hold
or release during a segment ends it there (``done += elapsed / rate``) and starts the
next: the sums :meth:`Contention.run` makes. A posted operation holds its units from
when it reaches the head of its pair's stream; a send starts once its receive is posted
and releases both halves' units when it ends (:meth:`PipelineMessages._send`,
``_recv``); a collective holds the node's units while it runs on the ``dp`` stream
(:meth:`GradientTraffic._collective`). Work at one instant runs in an order SimPy may not
share, but every time here is a sum over segments whose lengths such an order does not
change (a hold at the instant a segment starts makes a segment of no length), so both
paths give the same trace (``tests/test_uncontended.py`` compares them over a grid).
Where the order of one instant does change a time — two processes queueing on one
``dp`` stream, or a pass reaching a layer as its gather ends — the loop gives the step
back to SimPy (:class:`~llmsim.engine.uncontended_gathers.SameInstant`).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterator
from heapq import heappop
from typing import TYPE_CHECKING

from llmsim.blocks import block_kind
from llmsim.engine import uncontended
from llmsim.engine.contended_gathers import _AT, _GATHER, _PASS, GatheredPasses
from llmsim.engine.contended_messages import _MESSAGE, _SENT, PostedMessages
from llmsim.engine.contended_units import DeviceState, Op, PassPrices, UnitHolders
from llmsim.engine.uncontended import MessageKey, _Replay
from llmsim.engine.uncontended_gathers import SameInstant, new_record
from llmsim.trace import Record, Trace

if TYPE_CHECKING:
    from llmsim.engine.replay import Engine

_DP = 4
"""What a device's walk yields: run a pass (``_PASS``); wait for a message (``_MESSAGE``),
for its own send's end (``_SENT``), for a time (``_AT``), for its ``dp`` stream to drain,
for a weight gather or a bucket (``_GATHER``)."""


def applies(engine: Engine) -> bool:
    """Whether the step of ``engine`` can be replayed by :func:`replay`: one the tight loop
    would take but for posted pipeline operations or collectives holding compute units
    (:func:`uncontended.simpy_reason` with those allowed), or for kernels the compute
    stream runs before a gradient bucket's reduction; weight gathers included
    (:mod:`.contended_gathers`)."""
    return (engine.rendezvous or bool(engine.collective_units) or any(
        engine._has_prep(chunk) for chunk in engine.work.chunks.values())) \
        and not uncontended.simpy_reason(engine, contended=True)


class _Contended(UnitHolders, PostedMessages, GatheredPasses, _Replay):
    """The state of one contended-loop replay of ``engine``'s step."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        self.heap: list[tuple[float, int, Callable, object, int]] = []
        self.seq = 0
        self.now = 0.0
        self.ready: deque[DeviceState] = deque()  # type: ignore[assignment]
        self.state = {d.id: DeviceState(d) for d in engine.devices}
        self.arrived: set[MessageKey] = set()
        self.sent: set[MessageKey] = set()
        self.message_start: dict[MessageKey, float] = {}
        self.waits: dict[tuple[int, MessageKey], DeviceState] = {}
        """(what is awaited, message) → the device waiting for it."""
        self.pair_streams: dict[tuple[int, int], deque[Op]] = {}
        self.recv_posted: set[MessageKey] = set()
        self.send_waiting: dict[MessageKey, Op] = {}
        """Message → its send, at the head of its stream, waiting for the receive."""
        self.receiving: dict[MessageKey, Op] = {}
        """Message → its posted receive, holding units until it is in."""
        self.prices: dict[tuple[int, int, str], PassPrices] = {}
        self.peers: dict[tuple[int, int], tuple[float, int]] = {}
        """(device, peer stage) → a send's seconds and a posted operation's units."""
        self.units = engine.collective_units
        self.preps = {(stage, op.name): prep for (stage, _), chunk in engine.work.chunks.items()
                      for op in engine._grad_ops(chunk) if (prep := engine._prep(op, stage))
                      } if engine.work.has_grad_sync_prep else {}
        """(stage, bucket name) → the kernels the compute stream runs on it first."""
        self.queued = bool(self.units) or not engine.hooks_closed_form or bool(self.preps)
        """Whether collectives join a ``dp`` queue one by one (they hold units, weight
        gathers share the stream, or buckets run kernels first), else buckets are queued
        in closed form."""
        self.setup_gathers()
        self.changed: list[DeviceState] = []
        """Devices whose pass's segment a change of units held ended at this instant."""


    def device_walk(self, ds: DeviceState) -> Iterator[tuple[int, object]]:
        """Walk ``ds``'s actions as :meth:`Engine._device` does, up to its gradients,
        yielding each pass and wait to :meth:`run`."""
        engine, work, dev = self.engine, self.engine.work, ds.dev
        last_vs = work.stages * work.chunks_per_stage - 1
        per_chunk = work.microbatches_per_chunk
        actions = engine.schedule[dev.stage]
        syncs = engine.grad_syncs.get(dev.stage)
        hooked = (("W" if engine.split_backward else "B")
                  if engine.overlap_dp and work.zero != 3 and syncs is None else None)
        zero3 = work.zero == 3
        backward_step, gather_s = engine.backward_step, engine.pp_gather_s
        rendezvous, overlap_pp, overlap_dp = engine.rendezvous, engine.overlap_pp, \
            engine.overlap_dp
        accumulate_from = work.accumulate_from_microbatch
        device, stage, pipe = dev.id, dev.stage, dev.pipe
        virtual = [work.chunks[(stage, c)].virtual_stage for c in range(work.chunks_per_stage)]
        records, pp_waits = self.records[device], self.pp_waits
        prices = self.prices
        w_seen = [0] * work.chunks_per_stage
        carried: dict[tuple[int, int], list[tuple[float, str, float]]] = {}
        deferred: list[tuple[int, int]] = []
        gathering = self.device_gathers(ds, actions)
        if gathering and engine.prefetches(actions, 0):
            self.issue(ds, 0, 0)
        posts = engine._recv_posts(dev, actions) if rendezvous else {}
        for key, peer in posts.get(-1, ()):
            self.receive(ds, key, peer)
        posted_sends: dict[str, MessageKey | None] = {"F": None, "B": None}
        # Whether the walk's last wait ended now, on a message in or a send ended: in SimPy
        # an event scheduled at this instant, after a gather ending now (GatheredPasses).
        woken = False
        for i, act in enumerate(actions):
            engine.passes_started += 1
            kind, mb, chunk = act.kind, act.microbatch, act.chunk
            vs = virtual[chunk]
            earlier = posted_sends.get(kind) if rendezvous else None
            if earlier is not None and earlier not in self.sent:
                wait_start = self.now
                yield _SENT, earlier
                woken = self.now > wait_start
                pp_waits.append((device, wait_start, self.now, wait_start))
            need: MessageKey | None = None
            if kind == "F" and vs > 0:
                need = (pipe, "F", vs, mb)
            elif kind == "B" and vs < last_vs:
                need = (pipe, "B", vs, mb)
            if need is not None and need not in self.arrived:
                wait_start = self.now
                yield _MESSAGE, need
                woken = self.now > wait_start
                pp_waits.append((device, wait_start, self.now,
                                 self.message_start.get(need, wait_start)))
            if gather_s:  # sliced messages: the received one, DeepSpeed's own output
                regather = work.pp_regather_output and kind == "B" and vs < last_vs
                count = int(need is not None) + int(regather)
                if count:
                    start = self.now
                    yield _AT, start + count * gather_s
                    woken = False
                    records.append(Record(device, stage, "pp", "pp_gather", "recv", mb, chunk,
                                          start, self.now))
                    pp_waits.append((device, start, self.now, start))
            label = f"{kind}{mb}c{chunk}" if chunk else f"{kind}{mb}"
            if gathering and self.gather_parts[device][i] is not None:
                yield from self.gathered_pass(ds, i, actions, label, woken)
            else:
                if gathering and engine.prefetches(actions, i + 1):
                    self.issue(ds, i + 1, 0)
                block = block_kind(kind, mb, accumulate_from)
                price = prices.get((stage, chunk, block))
                if price is None:
                    price = prices[(stage, chunk, block)] = PassPrices(engine, stage, chunk,
                                                                       block)
                marks = carried.pop((chunk, mb), []) if kind == "W" else []
                if kind == hooked and w_seen[chunk] + 1 == per_chunk:
                    marks += self.bucket_marks(dev, actions, i, carried)
                start = self.now
                yield _PASS, (price, marks)
                if ds.pauses:  # split around the pauses for buckets' kernels
                    self.record_paused(ds, act, label, start)
                else:
                    records.append(new_record(Record, (device, stage, "compute", label, kind,
                                                       mb, chunk, start, self.now, 0.0,
                                                       math.inf)))
            woken = False  # the pass's end, or a bucket's kernels' below: SimPy's order
            for c in syncs.get(i, ()) if syncs else ():
                if engine._has_prep(work.chunks[(stage, c)]):
                    yield from self.prepared(ds, c, wait=False)
                else:
                    self.queue_chunk(ds, c)
            recvs = posts.get(i, [])
            direction = "F" if kind == "F" else "B"
            first = [r for r in recvs if stage % 2 and r[0][1] == direction]
            for key, peer in first:
                self.receive(ds, key, peer)
            send: MessageKey | None = None
            if kind == "F" and vs < last_vs:
                send = (pipe, "F", vs + 1, mb)
            if vs > 0 and kind == backward_step:
                send = (pipe, "B", vs - 1, mb)
            if send is not None:
                self.send(ds, send, mb, chunk, work.stage_of(send[2], chunk))
            for key, peer in recvs:
                if (key, peer) not in first:
                    self.receive(ds, key, peer)
            if kind == "F":
                posted_sends["F"] = send
            elif kind == backward_step:
                posted_sends["B"] = send
            if send is not None and not overlap_pp:
                blocked = self.now
                if send not in self.sent:
                    yield _SENT, send
                    woken = self.now > blocked
                pp_waits.append((device, blocked, self.now, blocked))
            if kind == "W":
                w_seen[chunk] += 1
                if not overlap_dp:
                    deferred.append((chunk, w_seen[chunk]))
                elif zero3:  # ZeRO-3 reduce-scatters every micro-batch's gradients
                    self.queue_chunk(ds, chunk)
        self.last_compute[device] = self.now
        for c, count in deferred:  # without overlap: reduced after the last pass
            if count == per_chunk and engine._has_prep(work.chunks[(stage, c)]):
                yield from self.prepared(ds, c, wait=True)
            elif count == per_chunk or zero3:
                self.queue_chunk(ds, c)
        if ds.dp_queue:
            yield _DP, None
        self.now_s[device] = self.dp_done[device] = max(self.now, self.dp[device].free_s)

    def resume(self, ds: DeviceState) -> None:
        """Run ``ds``'s walk until it yields a pass or a wait, and set that up."""
        step = next(ds.walk, None)  # type: ignore[arg-type]
        if step is None:
            return
        what, arg = step
        if what == _PASS:
            self.start_pass(ds, *arg)  # type: ignore[misc]
        elif what == _AT:
            self.at(arg, self.woken, ds)  # type: ignore[arg-type]
        elif what == _DP:
            ds.drain_wait = True
        elif what != _GATHER:  # a gather wakes its waiter itself
            self.waits[(what, arg)] = ds  # type: ignore[index]

    def woken(self, ds: DeviceState, _: int) -> None:
        self.ready.append(ds)

    def run(self, progress: Callable[[float], None] | None, every_s: float) -> None:
        """Run the walks in time order until every one ends."""
        engine, heap, ready = self.engine, self.heap, self.ready
        self.links = {d.id: uncontended.Stream() for d in engine.devices}
        for ds in self.state.values():
            ds.walk = self.device_walk(ds)
            ready.append(ds)
        total = max(sum(len(engine.schedule[d.stage]) for d in engine.devices), 1)
        reported = time.monotonic()
        changed = self.changed
        while True:
            while ready or changed:
                while ready:
                    self.resume(ready.popleft())
                while changed:
                    self.advance(changed.pop())
            if not heap:
                break
            self.now, _, call, arg, generation = heappop(heap)
            call(arg, generation)
            if progress is not None and time.monotonic() - reported >= every_s:
                progress(min(engine.passes_started / total, 1.0))
                reported = time.monotonic()
        if len(self.now_s) < len(engine.devices):
            stuck = next(d for d in engine.devices if d.id not in self.now_s)
            raise RuntimeError(f"the schedule deadlocks: device {stuck.id} waits for a "
                               "message no stage sends")


def replay(engine: Engine, progress: Callable[[float], None] | None = None,
           every_s: float = 5.0) -> Trace | None:
    """Replay ``engine``'s step in the contended loop (where :func:`applies`): the trace
    :meth:`Engine.run` makes with SimPy; None where SimPy's order of two events at one
    instant would decide (:class:`SameInstant`, :mod:`.contended_gathers`)."""
    state = _Contended(engine)
    try:
        state.run(progress, every_s)
    except SameInstant:
        engine.passes_started = 0
        return None
    step_end = state.finish()
    slowed = {d: ds.slowed_s for d, ds in state.state.items() if ds.slowed_s}
    return uncontended.trace_of(state, step_end, slowed)
