"""The contended loop: a step whose passes share compute units, replayed without SimPy.

Where pipeline sends and receives are posted one by one on each pair's communicator
(Megatron-LM's overlapped interleaved schedule, :attr:`Engine.rendezvous`) or where the
data-parallel collectives hold compute units (``node.collective_units``), a pass runs
slower while other work holds units (:class:`~llmsim.engine.streams.Contention`), so a
device's times depend on when its peers post and complete theirs: the tight loop
(:mod:`.uncontended`), which walks each device on its own, does not apply. Everything
else is as there when each device is alone in its tensor- and data-parallel groups, no
weight gathers share the ``dp`` stream and no kernels run before a gradient reduction.

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
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterator
from heapq import heappop, heappush
from typing import TYPE_CHECKING

from llmsim.blocks import block_kind
from llmsim.engine import uncontended
from llmsim.engine.devices import Device
from llmsim.engine.uncontended import MessageKey, _Replay
from llmsim.engine.uncontended_gathers import new_record
from llmsim.trace import Record, Trace

if TYPE_CHECKING:
    from llmsim.engine.replay import Engine

_PASS, _MESSAGE, _SENT, _AT, _DP = range(5)
"""What a device's walk yields: run a pass; wait for a message, for its own send's end,
for a time, for its ``dp`` stream to drain."""


def applies(engine: Engine) -> bool:
    """Whether the step of ``engine`` can be replayed by :func:`replay`: one the tight loop
    would take but for posted pipeline operations or collectives holding compute units
    (:func:`uncontended.simpy_reason` with those allowed), with no weight gathers."""
    return (engine.rendezvous or bool(engine.collective_units)) \
        and engine.hooks_closed_form and not uncontended.simpy_reason(engine, contended=True)


class _Op:
    """A posted send or receive on a pair's stream, or a collective on a ``dp`` stream."""

    __slots__ = ("chunk", "device", "duration_s", "key", "microbatch", "name", "peer",
                 "start_s", "units")

    def __init__(self, device: _Device, key: MessageKey | None, units: int,
                 duration_s: float, microbatch: int = -1, chunk: int = -1, peer: int = -1,
                 name: str = "") -> None:
        self.device, self.key, self.units, self.duration_s = device, key, units, duration_s
        self.microbatch, self.chunk, self.peer, self.name = microbatch, chunk, peer, name
        """A send's micro-batch and chunk (−1: a receive); the peer stage of its pair's
        stream; a collective's name."""
        self.start_s = 0.0


class _PassPrices(dict):
    """Units held → seconds one pass takes beside them (:meth:`Engine._priced`), each
    priced when first asked for."""

    __slots__ = ("engine", "key")

    def __init__(self, engine: Engine, stage: int, chunk: int, kind: str) -> None:
        super().__init__()
        self.engine, self.key = engine, (stage, chunk, kind)

    def __missing__(self, held: int) -> float:
        out = self[held] = self.engine._priced(*self.key, held).duration_s
        return out


class _Device:
    """One device's state in the loop: its walk, the units held on it and its pass."""

    __slots__ = ("active", "alone_s", "collective", "dev", "done", "dp_queue", "drain_wait",
                 "generation", "held", "marks", "next_mark", "posted", "price", "rate_s",
                 "segment_s", "slowed_s", "target", "walk")

    def __init__(self, dev: Device) -> None:
        self.dev = dev
        self.walk: Iterator[tuple[int, object]] | None = None
        self.collective = self.posted = 0
        """Compute units held by collectives and by posted pipeline operations."""
        self.slowed_s = 0.0
        """Seconds the passes ran longer for the posted operations' units
        (:attr:`Contention.p2p_slowed_s`)."""
        self.price: dict[int, float] = {}
        self.alone_s = 0.0
        self.marks: list[tuple[float, str, float]] = []
        self.next_mark = 0
        self.done = self.target = self.rate_s = self.segment_s = 0.0
        self.held = (0, 0)
        """(collective, posted) units the segment under way runs beside."""
        self.active = False
        """Whether a pass's segment is under way (ending at a scheduled time)."""
        self.generation = 0
        """Counts segments: a segment end scheduled before the last change is stale."""
        self.dp_queue: deque[_Op] = deque()
        self.drain_wait = False


class _Contended(_Replay):
    """The state of one contended-loop replay of ``engine``'s step."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        self.heap: list[tuple[float, int, Callable, object, int]] = []
        self.seq = 0
        self.now = 0.0
        self.ready: deque[_Device] = deque()  # type: ignore[assignment]
        self.state = {d.id: _Device(d) for d in engine.devices}
        self.arrived: set[MessageKey] = set()
        self.sent: set[MessageKey] = set()
        self.message_start: dict[MessageKey, float] = {}
        self.waits: dict[tuple[int, MessageKey], _Device] = {}
        """(what is awaited, message) → the device waiting for it."""
        self.pair_streams: dict[tuple[int, int], deque[_Op]] = {}
        self.recv_posted: set[MessageKey] = set()
        self.send_waiting: dict[MessageKey, _Op] = {}
        """Message → its send, at the head of its stream, waiting for the receive."""
        self.receiving: dict[MessageKey, _Op] = {}
        """Message → its posted receive, holding units until it is in."""
        self.prices: dict[tuple[int, int, str], _PassPrices] = {}
        self.peers: dict[tuple[int, int], tuple[float, int]] = {}
        """(device, peer stage) → a send's seconds and a posted operation's units."""
        self.units = engine.collective_units
        self.changed: list[_Device] = []
        """Devices whose pass's segment a change of units held ended at this instant."""

    def at(self, time_s: float, call: Callable, arg: object, generation: int = 0) -> None:
        self.seq += 1
        heappush(self.heap, (time_s, self.seq, call, arg, generation))

    # --- compute units and passes -----------------------------------------------------

    def hold(self, ds: _Device, collective: int, posted: int) -> None:
        """Take (positive) or give back units on ``ds`` now: the segment under way ends
        here, and the pass goes on at the rate of the units held once this instant's
        work is done (:meth:`run`; SimPy's pass resumes once, after the change event,
        :meth:`Contention.hold`)."""
        if not collective and not posted:
            return
        if ds.active:
            elapsed = self.now - ds.segment_s
            ds.done = ds.done + elapsed / ds.rate_s
            self._slowed(ds, elapsed)
            self.changed.append(ds)
        ds.collective += collective
        ds.posted += posted

    def _slowed(self, ds: _Device, elapsed: float) -> None:
        """Count a segment's excess time to the posted operations' share of the units."""
        ds.active = False
        collective, posted = ds.held
        if posted and ds.rate_s > ds.alone_s:
            excess = elapsed * (1.0 - ds.alone_s / ds.rate_s)
            ds.slowed_s += excess * posted / (collective + posted)

    def advance(self, ds: _Device) -> None:
        """Fire the marks ``ds``'s pass has reached, then start its next segment, or end
        the pass and wake the walk (the loop of :meth:`Contention.run`)."""
        marks, done = ds.marks, ds.done
        while ds.next_mark < len(marks) and marks[ds.next_mark][0] <= done + 1e-12:
            _, name, bucket_s = marks[ds.next_mark]
            ds.next_mark += 1
            self.launch(ds, name, bucket_s)
        if done >= 1.0 - 1e-12:
            self.ready.append(ds)
            return
        target = ds.target = marks[ds.next_mark][0] if ds.next_mark < len(marks) else 1.0
        held = ds.held = (ds.collective, ds.posted)
        rate_s = ds.rate_s = ds.price[held[0] + held[1]]
        ds.segment_s, ds.active = self.now, True
        ds.generation += 1
        self.at(self.now + (target - done) * rate_s, self.segment_end, ds, ds.generation)

    def segment_end(self, ds: _Device, generation: int) -> None:
        if generation != ds.generation or not ds.active:
            return  # the segment was ended by a change of the units held
        ds.done = ds.target
        self._slowed(ds, self.now - ds.segment_s)
        self.advance(ds)

    def start_pass(self, ds: _Device, price: _PassPrices,
                   marks: list[tuple[float, str, float]]) -> None:
        ds.price, ds.alone_s, ds.marks, ds.next_mark, ds.done = price, price[0], marks, 0, 0.0
        self.advance(ds)

    def peer(self, dev: Device, stage: int) -> tuple[float, int]:
        """A send's seconds from ``dev`` to its pipeline's ``stage`` and the units a posted
        operation with that peer holds (:meth:`PipelineMessages._send_s`, ``p2p_units``)."""
        key = (dev.id, stage)
        known = self.peers.get(key)
        if known is None:
            engine = self.engine
            within = engine._within_node(dev, stage)
            known = self.peers[key] = (engine._send_s(dev.stage, stage, within),
                                       engine.p2p_units[within])
        return known

    # --- the dp stream --------------------------------------------------------------

    def launch(self, ds: _Device, name: str, bucket_s: float) -> None:
        """Queue a gradient bucket on ``ds``'s ``dp`` stream now: in closed form where
        collectives hold no units (:class:`BucketRun`), else as one that holds them."""
        dev = ds.dev
        if not self.units:
            stream = self.dp[dev.id]
            start = self.now if self.now > stream.free_s else stream.free_s
            stream.free_s = start + bucket_s
            self.records[dev.id].append(new_record(Record, (
                dev.id, dev.stage, "dp", name, "W", -1, -1, start, stream.free_s, 0.0,
                math.inf)))
            return
        ds.dp_queue.append(_Op(ds, None, self.units, bucket_s, name=name))
        if len(ds.dp_queue) == 1:
            self.collective_start(ds)

    def queue_chunk(self, ds: _Device, chunk: int) -> None:
        """Queue every gradient bucket of ``chunk`` now (:meth:`GradientTraffic._queue_all`)."""
        if not self.units:
            self.queue_buckets(ds.dev, self.now, ds.dev.stage, chunk)
            return
        for name, bucket_s in zip(*self.bucket_list(ds.dev.stage, chunk), strict=True):
            self.launch(ds, name, bucket_s)

    def collective_start(self, ds: _Device) -> None:
        op = ds.dp_queue[0]
        op.start_s = self.now
        self.hold(ds, op.units, 0)
        self.at(self.now + op.duration_s, self.collective_end, ds)

    def collective_end(self, ds: _Device, _: int) -> None:
        op = ds.dp_queue.popleft()
        self.hold(ds, -op.units, 0)
        dev = ds.dev
        self.records[dev.id].append(new_record(Record, (
            dev.id, dev.stage, "dp", op.name, "W", -1, -1, op.start_s, self.now, 0.0,
            math.inf)))
        self.dp[dev.id].free_s = self.now
        if ds.dp_queue:
            self.collective_start(ds)
        elif ds.drain_wait:
            ds.drain_wait = False
            self.ready.append(ds)

    # --- pipeline messages ------------------------------------------------------------

    def post(self, ds: _Device, peer_stage: int, op: _Op) -> None:
        """Queue a posted send or receive on the stream of ``ds``'s pair with ``peer_stage``."""
        key = (ds.dev.id, peer_stage)
        stream = self.pair_streams.get(key)
        if stream is None:
            stream = self.pair_streams[key] = deque()
        stream.append(op)
        if len(stream) == 1:
            self.op_start(op)

    def op_start(self, op: _Op) -> None:
        """An operation reaches the head of its stream: it holds its units; a receive is
        posted (its send may start), a send starts once its receive is."""
        self.hold(op.device, 0, op.units)
        key = op.key
        if op.microbatch < 0:  # a receive
            self.recv_posted.add(key)
            self.receiving[key] = op
            send = self.send_waiting.pop(key, None)
            if send is not None:
                self.transfer(send)
        elif key in self.recv_posted:
            self.transfer(op)
        else:
            self.send_waiting[key] = op

    def transfer(self, op: _Op) -> None:
        op.start_s = self.message_start[op.key] = self.now
        self.at(self.now + op.duration_s, self.send_end, op)

    def _next_on(self, stream_key: tuple[int, int]) -> None:
        stream = self.pair_streams[stream_key]
        stream.popleft()
        if stream:
            self.op_start(stream[0])

    def send_end(self, op: _Op, _: int) -> None:
        """A posted send ends: both halves give back their units, the next operations
        of both streams start, and the message is in."""
        ds, key = op.device, op.key
        dev = ds.dev
        self.records[dev.id].append(new_record(Record, (
            dev.id, dev.stage, "pp", "pp_send", key[1], op.microbatch, op.chunk, op.start_s,
            self.now, 0.0, math.inf)))
        self.hold(ds, 0, -op.units)
        self._next_on((dev.id, op.peer))
        recv = self.receiving.pop(key)
        self.hold(recv.device, 0, -recv.units)
        self._next_on((recv.device.dev.id, recv.peer))
        self.delivered(key)

    def delivered(self, key: MessageKey, _: int = 0) -> None:
        """Message ``key`` is in (and its send ended): wake who waits for either."""
        self.arrived.add(key)
        self.sent.add(key)
        for what in (_MESSAGE, _SENT):
            waiter = self.waits.pop((what, key), None)
            if waiter is not None:
                self.ready.append(waiter)

    def send(self, ds: _Device, key: MessageKey, mb: int, chunk: int, to_stage: int) -> None:
        """Send message ``key`` to ``to_stage`` now (:meth:`PipelineMessages._post_send`)."""
        dev = ds.dev
        send_s, units = self.peer(dev, to_stage)
        if self.engine.rendezvous:
            self.post(ds, to_stage, _Op(ds, key, units, send_s, mb, chunk, to_stage))
            return
        start, end = self.links[dev.id].run(self.now, send_s)
        self.message_start[key] = start
        self.records[dev.id].append(new_record(Record, (
            dev.id, dev.stage, "pp", "pp_send", key[1], mb, chunk, start, end, 0.0,
            math.inf)))
        self.at(end, self.delivered, key)

    def receive(self, ds: _Device, key: MessageKey, from_stage: int) -> None:
        """Post the receive of message ``key`` from ``from_stage`` (:meth:`_recv`)."""
        self.post(ds, from_stage, _Op(ds, key, self.peer(ds.dev, from_stage)[1], 0.0,
                                      peer=from_stage))

    # --- the walks --------------------------------------------------------------------

    def device_walk(self, ds: _Device) -> Iterator[tuple[int, object]]:
        """Walk ``ds``'s actions as :meth:`Engine._device` does, up to its gradients,
        yielding each pass and wait to :meth:`run`."""
        engine, work, dev = self.engine, self.engine.work, ds.dev
        last_vs = work.stages * work.chunks_per_stage - 1
        per_chunk = work.microbatches_per_chunk
        actions = engine.schedule[dev.stage]
        syncs = engine.grad_syncs.get(dev.stage)
        hooked = (("W" if engine.split_backward else "B")
                  if engine.overlap_dp and work.zero != 3 and syncs is None else None)
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
        posts = engine._recv_posts(dev, actions) if rendezvous else {}
        for key, peer in posts.get(-1, ()):
            self.receive(ds, key, peer)
        posted_sends: dict[str, MessageKey | None] = {"F": None, "B": None}
        for i, act in enumerate(actions):
            engine.passes_started += 1
            kind, mb, chunk = act.kind, act.microbatch, act.chunk
            vs = virtual[chunk]
            earlier = posted_sends.get(kind) if rendezvous else None
            if earlier is not None and earlier not in self.sent:
                wait_start = self.now
                yield _SENT, earlier
                pp_waits.append((device, wait_start, self.now, wait_start))
            need: MessageKey | None = None
            if kind == "F" and vs > 0:
                need = (pipe, "F", vs, mb)
            elif kind == "B" and vs < last_vs:
                need = (pipe, "B", vs, mb)
            if need is not None and need not in self.arrived:
                wait_start = self.now
                yield _MESSAGE, need
                pp_waits.append((device, wait_start, self.now,
                                 self.message_start.get(need, wait_start)))
            if gather_s:  # sliced messages: the received one, DeepSpeed's own output
                regather = work.pp_regather_output and kind == "B" and vs < last_vs
                count = int(need is not None) + int(regather)
                if count:
                    start = self.now
                    yield _AT, start + count * gather_s
                    records.append(Record(device, stage, "pp", "pp_gather", "recv", mb, chunk,
                                          start, self.now))
                    pp_waits.append((device, start, self.now, start))
            block = block_kind(kind, mb, accumulate_from)
            price = prices.get((stage, chunk, block))
            if price is None:
                price = prices[(stage, chunk, block)] = _PassPrices(engine, stage, chunk, block)
            marks = carried.pop((chunk, mb), []) if kind == "W" else []
            if kind == hooked and w_seen[chunk] + 1 == per_chunk:
                marks += self.bucket_marks(dev, actions, i, carried)
            start = self.now
            yield _PASS, (price, marks)
            records.append(new_record(Record, (
                device, stage, "compute", f"{kind}{mb}c{chunk}" if chunk else f"{kind}{mb}",
                kind, mb, chunk, start, self.now, 0.0, math.inf)))
            for c in syncs.get(i, ()) if syncs else ():
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
                pp_waits.append((device, blocked, self.now, blocked))
            if kind == "W":
                w_seen[chunk] += 1
                if not overlap_dp:
                    deferred.append((chunk, w_seen[chunk]))
        self.last_compute[device] = self.now
        for c, count in deferred:  # without overlap: reduced after the last pass
            if count == per_chunk:
                self.queue_chunk(ds, c)
        if ds.dp_queue:
            yield _DP, None
        self.now_s[device] = self.dp_done[device] = max(self.now, self.dp[device].free_s)

    def resume(self, ds: _Device) -> None:
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
        else:
            self.waits[(what, arg)] = ds  # type: ignore[index]

    def woken(self, ds: _Device, _: int) -> None:
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
           every_s: float = 5.0) -> Trace:
    """Replay ``engine``'s step in the contended loop (where :func:`applies`): the trace
    :meth:`Engine.run` makes with SimPy."""
    state = _Contended(engine)
    state.run(progress, every_s)
    step_end = state.finish()
    slowed = {d: ds.slowed_s for d, ds in state.state.items() if ds.slowed_s}
    return uncontended.trace_of(state, step_end, slowed)
