"""The engine: builds a step's streams and replays each device's schedule on them.

:class:`Engine` prices every chunk's passes once, starts one SimPy process per simulated
device (:meth:`Engine._device`) that walks its stage's actions in order, and collects the
records into a :class:`~llmsim.trace.Trace`. The passes' pricing and records, the
pipeline messages, the gradient reductions and the weight gathers are the parts in
:mod:`~llmsim.engine.passes`, :mod:`~llmsim.engine.pipeline`,
:mod:`~llmsim.engine.gradients` and :mod:`~llmsim.engine.gathers`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Protocol

import simpy

from llmsim.blocks import Block, CostModel
from llmsim.engine import contended, uncontended
from llmsim.engine.devices import Device, stage_devices
from llmsim.engine.gathers import WeightGathers
from llmsim.engine.gradients import GradientTraffic, Launch
from llmsim.engine.pairs import paired_kinds
from llmsim.engine.passes import PassPricing
from llmsim.engine.pipeline import PipelineMessages
from llmsim.engine.replicas import replica_grad_allreduce
from llmsim.engine.streams import Barrier, Contention, Fifo, Mark
from llmsim.ops import CommOp
from llmsim.schedules import Action, aligned_grad_syncs
from llmsim.trace import Record, Trace, by_device_start_stream
from llmsim.workload import Chunk, Workload


class StageCosts(Protocol):
    """Cost models per pipeline stage: a heterogeneous job's (:mod:`llmsim.hetero`)."""

    def for_stage(self, stage: int) -> CostModel: ...
    def between(self, stage: int, other: int) -> CostModel: ...


class Engine(PassPricing, PipelineMessages, GradientTraffic, WeightGathers):
    """Replays one step; build it, then call :meth:`run`."""

    def __init__(self, workload: Workload, schedule: list[list[Action]], costs: CostModel,
                 devices: list[Device], overlap_dp: bool = True,
                 split_backward: bool = False, overlap_pp: bool = True,
                 overlap_tp: bool = False, prefetch_weights: bool | str = True,
                 regather_for_recompute: bool = False,
                 node_of: Callable[[Device, int], int] | None = None,
                 collective_units: int = 0, p2p_units: tuple[int, int] = (0, 0),
                 aligned_grad_sync: bool = False,
                 stage_costs: StageCosts | None = None, schedule_name: str = "",
                 replicas: dict[int, tuple[int, ...]] | None = None) -> None:
        self.work, self.schedule, self.costs = workload, schedule, costs
        self.stage_costs: list[CostModel] = (
            [costs] * workload.stages if stage_costs is None
            else [stage_costs.for_stage(s) for s in range(workload.stages)])
        """Stage → the cost model of the node group it runs on (a heterogeneous job's
        ``stage_costs``; ``costs`` for every stage otherwise)."""
        self.pair_costs: Callable[[int, int], CostModel] = (
            (lambda a, b: costs) if stage_costs is None else stage_costs.between)
        """(stage, stage) → the cost model of a message between them (across node groups:
        :meth:`llmsim.hetero.StagedCosts.between`)."""
        self.replicas = replicas or {}
        """Simulated device → the devices it stands for (:attr:`Trace.replicas`)."""
        self.schedule_name = schedule_name
        """The registered name of the schedule (:mod:`llmsim.schedules`); "" if unknown."""
        self.tight_loop = stage_costs is None
        """Whether :meth:`run` may replay the step without SimPy where nothing contends
        (:mod:`~llmsim.engine.uncontended`; off: SimPy always, the reference the tests
        compare with, and for a heterogeneous job's per-stage cost models)."""
        # With a fused backward (PyTorch autograd) the input gradient leaves the stage
        # only when the whole backward, weight gradients included, has returned; only
        # Zero-Bubble schedules split B from W and send right after B.
        self.split_backward = split_backward
        self.overlap_pp = overlap_pp
        self.overlap_tp = overlap_tp
        self.devices, self.overlap_dp = devices, overlap_dp
        # Weight gathers run one layer ahead of the compute, or only when it needs them.
        self.prefetch_weights = prefetch_weights
        # A backward pass gathers each layer twice: for its recompute, then for its backward.
        self.regather_for_recompute = regather_for_recompute
        self.env = simpy.Environment()
        self.barrier = Barrier(self.env)
        self.records: list[Record] = []
        self.pp_waits: list[tuple[int, float, float, float]] = []
        self.dp_waits: list[tuple[int, float, float]] = []
        self.gather_ops: dict[tuple[int, int], list[CommOp]] = {}
        """(stage, chunk) → its per-layer weight gathers, built once."""
        self.bucket_ops: dict[tuple[int, int], list[CommOp]] = {}
        """(stage, chunk) → its gradient buckets' reductions, built once."""
        self.prep_s: dict[tuple[int, int], tuple[CommOp, tuple[tuple[str, float], ...]]] = {}
        """id of a gradient bucket → it and its compute-stream kernels before the
        reduction, priced."""
        self.grad_syncs: dict[int, dict[int, list[int]] | None] = {}
        """Stage → where it issues whole chunks' reductions (action index → chunks), or
        None where each bucket is issued as the backward makes it final."""
        if aligned_grad_sync and overlap_dp and workload.grad_ranks > 1 and workload.zero != 3:
            p, v, m = workload.stages, workload.chunks_per_stage, workload.microbatches
            self.grad_syncs = {s: aligned_grad_syncs(actions, s, p, v, m)
                               for s, actions in enumerate(schedule)}
        # A send between pipeline neighbours on one node crosses its fabric, one between
        # nodes the network: ``node_of(device, stage)`` says where a device's pipeline
        # neighbour sits (None: every send priced as the pipeline group's path).
        self.node_of = node_of
        self._within: dict[tuple[object, int, int], bool] = {}
        self.collective_units = collective_units if workload.grad_ranks > 1 else 0
        """Compute units a data-parallel collective holds while it runs beside the compute."""
        self.posted_singly = (overlap_pp and workload.chunks_per_stage > 1
                              and workload.stages > 1 and not workload.hops)
        """Whether pipeline sends and receives are posted one by one, each on the pair's
        own communicator (Megatron-LM's overlapped interleaved schedule), not batched on
        the pipeline group's (ZB-V's V is not Megatron's interleaving: batched)."""
        self.rendezvous = self.posted_singly and node_of is not None
        """Whether the sends and receives are posted where Megatron-LM posts them, each
        completing when its peer has posted the other half (:meth:`_recv_posts`), and each
        step waits for the previous step's send and receive of its direction."""
        self.p2p_units = p2p_units if self.rendezvous else (0, 0)
        """Compute units one posted send or receive holds: (peer on another node, on the
        same node)."""
        self.priced: dict[tuple[int, int, str, int], Block] = {}
        """(stage, chunk, kind, units held by other kernels) → the pass, priced once."""
        self.laid_out: dict[tuple[tuple[int, ...], int, int, float | None], Block] = {}
        """(ids of a pass's ops, id of its stage's cost model, units held) → the pass:
        stages whose chunks run the same op objects (the middle stages of a uniform
        pipeline) share one, where the cost model prices an op the same at every call."""
        self.pass_kinds = paired_kinds(schedule, schedule_name, workload)
        """(stage, kind, micro-batch, chunk) → the block kind of a pass run in an
        overlapped pair (DualPipe's F&B, :mod:`~llmsim.engine.pairs`); empty without."""
        self.blocks = {(s, c, kind): self._priced(s, c, kind, 0)
                       for s, c in workload.chunks for kind in ("F", "B", "w", "W")}
        for (s, _, _, c), kind in self.pass_kinds.items():
            self.blocks[(s, c, kind)] = self._priced(s, c, kind, 0)
        """(stage, chunk, kind) → the pass alone on its device."""
        self.device_syncs_beside_gathers = any(
            block.device_syncs and workload.gathers_before(kind, 0)
            for (_, _, kind), block in self.blocks.items())
        """Whether a gathered pass holds a device-wide host sync, which waits for the
        gathers in flight (:meth:`WeightGathers._gathered_pass`): on SimPy alone."""
        self.contention = {
            d.id: Contention(self.env, bool(self.collective_units) or any(self.p2p_units))
            for d in devices}
        self.p2p_stream: dict[tuple[int, int], Fifo] = {}
        """(device, peer stage) → the stream of the two-rank communicator PyTorch runs a
        single isend or irecv on: one operation at a time, in the order posted."""
        self.recv_posted: dict[object, simpy.Event] = {}
        self.messages: dict[object, simpy.Event] = {}
        self.message_start: dict[object, float] = {}
        self.pp_link = {d.id: Fifo(self.env) for d in devices}
        self.closed_form_sends = True
        """Whether sends on a ``pp`` link are priced in closed form (:meth:`_post_send`;
        off: one process each, the reference the tests compare with)."""
        self.pp_free_s: dict[int, float] = {}
        """Device → when the last send on its ``pp`` link ends (sends in closed form)."""
        self.dp_stream = {d.id: Fifo(self.env) for d in devices}
        self.pp_send_op = {  # posted one by one: on the pair's own communicator
            within: CommOp("pp_send", "send_recv", "pp", "F", workload.pp_message_bytes,
                           within_node=within, two_rank=self.posted_singly,
                           host_s=workload.pp_exchange_host_s)
            for within in (False, True)
        }
        self.pair_send_s: dict[tuple[int, int, bool], float] = {}
        """(stage, stage, within a node) → a send's time between them, priced once."""
        # Sliced pipeline messages (Megatron's scatter/gather, DeepSpeed's partitioned
        # tensors): the receivers rebuild each over their TP group with a tensor-list
        # all_gather (a flat buffer, then one copy out per rank's slice).
        self.pp_gather_s = costs.comm_s(CommOp("pp_gather", "all_gather", "tp", "F",
                                               workload.pp_gather_bytes,
                                               copies=workload.tp)) \
            if workload.pp_gather_bytes else 0.0
        self.closed_form = {d.id: d.dp_group[1] == 1 and not self.collective_units
                            for d in devices}
        """Device → whether its data-parallel collectives may be priced in closed form: a
        run of them queued together on its ``dp`` stream, with no group members to wait
        for (reduced fidelity) and no compute units held by them (nothing for them to
        slow, so nothing else sees when one ends and the next starts)."""
        self.hooks_closed_form = not any(workload.gathers_before(kind, 0) for kind in "FB")
        """Whether gradient buckets launched by marks inside a pass may be run in closed
        form: no weight gathers share the ``dp`` stream during the step, so nothing can
        queue between the buckets of one pass."""
        self.dp_closed_until: dict[int, float] = {}
        """Device → the last launch time of the closed-form bucket run under way."""
        self.open_runs: dict[int, int] = {}
        """Device → its :class:`~llmsim.engine.gradients.BucketRun` s not all launched."""
        self.dp_free_s: dict[int, float] = {}
        """Device → when the last bucket of its bucket runs ends."""
        self.dp_run_end: dict[int, simpy.Event] = {}
        """Device → the event that ends its last bucket run."""
        self.comm_s_of: dict[tuple[int, int], tuple[CommOp, float]] = {}
        """id of a collective → it and its duration (kept, so the id is not reused)."""
        self.durations_of: dict[tuple[int, int], tuple[list[CommOp], list[float]]] = {}
        """(id of a list of collectives, stage) → it and their durations."""
        self.chunk_has_prep: dict[tuple[int, int], bool] = {}
        """(stage, chunk) → whether its buckets run kernels before their reductions."""
        self.last_compute: dict[int, float] = {}
        self.dp_done: dict[int, float] = {}
        self.stage_ready = self.env.event()
        self.ready_count = 0
        self.passes_started = 0
        """Pipeline actions begun so far (the progress of a long run)."""

    def _device(self, dev: Device) -> Iterator[simpy.Event]:
        env, work = self.env, self.work
        p, v = work.stages, work.chunks_per_stage
        last_vs = p * v - 1
        w_seen: dict[int, int] = defaultdict(int)
        grad_ops: list[simpy.Process] = []
        deferred: list[tuple[Chunk, int, int]] = []
        carried: dict[tuple[int, int], list[Mark]] = {}
        gathers: dict[tuple[int, int, str, int], simpy.Event] = {}
        actions = self.schedule[dev.stage]
        syncs = self.grad_syncs.get(dev.stage)
        if self.prefetches(actions, 0):
            self._prefetch(dev, actions, 0, 0, gathers)
        posts = self._recv_posts(dev, actions) if self.rendezvous else {}
        for key, peer in posts.get(-1, ()):
            env.process(self._recv(dev, key, peer))
        # The send each direction's last step posted: Megatron-LM's schedule waits on all
        # of a step's requests, its send's too, before the next step of that direction
        # (``fwd_wait_handles``, ``bwd_wait_handles``; blocking in the cooldown).
        posted_sends: dict[str, simpy.Event | None] = {"F": None, "B": None}
        for i, act in enumerate(actions):
            self.passes_started += 1
            chunk = work.chunks[(dev.stage, act.chunk)]
            vs = chunk.virtual_stage
            earlier = posted_sends.get(act.kind) if self.rendezvous else None
            if earlier is not None and not earlier.triggered:
                wait_start = env.now
                yield earlier
                self.pp_waits.append((dev.id, wait_start, env.now, wait_start))
            need: simpy.Event | None = None
            if act.kind == "F" and vs > 0:
                need = self._message((dev.pipe, "F", vs, act.microbatch))
            elif act.kind == "B" and vs < last_vs:
                need = self._message((dev.pipe, "B", vs, act.microbatch))
            if need is not None and not need.triggered:
                wait_start = env.now
                yield need
                key = (dev.pipe, act.kind, vs, act.microbatch)
                self.pp_waits.append((dev.id, wait_start, env.now,
                                      self.message_start.get(key, wait_start)))
            if self.pp_gather_s:  # sliced messages: the received one, DeepSpeed's own output
                regather = work.pp_regather_output and act.kind == "B" and vs < last_vs
                count = int(need is not None) + int(regather)
                if count:
                    yield from self._gather_messages(dev, act, count)
            block = self._block(dev, act)
            key, members = dev.tp_group
            if members > 1:
                yield self.barrier.arrive((key, i), members)
            if self._gather_ops(dev, act):
                yield from self._gathered_pass(dev, actions, i, block, gathers, grad_ops)
            else:
                if self.prefetches(actions, i + 1) and not self._at_call(actions[i + 1], 0):
                    self._prefetch(dev, actions, i + 1, 0, gathers)
                marks = carried.pop((act.chunk, act.microbatch), []) if act.kind == "W" else []
                if self.overlap_dp and work.zero != 3 and syncs is None \
                        and w_seen[act.chunk] + 1 == work.microbatches_per_chunk:
                    marks += self._bucket_marks(dev, actions, i, chunk, grad_ops, carried)
                start = env.now
                if marks and not self.contention[dev.id].variable \
                        and all(isinstance(call, Launch) for _, call in marks):
                    pauses = yield from self._closed_form_pass(dev, block, marks, grad_ops)
                else:
                    pauses = yield from self.contention[dev.id].run(self._price(dev, act),
                                                                   marks)
                self._record_pass(dev, act, block, start, pauses)
            for c in syncs.get(i, ()) if syncs else ():  # before the step's send
                yield from self._issue(dev, work.chunks[(dev.stage, c)], grad_ops)
            # Megatron-LM posts a step's receive for the same direction before its send
            # on odd pipeline ranks, after it on even ones (``_p2p_ops``), so that the
            # two ranks of a pair post in matching order; a warmup's last backward
            # receive comes after both.
            recvs = posts.get(i, [])
            direction = "F" if act.kind == "F" else "B"  # of this step's send
            first = [r for r in recvs if dev.stage % 2 and r[0][1] == direction]
            for key, peer in first:
                env.process(self._recv(dev, key, peer))
            send: simpy.Event | None = None
            if act.kind == "F" and vs < last_vs:
                send = self._post_send(dev, (dev.pipe, "F", vs + 1, act.microbatch),
                                       act.microbatch, act.chunk,
                                       work.stage_of(vs + 1, act.chunk))
            if vs > 0 and act.kind == self.backward_step:
                send = self._post_send(dev, (dev.pipe, "B", vs - 1, act.microbatch),
                                       act.microbatch, act.chunk,
                                       work.stage_of(vs - 1, act.chunk))
            for key, peer in recvs:
                if (key, peer) not in first:
                    env.process(self._recv(dev, key, peer))
            if act.kind == "F":
                posted_sends["F"] = send
            elif act.kind == self.backward_step:
                posted_sends["B"] = send
            if send is not None and not self.overlap_pp:
                blocked = env.now
                yield send  # a blocking send: the stage waits for its transfer
                self.pp_waits.append((dev.id, blocked, env.now, blocked))
            if act.kind == "W":
                w_seen[act.chunk] += 1
                if not self.overlap_dp:
                    deferred.append((chunk, w_seen[act.chunk], act.microbatch))
                elif work.zero == 3:  # the other stages' buckets are launched by their marks
                    grad_ops += self._gradients(dev, chunk, w_seen[act.chunk], act.microbatch)
        self.last_compute[dev.id] = env.now
        for chunk, count, mb in deferred:  # without overlap: reduce after the last pass
            if count == work.microbatches_per_chunk and self._has_prep(chunk):
                # Each bucket's compute-stream work, then its reduction, which the next
                # bucket's work waits for (Megatron-Core's synchronous collective).
                for op in self._grad_ops(chunk):
                    launched: list[simpy.Process] = []
                    yield from self._prepared(dev, op, launched)
                    yield launched[0]
                continue
            grad_ops += self._gradients(dev, chunk, count, mb)
        for proc in grad_ops:
            if not proc.triggered:
                yield proc
        self.dp_done[dev.id] = env.now
        yield from replica_grad_allreduce(self, dev)  # Chimera's two weight replicas
        tied = work.embedding_grad_allreduce
        if tied is not None and dev.stage in (0, p - 1):
            yield self.barrier.arrive((dev.pipe, tied.name), 2)
            start = env.now
            yield env.timeout(self.pair_costs(0, p - 1).comm_s(tied))
            self.records.append(Record(dev.id, dev.stage, "pp", tied.name, "O", -1, -1,
                                       start, env.now))
        # Gradient-norm clipping all-reduces over every stage: the optimizer of each
        # stage starts only when all stages have their gradients.
        self.ready_count += 1
        if self.ready_count == len(self.devices):
            self.stage_ready.succeed()
        yield self.stage_ready
        start = env.now
        yield env.timeout(self.stage_costs[dev.stage].compute_s(work.optimizer[dev.stage]))
        self.records.append(Record(dev.id, dev.stage, "compute", "optimizer", "O", -1, -1,
                                   start, env.now))
        for gather in work.dp_param_gathers(dev.stage):  # dense weights', then experts'
            yield env.process(self._collective(dev, gather))

    def run(self, progress: Callable[[float], None] | None = None,
            every_s: float = 5.0) -> Trace:
        """Simulate the step and return the trace.

        ``progress(share)`` is called about every ``every_s`` seconds of wall time with
        the share of the step's pipeline actions begun (0–1): a watcher process looks at
        the clock at simulated instants it spaces out by itself, and changes nothing the
        devices do.
        """
        if uncontended.applies(self):
            trace = uncontended.replay(self, progress, every_s)
            if trace is not None:
                return trace
        elif contended.applies(self):
            trace = contended.replay(self, progress, every_s)
            if trace is not None:
                return trace
        procs = [self.env.process(self._device(d)) for d in self.devices]
        if progress is not None:
            total = sum(len(self.schedule[d.stage]) for d in self.devices)
            self.env.process(self._watch(progress, every_s, max(total, 1)))
        self.env.run(until=simpy.AllOf(self.env, procs))
        by_stage = stage_devices(self.devices)
        opt = [r.start_s for r in self.records if r.name == "optimizer"]
        return Trace(
            records=sorted(self.records, key=by_device_start_stream),
            blocks=self.blocks,
            accumulate_from_microbatch=self.work.accumulate_from_microbatch,
            stage_last_compute_s={s: max(self.last_compute[d] for d in ids)
                                  for s, ids in by_stage.items()},
            stage_dp_done_s={s: max(self.dp_done[d] for d in ids) for s, ids in by_stage.items()},
            optimizer_start_s=min(opt),
            step_end_s=self.env.now,
            pp_waits=self.pp_waits,
            dp_waits=self.dp_waits,
            pp_slowed_s={d: c.p2p_slowed_s for d, c in self.contention.items()
                         if c.p2p_slowed_s},
            replicas=self.replicas,
            pass_kinds=self.pass_kinds,
        )


    def _watch(self, progress: Callable[[float], None], every_s: float,
               total: int) -> Iterator[simpy.Event]:
        """Report the share of actions begun every ``every_s`` s of wall time; the look
        interval in simulated time doubles while looks come too often."""
        import time

        interval_s = 1e-6
        reported = looked = time.monotonic()
        while True:
            yield self.env.timeout(interval_s)
            now = time.monotonic()
            if now - looked < max(every_s / 100, 1e-3):
                interval_s *= 2
            looked = now
            if now - reported >= every_s:
                progress(min(self.passes_started / total, 1.0))
                reported = now
