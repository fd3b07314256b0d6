"""Gradient traffic: the data-parallel reductions of the gradient buckets.

Each bucket is queued on its device's ``dp`` stream when the backward makes it final (a
mark inside the pass, the bucket hooks of PyTorch DDP and Megatron-LM), after the last
pass, or where Megatron-Core's pipelined schedules launch them. A run of buckets queued
together on a device where nothing waits for group members or holds compute units is
priced in closed form, in one process (:meth:`GradientTraffic._closed_form_run`); elsewhere
each bucket is one process (:meth:`GradientTraffic._collective`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial

import simpy

from llmsim.blocks import Block, CostModel
from llmsim.engine.devices import Device
from llmsim.engine.streams import Barrier, Contention, Fifo, Mark, timeout_until
from llmsim.ops import CommOp
from llmsim.schedules import Action
from llmsim.trace import Record
from llmsim.workload import Chunk, Workload


class BucketRun:
    """The gradient buckets one pass's marks launch, priced in closed form as each is
    launched: it starts when it is launched and the bucket before it has ended, and takes
    its priced time — the sums :meth:`GradientTraffic._collective` makes with a process,
    a timeout and two events per bucket. When the last is launched, one event at its end
    stands for the run on the ``dp`` stream and in the device's pending reductions.

    Valid where nothing else queues on the stream while the run is open
    (:attr:`Engine.hooks_closed_form`; checked by :meth:`GradientTraffic._collective`)
    and the stream is free or ends a run like this one when the pass starts
    (:meth:`GradientTraffic._may_run_in_closed_form`).
    """

    def __init__(self, engine: GradientTraffic, dev: Device, buckets: int,
                 grad_ops: list[simpy.Process]) -> None:
        self.engine, self.dev, self.left, self.grad_ops = engine, dev, buckets, grad_ops
        engine.open_runs[dev.id] = engine.open_runs.get(dev.id, 0) + 1

    def launch(self, op: CommOp, at_s: float) -> None:
        """Launch bucket ``op`` at ``at_s`` (now, or later in a pass priced ahead)."""
        engine, dev = self.engine, self.dev
        start_s = max(at_s, engine.dp_free_s.get(dev.id, -math.inf))
        end_s = engine.dp_free_s[dev.id] = start_s + engine._comm_s(op, dev.stage)
        engine.records.append(Record(dev.id, dev.stage, "dp", op.name, op.phase, -1, -1,
                                     start_s, end_s))
        self.left -= 1
        if self.left == 0:  # the run's end, on the stream and for the device to wait for
            ended = engine.dp_stream[dev.id].last = engine.dp_run_end[dev.id] = \
                engine.env.event()
            timeout_until(engine.env, end_s).callbacks.append(lambda _: ended.succeed())
            self.grad_ops.append(ended)
            engine.open_runs[dev.id] -= 1


@dataclass(frozen=True)
class Launch:
    """A mark's call that launches gradient bucket ``op`` into a :class:`BucketRun`."""

    run: BucketRun
    op: CommOp

    def __call__(self) -> None:
        self.run.launch(self.op, self.run.engine.env.now)


class GradientTraffic:
    """The :class:`~llmsim.engine.Engine`'s data-parallel collectives: a part of the
    engine, on the state :meth:`Engine.__init__` sets up (below) and the engine's
    ``_block``."""

    env: simpy.Environment
    work: Workload
    costs: CostModel
    records: list[Record]
    barrier: Barrier
    dp_stream: dict[int, Fifo]
    contention: dict[int, Contention]
    split_backward: bool
    collective_units: int
    bucket_ops: dict[tuple[int, int], list[CommOp]]
    prep_s: dict[tuple[int, int], tuple[CommOp, tuple[tuple[str, float], ...]]]
    closed_form: dict[int, bool]
    hooks_closed_form: bool
    dp_closed_until: dict[int, float]
    open_runs: dict[int, int]
    dp_free_s: dict[int, float]
    dp_run_end: dict[int, simpy.Event]
    comm_s_of: dict[tuple[int, int], tuple[CommOp, float]]
    stage_costs: list[CostModel]
    durations_of: dict[tuple[int, int], tuple[list[CommOp], list[float]]]
    chunk_has_prep: dict[tuple[int, int], bool]

    def _comm_s(self, op: CommOp, stage: int) -> float:
        """Seconds ``op`` takes on ``stage``'s devices, priced once per op object and stage
        (the engine builds each chunk's buckets and gathers once; the cost model prices
        equal collectives once)."""
        priced = self.comm_s_of.get((id(op), stage))
        if priced is None or priced[0] is not op:
            priced = self.comm_s_of[(id(op), stage)] = (
                op, self.stage_costs[stage].comm_s(op))
        return priced[1]

    def _closed_form_pass(self, dev: Device, block: Block, marks: list[Mark],
                          grad_ops: list[simpy.Process]) -> Iterator[simpy.Event]:
        """Run a pass alone on its device whose marks launch gradient buckets
        (:class:`Launch`): one timeout to its end, and the buckets one closed-form run
        (:meth:`_closed_form_run`) at the times the marks would have fired."""
        ordered = sorted(marks, key=lambda mark: mark[0])
        times, end_s = self.contention[dev.id].mark_times(
            block.duration_s, [share for share, _ in ordered])
        for at_s, (_, call) in zip(times, ordered, strict=True):
            call.run.launch(call.op, at_s)
        yield timeout_until(self.env, end_s)
        return []

    def _may_run_in_closed_form(self, dev: Device, chunk: Chunk) -> bool:
        """Whether the buckets ``chunk``'s backward launches on ``dev`` may be
        :class:`BucketRun` s: collectives priced in closed form there, no weight gathers
        on the stream, no kernels before the reductions, and the stream free or ending such
        a run (whose end :attr:`dp_free_s` holds)."""
        last = self.dp_stream[dev.id].last
        return (self.closed_form[dev.id] and self.hooks_closed_form
                and not self._has_prep(chunk)
                and (last is None or last.triggered or last is self.dp_run_end.get(dev.id)))

    def _durations(self, ops: list[CommOp], stage: int) -> list[float]:
        """Seconds each of ``ops`` takes on ``stage`` (:meth:`_comm_s`), listed once per
        list of ops and stage."""
        key = (id(ops), stage)
        priced = self.durations_of.get(key)
        if priced is None or priced[0] is not ops:  # kept with it: its id is not reused
            priced = self.durations_of[key] = (ops, [self._comm_s(op, stage) for op in ops])
        return priced[1]

    def _closed_form_run(self, dev: Device, launches: list[tuple[float, CommOp]],
                         durations: list[float] | None = None) -> Iterator[simpy.Event]:
        """Collectives launched at known times (non-decreasing) onto ``dev``'s ``dp``
        stream, in one process: each starts when it is launched and the one before it has
        ended, and takes its priced time (``durations``, else :meth:`_comm_s`), the sums
        :meth:`_collective` makes with one process and timeout each. Valid where
        :attr:`closed_form` holds and nothing else queues on the stream between the first
        launch and the last (checked there)."""
        env = self.env
        if launches[0][0] > env.now:
            yield timeout_until(env, launches[0][0])
        before, ended = self.dp_stream[dev.id].queue()
        if before is not None:
            yield before
        self.dp_closed_until[dev.id] = launches[-1][0]
        end_s = env.now
        if durations is None:
            durations = [self._comm_s(op, dev.stage) for _, op in launches]
        append, device, stage = self.records.append, dev.id, dev.stage
        for (at_s, op), duration_s in zip(launches, durations, strict=True):
            start_s = at_s if at_s > end_s else end_s
            end_s = start_s + duration_s
            append(Record(device, stage, "dp", op.name, op.phase, -1, -1, start_s, end_s))
        yield timeout_until(env, end_s)
        ended.succeed()

    def _collective(self, dev: Device, op: CommOp, done: simpy.Event | None = None,
                    tag: object = None) -> Iterator[simpy.Event]:
        if self.open_runs.get(dev.id) or self.env.now < self.dp_closed_until.get(dev.id,
                                                                                  -math.inf):
            raise RuntimeError(f"{op.name} queued on device {dev.id}'s dp stream among "
                               "gradient buckets priced in closed form; the engine's "
                               "hooks_closed_form condition is wrong")
        before, ended = self.dp_stream[dev.id].queue()
        if before is not None:
            yield before
        key, members = dev.dp_group
        if members > 1:  # fidelity "full": wait for the group's other members
            yield self.barrier.arrive((key, op.name, tag), members)
        start = self.env.now
        self.contention[dev.id].hold(collective=self.collective_units)
        yield self.env.timeout(self._comm_s(op, dev.stage))
        self.contention[dev.id].hold(collective=-self.collective_units)
        self.records.append(Record(dev.id, dev.stage, "dp", op.name, op.phase, -1, -1,
                                   start, self.env.now))
        ended.succeed()
        if done is not None:
            done.succeed()

    def _bucket_marks(self, dev: Device, actions: list[Action], i: int, chunk: Chunk,
                      grad_ops: list[simpy.Process],
                      carried: dict[tuple[int, int], list[Mark]]) -> list[Mark]:
        """Launch each gradient bucket of ``chunk`` as the last micro-batch's backward
        makes it final (``overlap_dp_comm``; Megatron-LM's and PyTorch DDP's bucket hooks).

        The backward walks the chunk's parameters from the last layer's to the first at an
        even rate, so bucket k of n (the last layers' first) is final after (k+1)/n of it.
        A fused backward (autograd) computes each layer's input and weight gradients
        together, so the share is of the B and W passes together, which the schedule runs
        back to back; a split one (Zero Bubble) makes weight gradients in its W pass only.
        Returns the marks of pass ``actions[i]``; those of the W pass that follows a fused
        B go to ``carried``.
        """
        act = actions[i]
        ops = self._grad_ops(chunk)
        if not ops or act.kind != ("W" if self.split_backward else "B"):
            return []
        own_s, next_s = self._block(dev, act).duration_s, 0.0
        if act.kind == "B":  # fused: the W pass of the same micro-batch follows
            w = actions[i + 1]
            assert (w.kind, w.chunk, w.microbatch) == ("W", act.chunk, act.microbatch)
            next_s = self._block(dev, w).duration_s
        own: list[Mark] = []
        later: list[Mark] = []
        closed = self._may_run_in_closed_form(dev, chunk)
        ats = [(k + 1) / len(ops) * (own_s + next_s) for k in range(len(ops))]
        runs: dict[bool, BucketRun | None] = {}
        if closed:  # one run for this pass's buckets, one for the next pass's
            mine = sum(at <= own_s or next_s == 0 for at in ats)
            runs = {True: BucketRun(self, dev, mine, grad_ops) if mine else None,
                    False: BucketRun(self, dev, len(ops) - mine, grad_ops)
                    if len(ops) > mine else None}
        for at, op in zip(ats, ops, strict=True):
            here = at <= own_s or next_s == 0
            call = Launch(runs[here], op) if closed else partial(self._launch, dev, op, grad_ops)
            if here:
                own.append((at / own_s if own_s > 0 else 1.0, call))
            else:
                later.append(((at - own_s) / next_s, call))
        if later:
            carried.setdefault((act.chunk, act.microbatch), []).extend(later)
        return own

    def _prep(self, op: CommOp, stage: int) -> tuple[tuple[str, float], ...]:
        """(name, seconds) of each kernel the compute stream runs on gradient bucket ``op``
        before its reduction (:meth:`Workload.grad_sync_prep`), priced once."""
        priced = self.prep_s.get((id(op), stage))
        if priced is None or priced[0] is not op:  # kept with it: its id is not reused
            costs = self.stage_costs[stage]
            priced = self.prep_s[(id(op), stage)] = (op, tuple(
                (k.name, costs.compute_s(k)) for k in self.work.grad_sync_prep(op)))
        return priced[1]

    def _has_prep(self, chunk: Chunk) -> bool:
        """Whether any bucket of ``chunk`` runs kernels on the compute stream first."""
        key = (chunk.stage, chunk.chunk)
        if key not in self.chunk_has_prep:
            self.chunk_has_prep[key] = any(
                self._prep(op, chunk.stage) for op in self._grad_ops(chunk))
        return self.chunk_has_prep[key]

    def _launch(self, dev: Device, op: CommOp,
                grad_ops: list[simpy.Process]) -> Iterator[simpy.Event] | None:
        """Launch gradient bucket ``op``'s reduction into ``grad_ops``; or, when the compute
        stream first runs kernels on the bucket, return that work, which launches it."""
        if self._prep(op, dev.stage):
            return self._prepared(dev, op, grad_ops)
        grad_ops.append(self.env.process(self._collective(dev, op)))
        return None

    def _issue(self, dev: Device, chunk: Chunk,
               grad_ops: list[simpy.Process]) -> Iterator[simpy.Event]:
        """Issue every bucket of ``chunk`` in turn, each after its compute-stream kernels."""
        if not self._has_prep(chunk):  # nothing between them: all queued now
            grad_ops += self._queue_all(dev, self._grad_ops(chunk))
            return
        for op in self._grad_ops(chunk):
            work = self._launch(dev, op, grad_ops)
            if work is not None:
                yield from work

    def _prepared(self, dev: Device, op: CommOp,
                  launched: list[simpy.Process]) -> Iterator[simpy.Event]:
        """Run bucket ``op``'s kernels on the compute stream (recorded as kind "D"), then
        launch its reduction into ``launched``."""
        for name, duration_s in self._prep(op, dev.stage):
            start = self.env.now
            yield self.env.timeout(duration_s)
            self.records.append(Record(dev.id, dev.stage, "compute", name, "D", -1, -1,
                                       start, self.env.now))
        launched.append(self.env.process(self._collective(dev, op)))

    def _gradients(self, dev: Device, chunk: Chunk, count: int, mb: int) -> list[simpy.Process]:
        """Launch the gradient reduction of ``chunk`` once its gradients are final."""
        work = self.work
        if work.zero == 3:  # ZeRO-3 reduce-scatters every micro-batch's gradients
            if work.unit_reductions:  # already, layer by layer, in the gathered backward
                return []
            return self._queue_all(dev, self._grad_ops(chunk), tag=mb)
        if count < work.microbatches_per_chunk:
            return []
        return self._queue_all(dev, self._grad_ops(chunk))

    def _queue_all(self, dev: Device, ops: list[CommOp],
                   tag: object = None) -> list[simpy.Process]:
        """Queue ``ops`` on the ``dp`` stream now, in order: one run in closed form where
        :attr:`closed_form` allows, else a process each."""
        if not ops:
            return []
        if self.closed_form[dev.id]:
            now = self.env.now
            return [self.env.process(self._closed_form_run(dev, [(now, op) for op in ops],
                                                           self._durations(ops, dev.stage)))]
        return [self.env.process(self._collective(dev, op, tag=tag)) for op in ops]

    def _grad_ops(self, chunk: Chunk) -> list[CommOp]:
        """The bucketed gradient reduction of ``chunk`` (:meth:`Workload.dp_grad_ops`),
        built once."""
        key = (chunk.stage, chunk.chunk)
        if key not in self.bucket_ops:
            self.bucket_ops[key] = self.work.dp_grad_ops(chunk)
        return self.bucket_ops[key]
