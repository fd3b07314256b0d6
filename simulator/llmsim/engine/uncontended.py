"""The tight loop: a step replayed without SimPy where nothing contends.

Where no device shares anything with another but its pipeline messages — one device per
stage (reduced fidelity: no group members to wait for), no posted sends holding compute
units, no data-parallel collective holding units beside the compute, no weight gathers
and no compute-stream kernels before the gradient reductions — every time in the step is
a sum and a maximum of priced durations: a pass starts when the pass before it ends and
its input message is in; a send or a collective starts when it is issued and the one
queued on its stream before it ends. :func:`replay` computes those times by walking each
device's actions in order, one plain generator per device that stops only where a
message it needs has not been sent yet, with the sums :class:`~llmsim.engine.Engine`'s
SimPy processes make (its timeouts add the same durations in the same order), so both
paths give the same trace (``tests/test_uncontended.py`` compares them over a grid of
schedules, layouts and overlap switches).

:func:`applies` says where the loop is exact; everywhere else, and for any schedule it
does not know (:data:`KNOWN_SCHEDULES`), the engine runs SimPy. The durations come from
the engine's priced blocks and its ``_comm_s``, the same as on the SimPy path.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterator
from operator import itemgetter
from typing import TYPE_CHECKING

from llmsim.engine.devices import Device, stage_devices
from llmsim.engine.uncontended_buckets import BucketTraffic
from llmsim.engine.uncontended_gathers import DeviceGathers, SameInstant, new_record
from llmsim.trace import Record, Trace

if TYPE_CHECKING:
    from llmsim.engine.replay import Engine

KNOWN_SCHEDULES = frozenset({"gpipe", "1f1b", "zb-h1", "interleaved-1f1b"})
"""Schedules whose replay :meth:`Engine._device` and this loop make the same way; a new
schedule runs on SimPy until it is added here and to the grid of the equality test."""

_start, _stream = itemgetter(7), itemgetter(2)
"""A record's start_s and stream: the trace's order within one device is by both."""

MessageKey = tuple[object, str, int, int]
"""(pipeline, direction "F"/"B", receiving virtual stage, micro-batch)."""


def applies(engine: Engine) -> bool:
    """Whether the step of ``engine`` can be replayed by :func:`replay`: a known schedule,
    every simulated device alone in its tensor- and data-parallel groups, nothing holding
    compute units, sends on each device's ``pp`` link priced in closed form (not posted on
    a pair's communicator) and no kernels before a gradient bucket's reduction (ZeRO's
    weight gathers on the ``dp`` stream are replayed, :mod:`.uncontended_gathers`)."""
    return not simpy_reason(engine)


def simpy_reason(engine: Engine, contended: bool = False) -> str:
    """Why the step of ``engine`` runs on SimPy, in a few words ("" where :func:`applies`);
    ``contended``: with posted pipeline operations, collectives holding compute units and
    kernels before a gradient bucket's reduction allowed (the contended loop's,
    :mod:`~llmsim.engine.contended`)."""
    work = engine.work
    if engine.schedule_name not in KNOWN_SCHEDULES:
        return f"schedule {engine.schedule_name or '?'} not in the tight loop"
    if not engine.tight_loop:
        return "per-stage cost models (a heterogeneous job)"
    if engine.pass_kinds:  # pass_durations reads the plain blocks
        return "overlapped forward-backward pairs (llmsim.engine.pairs)"
    if (engine.rendezvous and not contended) or not engine.closed_form_sends:
        return "pipeline sends posted on pairs' communicators"
    if any(d.dp_group[1] > 1 for d in engine.devices):
        return "data-parallel group members to wait for"
    if not all(engine.closed_form.values()) and not contended:
        return "data-parallel collectives holding compute units"
    if any(d.tp_group[1] > 1 for d in engine.devices):
        return "tensor-parallel group members to wait for"
    if any(c.variable for c in engine.contention.values()) and not contended:
        return "kernels holding compute units beside the passes"
    if engine.device_syncs_beside_gathers:
        return "device-wide host syncs beside weight gathers"
    if work.recompute_gather_at_call and work.regather_for_recompute:
        return "recompute gathers issued when reached"
    if work.gather_calls > 1:
        return "a gather per call of a layer"
    if work.unit_reductions and work.zero == 3:
        return "gradients reduced layer by layer in the backward"
    if work.embedding_grad_allreduce is not None and work.stages == 1:
        return "tied embeddings on one stage"
    if not contended and any(work.grad_sync_prep(first) for chunk in work.chunks.values()
                             for _, first in work.dp_grad_buckets(chunk)):
        return "kernels before the gradient buckets' reductions"
    return ""


class Stream:
    """A stream that runs one transfer at a time in the order queued: when it is free."""

    __slots__ = ("free_s",)

    def __init__(self) -> None:
        self.free_s = -math.inf

    def run(self, at_s: float, duration_s: float) -> tuple[float, float]:
        """Queue a transfer issued at ``at_s``: its (start, end)."""
        start_s = at_s if at_s > self.free_s else self.free_s
        self.free_s = start_s + duration_s
        return start_s, self.free_s


class _Replay(BucketTraffic):
    """The state of one tight-loop replay of ``engine``'s step."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.records: dict[int, list[Record]] = {d.id: [] for d in engine.devices}
        """Device → its records, in the order made (sorted by start once, at the end)."""
        self.pp_waits: list[tuple[int, float, float, float]] = []
        self.dp_waits: list[tuple[int, float, float]] = []
        self.arrival_s: dict[MessageKey, float] = {}
        self.sent_s: dict[MessageKey, float] = {}
        self.waiting: dict[MessageKey, tuple[Device, Iterator[MessageKey]]] = {}
        self.ready: deque[tuple[Device, Iterator[MessageKey]]] = deque()
        self.now_s: dict[int, float] = {}
        self.last_compute: dict[int, float] = {}
        self.dp_done: dict[int, float] = {}
        self.dp = {d.id: Stream() for d in engine.devices}
        self.gathers: dict[int, DeviceGathers] = {}
        """Device → its weight gathers (where the step has any)."""
        self.buckets: dict[tuple[int, int], tuple[list[str], list[float]]] = {}
        self.durations: dict[int, list[float]] = {}
        self.ready_s = 0.0
        """When every stage has its gradients: the optimizers start."""

    def device(self, dev: Device) -> Iterator[MessageKey]:
        """Walk ``dev``'s actions as :meth:`Engine._device` does, up to its gradients;
        yields the key of a message not yet sent, and goes on once it is."""
        engine, work = self.engine, self.engine.work
        p, m = work.stages, work.microbatches
        last_vs = p * work.chunks_per_stage - 1
        actions = engine.schedule[dev.stage]
        syncs = engine.grad_syncs.get(dev.stage)
        # the last micro-batch's backward launches the buckets (overlap_dp_comm's hooks):
        # its B pass where the backward is fused, its W pass where it is split
        hooked = (("W" if engine.split_backward else "B")
                  if engine.overlap_dp and work.zero != 3 and syncs is None else None)
        zero3 = work.zero == 3
        backward_step = engine.backward_step
        gather_s = engine.pp_gather_s
        overlap_pp, overlap_dp = engine.overlap_pp, engine.overlap_dp
        send_s = engine.pp_send_s
        device, stage, pipe = dev.id, dev.stage, dev.pipe
        virtual = [work.chunks[(stage, c)].virtual_stage for c in range(work.chunks_per_stage)]
        within: dict[int, bool] = {}
        link_free_s = -math.inf  # the pp link's Stream, its one field kept here
        inf = math.inf
        now = 0.0
        w_seen = [0] * work.chunks_per_stage
        carried: dict[tuple[int, int], list[tuple[float, str, float]]] = {}
        deferred: list[tuple[int, int]] = []
        grads_end = -math.inf
        records, pp_waits = self.records[dev.id], self.pp_waits
        arrival_s, sent_s, waiting, ready = self.arrival_s, self.sent_s, self.waiting, self.ready
        durations = self.pass_durations(stage, actions)
        gathers = None
        if not engine.hooks_closed_form:
            gathers = self.gathers[device] = DeviceGathers(engine, dev, actions,
                                                           self.dp[device], records,
                                                           self.dp_waits)
        if gathers is not None and engine.prefetches(actions, 0):
            gathers.prefetch(0, now)
        for i, act in enumerate(actions):
            engine.passes_started += 1
            kind, mb, chunk = act.kind, act.microbatch, act.chunk
            vs = virtual[chunk]
            need: MessageKey | None = None
            if kind == "F" and vs > 0:
                need = (pipe, "F", vs, mb)
            elif kind == "B" and vs < last_vs:
                need = (pipe, "B", vs, mb)
            woken = False  # whether a message that came in now woke the device (SimPy:
            # an event of this instant, after a gather ending now; DeviceGathers)
            if need is not None:
                if need not in arrival_s:
                    yield need
                arrival = arrival_s[need]
                if arrival > now:
                    pp_waits.append((device, now, arrival, sent_s[need]))
                    now, woken = arrival, True
            if gather_s:  # sliced messages: the received one, DeepSpeed's own output
                regather = work.pp_regather_output and kind == "B" and vs < last_vs
                count = int(need is not None) + int(regather)
                if count:
                    start, now, woken = now, now + count * gather_s, False
                    records.append(Record(device, stage, "pp", "pp_gather", "recv", mb, chunk,
                                          start, now))
                    pp_waits.append((device, start, now, start))
            label = f"{kind}{mb}c{chunk}" if chunk else f"{kind}{mb}"
            if gathers is not None and gathers.gathered(i):
                now = gathers.gathered_pass(i, now, label, woken)
            else:
                if gathers is not None and engine.prefetches(actions, i + 1):
                    gathers.prefetch(i + 1, now)
                duration_s = durations[i]
                start = now
                launches = carried.pop((chunk, mb), None) if kind == "W" and carried else None
                if kind == hooked and w_seen[chunk] + 1 == m:
                    launches = (launches or []) + self.bucket_marks(dev, actions, i, carried)
                if launches:
                    now, last_end = self.marked_pass(dev, now, duration_s, launches)
                    grads_end = max(grads_end, last_end)
                else:
                    now = now + duration_s
                records.append(new_record(Record, (device, stage, "compute", label, kind, mb,
                                                   chunk, start, now, 0.0, inf)))
            if syncs:
                for c in syncs.get(i, ()):
                    grads_end = max(grads_end, self.queue_buckets(dev, now, stage, c))
            to = -1
            if kind == "F" and vs < last_vs:
                key, to = (pipe, "F", vs + 1, mb), (vs + 1) % p
            elif vs > 0 and kind == backward_step:
                key, to = (pipe, "B", vs - 1, mb), (vs - 1) % p
            if to >= 0:
                near = within.get(to)
                if near is None:
                    near = within[to] = engine._within_node(dev, to)
                sent = now if now > link_free_s else link_free_s  # Stream.run, inlined
                end = link_free_s = sent + send_s[near]
                records.append(new_record(Record, (device, stage, "pp", "pp_send", key[1], mb,
                                                   chunk, sent, end, 0.0, inf)))
                sent_s[key], arrival_s[key] = sent, end  # the message is in: wake its receiver
                waiter = waiting.pop(key, None)
                if waiter is not None:
                    ready.append(waiter)
                if not overlap_pp:  # a blocking send: the stage waits for it
                    pp_waits.append((device, now, end, now))
                    now = end
            if kind == "W":
                w_seen[chunk] += 1
                if not overlap_dp:
                    deferred.append((chunk, w_seen[chunk]))
                elif zero3:  # ZeRO-3 reduce-scatters every micro-batch's gradients
                    grads_end = max(grads_end, self.queue_buckets(dev, now, stage, chunk))
        self.last_compute[dev.id] = now
        for c, count in deferred:  # without overlap: reduced after the last pass
            if count == m or zero3:
                grads_end = max(grads_end, self.queue_buckets(dev, now, stage, c))
        self.now_s[dev.id] = self.dp_done[dev.id] = max(now, grads_end)

    def pass_durations(self, stage: int, actions: list) -> list[float]:
        """Seconds each of a stage's actions takes alone on its device
        (:meth:`Engine._block`, the block kind worked out inline), listed once per stage."""
        if stage in self.durations:
            return self.durations[stage]
        blocks, accumulate_from = self.engine.blocks, self.engine.work.accumulate_from_microbatch
        out = self.durations[stage] = [blocks[(stage, act.chunk,
                        "w" if act.kind == "W" and act.microbatch < accumulate_from
                        else act.kind)].duration_s for act in actions]
        return out

    def run(self, progress: Callable[[float], None] | None, every_s: float) -> None:
        """Run every device's walk, each as far as its messages allow, until all end."""
        ready = self.ready
        ready.extend((d, self.device(d)) for d in self.engine.devices)
        total = max(sum(len(self.engine.schedule[d.stage]) for d in self.engine.devices), 1)
        reported = time.monotonic()
        while ready:
            dev, walk = ready.popleft()
            key = next(walk, None)
            if key is not None:
                if key in self.arrival_s:  # sent meanwhile
                    ready.append((dev, walk))
                else:
                    self.waiting[key] = (dev, walk)
            if progress is not None and time.monotonic() - reported >= every_s:
                progress(min(self.engine.passes_started / total, 1.0))
                reported = time.monotonic()
        if self.waiting:
            dev = next(iter(self.waiting.values()))[0]
            raise RuntimeError(f"the schedule deadlocks: device {dev.id} waits for a "
                               "message no stage sends")

    def finish(self) -> float:
        """The step's end: the tied embedding's exchange, the barrier before the
        optimizer, the optimizer and ZeRO-1/2's weight gathers, as :meth:`Engine._device`
        ends; returns the time the last device ends."""
        engine, work, records = self.engine, self.engine.work, self.records
        p, now = work.stages, self.now_s
        tied = work.embedding_grad_allreduce
        if tied is not None:
            ends: dict[object, list[Device]] = {}
            for d in engine.devices:
                if d.stage in (0, p - 1):
                    ends.setdefault(d.pipe, []).append(d)
            tied_s = engine.costs.comm_s(tied)
            for pair in ends.values():
                start = max(now[d.id] for d in pair)
                for d in pair:
                    now[d.id] = start + tied_s
                    records[d.id].append(Record(d.id, d.stage, "pp", tied.name, "O", -1,
                                                -1, start, now[d.id]))
        ready_s = self.ready_s = max(now.values())
        step_end = -math.inf
        for d in engine.devices:
            end = ready_s + engine.costs.compute_s(work.optimizer[d.stage])
            records[d.id].append(Record(d.id, d.stage, "compute", "optimizer", "O", -1,
                                        -1, ready_s, end))
            for gather in work.dp_param_gathers(d.stage):
                assert d.id not in self.gathers or self.gathers[d.id].pending is None
                start, end = self.dp[d.id].run(end, engine._comm_s(gather, d.stage))
                records[d.id].append(Record(d.id, d.stage, "dp", gather.name,
                                            gather.phase, -1, -1, start, end))
            step_end = max(step_end, end)
        return step_end


def replay(engine: Engine, progress: Callable[[float], None] | None = None,
           every_s: float = 5.0) -> Trace | None:
    """Replay ``engine``'s step in the tight loop (where :func:`applies`): the trace
    :meth:`Engine.run` makes with SimPy; None where a pass reaches a layer at the instant
    its weights arrive (:class:`SameInstant`: the step is SimPy's to order)."""
    state = _Replay(engine)
    try:
        state.run(progress, every_s)
    except SameInstant:
        engine.passes_started = 0
        return None
    return trace_of(state, state.finish())


def trace_of(state: _Replay, step_end: float,
             pp_slowed_s: dict[int, float] | None = None) -> Trace:
    """The trace of a replay ``state`` run and finished (its last device ending at
    ``step_end``); ``pp_slowed_s``: device → seconds its passes ran longer for posted
    pipeline operations (:attr:`Trace.pp_slowed_s`)."""
    engine = state.engine
    # The trace's order (device, start, stream; by_device_start_stream): each device's
    # records sorted apart, stably, as one sort of them all would order them.
    # Sorted by stream, then stably by start: the order of one sort by (start, stream),
    # with scalar keys (a third less time than a tuple key on a ZeRO-3 step's records).
    records: list[Record] = []
    for device in sorted(state.records):
        ordered = sorted(state.records[device], key=_stream)
        ordered.sort(key=_start)
        records += ordered
    by_stage = stage_devices(engine.devices)
    return Trace(
        records=records,
        blocks=engine.blocks,
        accumulate_from_microbatch=engine.work.accumulate_from_microbatch,
        stage_last_compute_s={s: max(state.last_compute[d] for d in ids)
                              for s, ids in by_stage.items()},
        stage_dp_done_s={s: max(state.dp_done[d] for d in ids) for s, ids in by_stage.items()},
        optimizer_start_s=state.ready_s,
        step_end_s=step_end,
        pp_waits=sorted(state.pp_waits, key=lambda w: w[1]),
        dp_waits=sorted(state.dp_waits, key=lambda w: w[1]),
        pp_slowed_s=pp_slowed_s or {},
        replicas=engine.replicas,
    )
