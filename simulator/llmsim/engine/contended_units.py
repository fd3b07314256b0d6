"""The contended loop's compute units: passes run at the rate the units held beside them
leave, and the ``dp`` stream's collectives (:mod:`~llmsim.engine.contended`).

A pass advances by segments, ``(target − done) · price(held)`` seconds to its next bucket
mark or its end; a hold or release of units during a segment ends it there
(``done += elapsed / rate``), and once the instant's work is done the pass goes on at the
new rate: the sums :meth:`Contention.run` makes, its ``p2p_slowed_s`` share included. A
gradient bucket is queued on the ``dp`` stream in closed form where collectives hold no
units (:class:`BucketRun`), else it holds the node's units while it runs
(:meth:`GradientTraffic._collective`).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterator
from heapq import heappush
from typing import TYPE_CHECKING

from llmsim.engine.devices import Device
from llmsim.engine.uncontended_gathers import new_record
from llmsim.trace import Record

if TYPE_CHECKING:
    from llmsim.engine.replay import Engine
    from llmsim.engine.uncontended import MessageKey, Stream


class Op:
    """A posted send or receive on a pair's stream, or a collective on a ``dp`` stream."""

    __slots__ = ("chain", "chunk", "device", "duration_s", "key", "microbatch", "name", "peer",
                 "phase", "start_s", "units")

    def __init__(self, device: DeviceState, key: MessageKey | None, units: int,
                 duration_s: float, microbatch: int = -1, chunk: int = -1, peer: int = -1,
                 name: str = "", phase: str = "W", chain: object = None) -> None:
        self.device, self.key, self.units, self.duration_s = device, key, units, duration_s
        self.microbatch, self.chunk, self.peer, self.name = microbatch, chunk, peer, name
        """A send's micro-batch and chunk (−1: a receive); the peer stage of its pair's
        stream; a collective's name."""
        self.phase, self.chain = phase, chain
        """A collective's phase; the weight gather it is an all-gather of
        (:class:`~llmsim.engine.contended_gathers.Chain`; None: a gradient bucket)."""
        self.start_s = 0.0


class PassPrices(dict):
    """Units held → seconds one pass takes beside them (:meth:`Engine._priced`), each
    priced when first asked for."""

    __slots__ = ("engine", "key")

    def __init__(self, engine: Engine, stage: int, chunk: int, kind: str) -> None:
        super().__init__()
        self.engine, self.key = engine, (stage, chunk, kind)

    def __missing__(self, held: int) -> float:
        out = self[held] = self.engine._priced(*self.key, held).duration_s
        return out


class DeviceState:
    """One device's state in the loop: its walk, the units held on it and its pass."""

    __slots__ = ("active", "alone_s", "collective", "dev", "done", "dp_queue", "drain_wait",
                 "generation", "held", "marks", "next_mark", "pauses", "posted", "price",
                 "rate_s", "segment_s", "slowed_s", "target", "walk")

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
        self.dp_queue: deque[Op] = deque()
        self.drain_wait = False
        self.pauses: list[tuple[float, float, float]] | None = None
        """The pass's pauses for a bucket's kernels (share done, start, end; None: none)."""



class _Interlude:
    """A pass paused at a bucket mark while the compute stream runs the bucket's kernels
    (:meth:`Workload.grad_sync_prep`), one after the other, before its reduction."""

    __slots__ = ("bucket_s", "ds", "k", "kernels", "name", "paused_s", "share", "start_s")

    def __init__(self, ds: DeviceState, kernels: tuple[tuple[str, float], ...], name: str,
                 bucket_s: float, share: float, paused_s: float) -> None:
        self.ds, self.kernels, self.name, self.bucket_s = ds, kernels, name, bucket_s
        self.share, self.paused_s = share, paused_s
        self.k, self.start_s = 0, paused_s


class UnitHolders:
    """The passes and ``dp`` streams of a contended-loop replay: a part of its state
    (:class:`~llmsim.engine.contended._Contended`, below)."""

    engine: Engine
    records: dict[int, list[Record]]
    dp: dict[int, Stream]
    heap: list[tuple[float, int, Callable, object, int]]
    seq: int
    now: float
    ready: deque[DeviceState]
    changed: list[DeviceState]
    units: int
    queued: bool
    join: Callable[[DeviceState, Op, object], None]
    chain_end: Callable[[DeviceState, object], None]
    preps: dict[tuple[int, str], tuple[tuple[str, float], ...]]
    queue_buckets: Callable[[Device, float, int, int], float]
    bucket_list: Callable[[int, int], tuple[list[str], list[float]]]

    def at(self, time_s: float, call: Callable, arg: object, generation: int = 0) -> None:
        self.seq += 1
        heappush(self.heap, (time_s, self.seq, call, arg, generation))

    def hold(self, ds: DeviceState, collective: int, posted: int) -> None:
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

    def _slowed(self, ds: DeviceState, elapsed: float) -> None:
        """Count a segment's excess time to the posted operations' share of the units."""
        ds.active = False
        collective, posted = ds.held
        if posted and ds.rate_s > ds.alone_s:
            excess = elapsed * (1.0 - ds.alone_s / ds.rate_s)
            ds.slowed_s += excess * posted / (collective + posted)

    def advance(self, ds: DeviceState) -> None:
        """Fire the marks ``ds``'s pass has reached, then start its next segment, or end
        the pass and wake the walk (the loop of :meth:`Contention.run`)."""
        marks, done = ds.marks, ds.done
        while ds.next_mark < len(marks) and marks[ds.next_mark][0] <= done + 1e-12:
            share, name, bucket_s = marks[ds.next_mark]
            ds.next_mark += 1
            prep = self.preps.get((ds.dev.stage, name)) if self.preps else None
            if prep:  # the pass pauses while the compute stream runs the bucket's kernels
                self.kernel_start(_Interlude(ds, prep, name, bucket_s, min(share, 1.0),
                                             self.now))
                return
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

    def segment_end(self, ds: DeviceState, generation: int) -> None:
        if generation != ds.generation or not ds.active:
            return  # the segment was ended by a change of the units held
        ds.done = ds.target
        self._slowed(ds, self.now - ds.segment_s)
        self.advance(ds)

    def start_pass(self, ds: DeviceState, price: PassPrices,
                   marks: list[tuple[float, str, float]]) -> None:
        ds.price, ds.alone_s, ds.marks, ds.next_mark, ds.done = price, price[0], marks, 0, 0.0
        ds.pauses = None
        self.advance(ds)

    def kernel_start(self, it: _Interlude) -> None:
        it.start_s = self.now
        self.at(self.now + it.kernels[it.k][1], self.kernel_end, it)

    def kernel_end(self, it: _Interlude, _: int) -> None:
        """A bucket's kernel ended: the next starts, or the bucket is launched and the
        pass goes on (:meth:`GradientTraffic._prepared` inside :meth:`Contention.run`)."""
        ds = it.ds
        self.records[ds.dev.id].append(new_record(Record, (
            ds.dev.id, ds.dev.stage, "compute", it.kernels[it.k][0], "D", -1, -1, it.start_s,
            self.now, 0.0, math.inf)))
        it.k += 1
        if it.k < len(it.kernels):
            self.kernel_start(it)
            return
        self.launch(ds, it.name, it.bucket_s)
        if ds.pauses is None:
            ds.pauses = []
        ds.pauses.append((it.share, it.paused_s, self.now))
        self.advance(ds)

    def launch(self, ds: DeviceState, name: str, bucket_s: float) -> None:
        """Queue a gradient bucket on ``ds``'s ``dp`` stream now: in closed form where
        collectives hold no units and no weight gathers share the stream
        (:class:`BucketRun`), else as one that holds them (none, on a node whose
        collectives hold none)."""
        dev = ds.dev
        if not self.queued:
            stream = self.dp[dev.id]
            start = self.now if self.now > stream.free_s else stream.free_s
            stream.free_s = start + bucket_s
            self.records[dev.id].append(new_record(Record, (
                dev.id, dev.stage, "dp", name, "W", -1, -1, start, stream.free_s, 0.0,
                math.inf)))
            return
        self.join(ds, Op(ds, None, self.units, bucket_s, name=name), ds)

    def queue_chunk(self, ds: DeviceState, chunk: int) -> None:
        """Queue every gradient bucket of ``chunk`` now (:meth:`GradientTraffic._queue_all`)."""
        if not self.queued:
            self.queue_buckets(ds.dev, self.now, ds.dev.stage, chunk)
            return
        for name, bucket_s in zip(*self.bucket_list(ds.dev.stage, chunk), strict=True):
            self.launch(ds, name, bucket_s)

    def collective_start(self, ds: DeviceState) -> None:
        op = ds.dp_queue[0]
        op.start_s = self.now
        self.hold(ds, op.units, 0)
        self.at(self.now + op.duration_s, self.collective_end, ds)

    def collective_end(self, ds: DeviceState, _: int) -> None:
        op = ds.dp_queue.popleft()
        self.hold(ds, -op.units, 0)
        dev = ds.dev
        self.records[dev.id].append(new_record(Record, (
            dev.id, dev.stage, "dp", op.name, op.phase, -1, -1, op.start_s, self.now, 0.0,
            math.inf)))
        self.dp[dev.id].free_s = self.now
        if ds.dp_queue:
            self.collective_start(ds)
        if op.chain is not None:  # a weight gather's all-gather: its next, or its end
            self.chain_end(ds, op.chain)
        if not ds.dp_queue and ds.drain_wait:
            ds.drain_wait = False
            self.ready.append(ds)
