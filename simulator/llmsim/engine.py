"""The SimPy engine: replays one training step of a workload on devices and streams.

Each simulated device has four streams (design §7): ``compute`` (kernels, and the
blocking tensor-parallel collectives, recorded on ``tp``), ``pp`` (pipeline sends) and
``dp`` (gradient and ZeRO collectives, overlapping the backward when enabled).

Symmetry (``fidelity="reduced"``): all data-parallel replicas and all tensor-parallel
ranks of a stage do the same thing at the same time, so one device per pipeline stage
is simulated and collectives spanning the others are priced by the cost model; the cost
of a simulation does not grow with the DP degree. ``fidelity="full"`` simulates every
device, with collectives as barriers among their group members, to check the reduction.

A pipeline action (the forward, input-gradient or weight-gradient pass of one chunk for
one micro-batch) is one SimPy timeout; its per-op spans are kept as offsets in the
chunk's block template (:mod:`llmsim.blocks`) and expanded only when a trace
(:mod:`llmsim.trace`) is asked for.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass

import simpy

from llmsim.blocks import Block, CostModel, block_kind
from llmsim.ops import CommOp
from llmsim.schedules import Action, aligned_grad_syncs
from llmsim.trace import Record, Trace
from llmsim.workload import Chunk, Workload

__all__ = ["Block", "CostModel", "Device", "Engine", "Record", "Trace", "devices_for"]


class _Barrier:
    """Collective rendezvous for ``fidelity="full"``: fires when all members arrived."""

    def __init__(self, env: simpy.Environment) -> None:
        self.env = env
        self.waiting: dict[object, tuple[int, simpy.Event]] = {}

    def arrive(self, key: object, members: int) -> simpy.Event:
        count, event = self.waiting.get(key, (0, self.env.event()))
        count += 1
        self.waiting[key] = (count, event)
        if count == members:
            del self.waiting[key]
            event.succeed()
        return event


class _Fifo:
    """A stream that runs one transfer at a time, in the order they were queued (a
    lighter ``simpy.Resource(capacity=1)``: one event per transfer)."""

    def __init__(self, env: simpy.Environment) -> None:
        self.env = env
        self.last: simpy.Event | None = None

    def queue(self) -> tuple[simpy.Event | None, simpy.Event]:
        """Join the queue: (the end to wait for first, or None when the stream is free;
        the event to succeed when this transfer ends)."""
        before, self.last = self.last, self.env.event()
        return (before if before is not None and not before.triggered else None), self.last


def _timeout_until(env: simpy.Environment, time_s: float) -> simpy.Timeout:
    """A timeout that ends at ``time_s`` exactly (``now + delay`` rounds: the delay is
    moved by an ulp at a time until the sum is ``time_s``), so that a time computed in
    closed form is the one a chain of timeouts would reach."""
    delay = time_s - env.now
    while env.now + delay < time_s:
        delay = math.nextafter(delay, math.inf)
    while env.now + delay > time_s:
        delay = math.nextafter(delay, -math.inf)
    return env.timeout(delay)


Mark = tuple[float, Callable[[], Iterator[simpy.Event] | None]]
"""(share of a pass's work, what to call when the pass has done that share). The call may
return work that the compute stream runs first, the pass paused until it ends."""

Pause = tuple[float, float, float]
"""(share of the pass done, start, end) of a pause for a mark's compute-stream work."""


class _Contention:
    """Compute on one device that runs slower while other kernels hold compute units.

    A data-parallel collective holds the node's ``collective_units`` while it runs; a
    posted pipeline send or receive holds its channels until it completes. A pass priced
    ``price(held)`` seconds with ``held`` units taken progresses at ``1/price(held)`` of its
    work per second; each hold or release changes the rate of the pass under way. The
    pass's time beyond ``price(0)`` is shared between the holders by their units;
    :attr:`p2p_slowed_s` sums the pipeline operations' share.
    """

    def __init__(self, env: simpy.Environment, variable: bool) -> None:
        self.env = env
        self.variable = variable
        """Whether anything ever holds units on this device (else passes run at once)."""
        self.collective = 0
        self.posted = 0
        self.p2p_slowed_s = 0.0
        self.change: simpy.Event | None = None

    def hold(self, collective: int = 0, posted: int = 0) -> None:
        """A collective (``collective``) or a pipeline operation (``posted``) takes
        (positive) or gives back (negative) that many compute units."""
        self.collective += collective
        self.posted += posted
        if self.change is not None:
            change, self.change = self.change, None
            change.succeed()

    def mark_times(self, duration_s: float, shares: Sequence[float]) -> tuple[list[float], float]:
        """When a pass of ``duration_s`` that nothing slows, starting now, has done each
        of ``shares`` (sorted) of its work, and when it ends: the times :meth:`run`
        reaches with one timeout from mark to mark (the same sums, in the same order)."""
        times: list[float] = []
        t, done, i = self.env.now, 0.0, 0
        while True:
            while i < len(shares) and shares[i] <= done + 1e-12:
                times.append(t)
                i += 1
            if done >= 1.0 - 1e-12:
                return times, t
            target = shares[i] if i < len(shares) else 1.0
            t += (target - done) * duration_s
            done = target

    def run(self, price: Callable[[int], float],
            marks: Sequence[Mark] = ()) -> Generator[simpy.Event, object, list[Pause]]:
        """Run a pass that takes ``price(held)`` seconds with ``held`` units taken; each
        ``(share, call)`` of ``marks`` is called when that share of the pass's work is
        done, and the work a call returns runs before the pass goes on. Returns the
        pauses that work made."""
        env = self.env
        pauses: list[Pause] = []
        if not self.variable and not marks:
            yield env.timeout(price(0))
            return pauses
        alone_s = price(0)
        pending = sorted(marks, key=lambda mark: mark[0])
        done = 0.0  # share of the pass's work done
        while True:
            while pending and pending[0][0] <= done + 1e-12:
                share, call = pending.pop(0)
                interlude = call()
                if interlude is not None:
                    paused = env.now
                    yield from interlude
                    pauses.append((min(share, 1.0), paused, env.now))
            if done >= 1.0 - 1e-12:
                return pauses
            target = pending[0][0] if pending else 1.0
            collective, posted = self.collective, self.posted
            rate_s = price(collective + posted)
            if not self.variable:
                yield env.timeout((target - done) * rate_s)
                done = target
                continue
            if self.change is None:
                self.change = env.event()
            start, reach = env.now, env.timeout((target - done) * rate_s)
            yield reach | self.change
            elapsed = env.now - start
            done = target if reach.processed else done + elapsed / rate_s
            if posted and rate_s > alone_s:
                excess = elapsed * (1.0 - alone_s / rate_s)
                self.p2p_slowed_s += excess * posted / (collective + posted)


@dataclass(frozen=True)
class _Launch:
    """A mark's call that launches gradient bucket ``op`` in closed form
    (:meth:`Engine._closed_form_pass`)."""

    op: CommOp


@dataclass(frozen=True)
class Device:
    """A simulated device: its global id, stage and the peers it talks to."""

    id: int
    stage: int
    tp_group: tuple[object, int]
    dp_group: tuple[object, int]
    pipe: object
    """Key shared by the devices of one pipeline (same tp and dp coordinates)."""


def devices_for(fidelity: str, stages: int, tp: int, dp: int) -> list[Device]:
    """One device per stage (reduced) or every device (full)."""
    if fidelity == "reduced":
        return [Device(s, s, (("tp", s), 1), (("dp", s), 1), 0) for s in range(stages)]
    out = []
    for s in range(stages):
        for d in range(dp):
            for t in range(tp):
                out.append(Device(len(out), s, (("tp", s, d), tp), (("dp", s, t), dp), (t, d)))
    return out


class Engine:
    """Replays one step; build it, then call :meth:`run`."""

    def __init__(self, workload: Workload, schedule: list[list[Action]], costs: CostModel,
                 devices: list[Device], overlap_dp: bool = True,
                 split_backward: bool = False, overlap_pp: bool = True,
                 overlap_tp: bool = False, prefetch_weights: bool = True,
                 regather_for_recompute: bool = False,
                 node_of: Callable[[Device, int], int] | None = None,
                 collective_units: int = 0, p2p_units: tuple[int, int] = (0, 0),
                 aligned_grad_sync: bool = False) -> None:
        self.work, self.schedule, self.costs = workload, schedule, costs
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
        self.barrier = _Barrier(self.env)
        self.records: list[Record] = []
        self.pp_waits: list[tuple[int, float, float, float]] = []
        self.dp_waits: list[tuple[int, float, float]] = []
        self.gather_ops: dict[tuple[int, int], list[CommOp]] = {}
        """(stage, chunk) → its per-layer weight gathers, built once."""
        self.bucket_ops: dict[tuple[int, int], list[CommOp]] = {}
        """(stage, chunk) → its gradient buckets' reductions, built once."""
        self.prep_s: dict[CommOp, tuple[tuple[str, float], ...]] = {}
        """Gradient bucket → its compute-stream kernels before the reduction, priced."""
        self.grad_syncs: dict[int, dict[int, list[int]] | None] = {}
        """Stage → where it issues whole chunks' reductions (action index → chunks), or
        None where each bucket is issued as the backward makes it final."""
        if aligned_grad_sync and overlap_dp and workload.dp > 1 and workload.zero != 3:
            p, v, m = workload.stages, workload.chunks_per_stage, workload.microbatches
            self.grad_syncs = {s: aligned_grad_syncs(actions, s, p, v, m)
                               for s, actions in enumerate(schedule)}
        # A send between pipeline neighbours on one node crosses its fabric, one between
        # nodes the network: ``node_of(device, stage)`` says where a device's pipeline
        # neighbour sits (None: every send priced as the pipeline group's path).
        self.node_of = node_of
        self._within: dict[tuple[object, int, int], bool] = {}
        self.collective_units = collective_units if workload.dp > 1 else 0
        """Compute units a data-parallel collective holds while it runs beside the compute."""
        self.posted_singly = (overlap_pp and workload.chunks_per_stage > 1
                              and workload.stages > 1)
        """Whether pipeline sends and receives are posted one by one, each on the pair's
        own communicator (Megatron-LM's overlapped interleaved schedule), not batched on
        the pipeline group's."""
        self.rendezvous = self.posted_singly and node_of is not None
        """Whether the sends and receives are posted where Megatron-LM posts them, each
        completing when its peer has posted the other half (:meth:`_recv_posts`), and each
        step waits for the previous step's send and receive of its direction."""
        self.p2p_units = p2p_units if self.rendezvous else (0, 0)
        """Compute units one posted send or receive holds: (peer on another node, on the
        same node)."""
        self.priced: dict[tuple[int, int, str, int], Block] = {}
        """(stage, chunk, kind, units held by other kernels) → the pass, priced once."""
        self.blocks = {(s, c, kind): self._priced(s, c, kind, 0)
                       for s, c in workload.chunks for kind in ("F", "B", "w", "W")}
        """(stage, chunk, kind) → the pass alone on its device."""
        self.contention = {
            d.id: _Contention(self.env, bool(self.collective_units) or any(self.p2p_units))
            for d in devices}
        self.p2p_stream: dict[tuple[int, int], _Fifo] = {}
        """(device, peer stage) → the stream of the two-rank communicator PyTorch runs a
        single isend or irecv on: one operation at a time, in the order posted."""
        self.recv_posted: dict[object, simpy.Event] = {}
        self.messages: dict[object, simpy.Event] = {}
        self.message_start: dict[object, float] = {}
        self.pp_link = {d.id: _Fifo(self.env) for d in devices}
        self.dp_stream = {d.id: _Fifo(self.env) for d in devices}
        self.pp_send_s = {  # posted one by one: on the pair's own communicator
            within: costs.comm_s(CommOp("pp_send", "send_recv", "pp", "F",
                                        workload.pp_message_bytes, within_node=within,
                                        two_rank=self.posted_singly))
            for within in (False, True)
        }
        # Sliced pipeline messages (Megatron's scatter/gather, DeepSpeed's partitioned
        # tensors): the receivers rebuild each over their TP group with a tensor-list
        # all_gather (a flat buffer, then one copy out per rank's slice).
        self.pp_gather_s = costs.comm_s(CommOp("pp_gather", "all_gather", "tp", "F",
                                               workload.pp_gather_bytes,
                                               copies=workload.tp)) \
            if workload.pp_gather_bytes else 0.0
        self.closed_form = {d.id: d.dp_group[1] == 1 and not self.contention[d.id].variable
                            for d in devices}
        """Device → whether its data-parallel collectives may be priced in closed form: a
        run of them queued together on its ``dp`` stream, with no group members to wait
        for (reduced fidelity) and no compute units held (nothing for them to slow)."""
        self.hooks_closed_form = not any(workload.gathers_before(kind, 0) for kind in "FB")
        """Whether gradient buckets launched by marks inside a pass may be run in closed
        form: no weight gathers share the ``dp`` stream during the step, so nothing can
        queue between the buckets of one pass."""
        self.dp_closed_until: dict[int, float] = {}
        """Device → the last launch time of the closed-form bucket run under way."""
        self.comm_s_of: dict[CommOp, float] = {}
        """Collective → its duration, priced once."""
        self.last_compute: dict[int, float] = {}
        self.dp_done: dict[int, float] = {}
        self.stage_ready = self.env.event()
        self.ready_count = 0

    def _priced(self, stage: int, chunk: int, kind: str, held: int) -> Block:
        """A pass of ``kind`` ("F", "B"; "W" with its gradient accumulation, "w" without,
        the micro-batches before :attr:`Workload.accumulate_from_microbatch`) on ``held``
        compute units fewer, priced once."""
        work = self.work.chunks[(stage, chunk)]
        if kind == "W" and not work.accumulate:
            kind = "w"  # nothing to accumulate: the same pass
        key = (stage, chunk, kind, held)
        block = self.priced.get(key)
        if block is None:
            ops = {"F": work.forward, "B": work.backward, "w": work.weight,
                   "W": work.weight + work.accumulate}
            block = self.priced[key] = Block.of(ops[kind], self.costs, self.overlap_tp, held)
        return block

    @property
    def backward_step(self) -> str:
        """The pass after which a backward step sends its input gradient and posts its
        next receive: "B" where the backward is split (Zero Bubble), else the fused
        backward's last pass, "W"."""
        return "B" if self.split_backward else "W"

    def _kind(self, act: Action) -> str:
        """Which of its chunk's passes ``act`` runs (:func:`block_kind`)."""
        return block_kind(act.kind, act.microbatch, self.work.accumulate_from_microbatch)

    def _price(self, dev: Device, act: Action) -> Callable[[int], float]:
        """Seconds ``act``'s pass takes on ``dev`` with a given number of units held."""
        kind = self._kind(act)
        return lambda held: self._priced(dev.stage, act.chunk, kind, held).duration_s

    def _block(self, dev: Device, act: Action) -> Block:
        """The block ``act`` runs on ``dev``, alone on the device."""
        return self.blocks[(dev.stage, act.chunk, self._kind(act))]

    # -- messages between pipeline stages ---------------------------------------------
    def _message(self, key: object) -> simpy.Event:
        if key not in self.messages:
            self.messages[key] = self.env.event()
        return self.messages[key]

    def _send(self, dev: Device, key: tuple[object, str, int, int], mb: int, chunk: int,
              to_stage: int) -> Iterator[simpy.Event]:
        within = self._within_node(dev, to_stage)
        if self.rendezvous:  # on the pair's stream, once the receiver has posted
            before, sent = self._p2p_stream(dev, to_stage).queue()
        else:
            before, sent = self.pp_link[dev.id].queue()
        if before is not None:
            yield before
        units = self.p2p_units[within]  # (0, 0) unless sends rendezvous
        if self.rendezvous:
            self.contention[dev.id].hold(posted=units)
            yield self._recv_posted(key)
        start = self.env.now
        self.message_start[key] = start
        yield self.env.timeout(self.pp_send_s[within])
        self.records.append(Record(dev.id, dev.stage, "pp", "pp_send", key[1], mb, chunk,
                                   start, self.env.now))
        if self.rendezvous:
            self.contention[dev.id].hold(posted=-units)
        sent.succeed()
        self._message(key).succeed()

    def _recv(self, dev: Device, key: object, from_stage: int) -> Iterator[simpy.Event]:
        """A posted receive: it runs on the pair's stream after what was posted there
        before it, holds its channels' compute units, and ends when the message is in."""
        before, received = self._p2p_stream(dev, from_stage).queue()
        if before is not None:
            yield before
        units = self.p2p_units[self._within_node(dev, from_stage)]
        self.contention[dev.id].hold(posted=units)
        self._recv_posted(key).succeed()
        yield self._message(key)
        self.contention[dev.id].hold(posted=-units)
        received.succeed()

    def _recv_posted(self, key: object) -> simpy.Event:
        if key not in self.recv_posted:
            self.recv_posted[key] = self.env.event()
        return self.recv_posted[key]

    def _p2p_stream(self, dev: Device, peer_stage: int) -> _Fifo:
        key = (dev.id, peer_stage)
        if key not in self.p2p_stream:
            self.p2p_stream[key] = _Fifo(self.env)
        return self.p2p_stream[key]

    def _recv_posts(self, dev: Device,
                    actions: list[Action]) -> dict[int, list[tuple[object, int]]]:
        """Where ``dev`` posts the receive for each message its passes consume, as
        Megatron-LM's interleaved schedule with ``overlap_p2p_comm`` does: action index
        → [(message, peer stage)] posted after that action (−1: before the first).

        Each step posts the receive for the next step's input with its own send: after a
        forward pass, the next forward's activations (``send_forward_recv_forward``); after
        a backward step, the next backward's gradient (``send_backward_recv_backward``).
        The first forward's receive comes before any pass; the first backward's after the
        last warmup forward, the one before the first steady-state step's forward (or,
        when every forward is a warmup one, right before the backward)."""
        p, last_vs = self.work.stages, self.work.stages * self.work.chunks_per_stage - 1
        posts: dict[int, list[tuple[object, int]]] = defaultdict(list)
        last = {"F": -1, "B": -1}
        forwards = sum(act.kind == "F" for act in actions)
        for j, act in enumerate(actions):
            vs = self.work.chunks[(dev.stage, act.chunk)].virtual_stage
            if act.kind == "F" and vs > 0:
                posts[last["F"]].append(((dev.pipe, "F", vs, act.microbatch), (vs - 1) % p))
            elif act.kind == "B" and vs < last_vs:
                after = last["B"]
                if after < 0:
                    warmup_only = sum(a.kind == "F" for a in actions[:j]) == forwards
                    after = j - 1 if warmup_only else j - 2
                posts[after].append(((dev.pipe, "B", vs, act.microbatch), (vs + 1) % p))
            if act.kind == "F":
                last["F"] = j
            elif act.kind == self.backward_step:
                last["B"] = j
        return posts

    def _gather_messages(self, dev: Device, act: Action, count: int) -> Iterator[simpy.Event]:
        """All-gather ``count`` sliced messages over the TP group before ``act`` runs
        (``parallelism.pp_scatter_gather``: the received one; with DeepSpeed also the
        stage's own output before its backward); the device waits, as Megatron's
        ``gather_split_1d_tensor`` and DeepSpeed's ``PartitionedTensor.full`` make it."""
        start = self.env.now
        yield self.env.timeout(count * self.pp_gather_s)
        self.records.append(Record(dev.id, dev.stage, "pp", "pp_gather", "recv",
                                   act.microbatch, act.chunk, start, self.env.now))
        self.pp_waits.append((dev.id, start, self.env.now, start))

    def _within_node(self, dev: Device, to_stage: int) -> bool:
        """Whether ``dev`` and its pipeline's ``to_stage`` share a node (memoised)."""
        if self.node_of is None:
            return False
        key = (dev.pipe, dev.stage, to_stage)
        within = self._within.get(key)
        if within is None:
            within = self._within[key] = (self.node_of(dev, dev.stage)
                                          == self.node_of(dev, to_stage))
        return within

    # -- data-parallel collectives ------------------------------------------------------
    def _comm_s(self, op: CommOp) -> float:
        """Seconds ``op`` takes, priced once per distinct collective."""
        duration_s = self.comm_s_of.get(op)
        if duration_s is None:
            duration_s = self.comm_s_of[op] = self.costs.comm_s(op)
        return duration_s

    def _closed_form_pass(self, dev: Device, block: Block, marks: list[Mark],
                          grad_ops: list[simpy.Process]) -> Iterator[simpy.Event]:
        """Run a pass alone on its device whose marks launch gradient buckets
        (:class:`_Launch`): one timeout to its end, and the buckets one closed-form run
        (:meth:`_closed_form_run`) at the times the marks would have fired."""
        ordered = sorted(marks, key=lambda mark: mark[0])
        times, end_s = self.contention[dev.id].mark_times(
            block.duration_s, [share for share, _ in ordered])
        launches = [(at_s, call.op) for at_s, (_, call) in zip(times, ordered, strict=True)]
        grad_ops.append(self.env.process(self._closed_form_run(dev, launches)))
        yield _timeout_until(self.env, end_s)
        return []

    def _closed_form_run(self, dev: Device,
                         launches: list[tuple[float, CommOp]]) -> Iterator[simpy.Event]:
        """Collectives launched at known times (non-decreasing) onto ``dev``'s ``dp``
        stream, in one process: each starts when it is launched and the one before it has
        ended, and takes its priced time, the sums :meth:`_collective` makes with one
        process and timeout each. Valid where :attr:`closed_form` holds and nothing else
        queues on the stream between the first launch and the last (checked there)."""
        env = self.env
        if launches[0][0] > env.now:
            yield _timeout_until(env, launches[0][0])
        before, ended = self.dp_stream[dev.id].queue()
        if before is not None:
            yield before
        self.dp_closed_until[dev.id] = launches[-1][0]
        end_s = env.now
        for at_s, op in launches:
            start_s = max(at_s, end_s)
            end_s = start_s + self._comm_s(op)
            self.records.append(Record(dev.id, dev.stage, "dp", op.name, op.phase, -1, -1,
                                       start_s, end_s))
        yield _timeout_until(env, end_s)
        ended.succeed()

    def _collective(self, dev: Device, op: CommOp, done: simpy.Event | None = None,
                    tag: object = None) -> Iterator[simpy.Event]:
        if self.env.now < self.dp_closed_until.get(dev.id, -math.inf):
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
        yield self.env.timeout(self._comm_s(op))
        self.contention[dev.id].hold(collective=-self.collective_units)
        self.records.append(Record(dev.id, dev.stage, "dp", op.name, op.phase, -1, -1,
                                   start, self.env.now))
        ended.succeed()
        if done is not None:
            done.succeed()

    # -- one device ---------------------------------------------------------------------
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
        if self.prefetch_weights:
            self._prefetch(dev, actions, 0, 0, gathers)
        posts = self._recv_posts(dev, actions) if self.rendezvous else {}
        for key, peer in posts.get(-1, ()):
            env.process(self._recv(dev, key, peer))
        # The send each direction's last step posted: Megatron-LM's schedule waits on all
        # of a step's requests, its send's too, before the next step of that direction
        # (``fwd_wait_handles``, ``bwd_wait_handles``; blocking in the cooldown).
        posted_sends: dict[str, simpy.Process | None] = {"F": None, "B": None}
        for i, act in enumerate(actions):
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
                yield from self._gathered_pass(dev, actions, i, block, gathers)
            else:
                if self.prefetch_weights:
                    self._prefetch(dev, actions, i + 1, 0, gathers)
                marks = carried.pop((act.chunk, act.microbatch), []) if act.kind == "W" else []
                if self.overlap_dp and work.zero != 3 and syncs is None \
                        and w_seen[act.chunk] + 1 == work.microbatches:
                    marks += self._bucket_marks(dev, actions, i, chunk, grad_ops, carried)
                start = env.now
                if marks and all(isinstance(call, _Launch) for _, call in marks):
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
            send: simpy.Process | None = None
            if act.kind == "F" and vs < last_vs:
                send = env.process(self._send(dev, (dev.pipe, "F", vs + 1, act.microbatch),
                                              act.microbatch, act.chunk, (vs + 1) % p))
            if vs > 0 and act.kind == self.backward_step:
                send = env.process(self._send(dev, (dev.pipe, "B", vs - 1, act.microbatch),
                                              act.microbatch, act.chunk, (vs - 1) % p))
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
            if count == work.microbatches and self._has_prep(chunk):
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
        tied = work.embedding_grad_allreduce
        if tied is not None and dev.stage in (0, p - 1):
            yield self.barrier.arrive((dev.pipe, tied.name), 2)
            start = env.now
            yield env.timeout(self.costs.comm_s(tied))
            self.records.append(Record(dev.id, dev.stage, "pp", tied.name, "O", -1, -1,
                                       start, env.now))
        # Gradient-norm clipping all-reduces over every stage: the optimizer of each
        # stage starts only when all stages have their gradients.
        self.ready_count += 1
        if self.ready_count == len(self.devices):
            self.stage_ready.succeed()
        yield self.stage_ready
        start = env.now
        yield env.timeout(self.costs.compute_s(work.optimizer[dev.stage]))
        self.records.append(Record(dev.id, dev.stage, "compute", "optimizer", "O", -1, -1,
                                   start, env.now))
        gather = work.dp_param_gather(dev.stage)
        if gather is not None:
            yield env.process(self._collective(dev, gather))

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
        closed = (self.closed_form[dev.id] and self.hooks_closed_form
                  and not self._has_prep(chunk))
        for k, op in enumerate(ops):
            at = (k + 1) / len(ops) * (own_s + next_s)

            def ready(op: CommOp = op) -> Iterator[simpy.Event] | None:
                return self._launch(dev, op, grad_ops)

            if closed:
                ready = _Launch(op)

            if at <= own_s or next_s == 0:
                own.append((at / own_s if own_s > 0 else 1.0, ready))
            else:
                carried.setdefault((act.chunk, act.microbatch), []).append(
                    ((at - own_s) / next_s, ready))
        return own

    def _prep(self, op: CommOp) -> tuple[tuple[str, float], ...]:
        """(name, seconds) of each kernel the compute stream runs on gradient bucket ``op``
        before its reduction (:meth:`Workload.grad_sync_prep`), priced once."""
        if op not in self.prep_s:
            self.prep_s[op] = tuple((k.name, self.costs.compute_s(k))
                                    for k in self.work.grad_sync_prep(op))
        return self.prep_s[op]

    def _has_prep(self, chunk: Chunk) -> bool:
        return any(self._prep(op) for op in self._grad_ops(chunk))

    def _launch(self, dev: Device, op: CommOp,
                grad_ops: list[simpy.Process]) -> Iterator[simpy.Event] | None:
        """Launch gradient bucket ``op``'s reduction into ``grad_ops``; or, when the compute
        stream first runs kernels on the bucket, return that work, which launches it."""
        if self._prep(op):
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
        for name, duration_s in self._prep(op):
            start = self.env.now
            yield self.env.timeout(duration_s)
            self.records.append(Record(dev.id, dev.stage, "compute", name, "D", -1, -1,
                                       start, self.env.now))
        launched.append(self.env.process(self._collective(dev, op)))

    def _record_pass(self, dev: Device, act: Action, block: Block, start: float,
                     pauses: list[Pause]) -> None:
        """Record a pass that ran from ``start`` to now, in parts around its ``pauses``."""
        seg_start, seg_from = start, 0.0
        for share, paused, resumed in pauses:
            self._record_part(dev, act, seg_start, seg_from, share * block.duration_s, paused)
            seg_start, seg_from = resumed, share * block.duration_s
        if not pauses or pauses[-1][0] < 1.0:  # a pause at the very end leaves nothing
            self._record_part(dev, act, seg_start, seg_from, math.inf)

    def _gradients(self, dev: Device, chunk: Chunk, count: int, mb: int) -> list[simpy.Process]:
        """Launch the gradient reduction of ``chunk`` once its gradients are final."""
        work = self.work
        if work.zero == 3:  # ZeRO-3 reduce-scatters every micro-batch's gradients
            return self._queue_all(dev, self._grad_ops(chunk), tag=mb)
        if count < work.microbatches:
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
            return [self.env.process(self._closed_form_run(dev, [(now, op) for op in ops]))]
        return [self.env.process(self._collective(dev, op, tag=tag)) for op in ops]

    def _grad_ops(self, chunk: Chunk) -> list[CommOp]:
        """The bucketed gradient reduction of ``chunk`` (:meth:`Workload.dp_grad_ops`),
        built once."""
        key = (chunk.stage, chunk.chunk)
        if key not in self.bucket_ops:
            self.bucket_ops[key] = self.work.dp_grad_ops(chunk)
        return self.bucket_ops[key]

    def _gathered_pass(self, dev: Device, actions: list[Action], i: int, block: Block,
                       gathers: dict[tuple[int, int, str, int], simpy.Event],
                       ) -> Iterator[simpy.Event]:
        """Run a pass layer by layer, each layer waiting for its gathered weights (ZeRO-3,
        or the first forward with ``overlap_param_gather``).

        Layer j's gather is issued when layer j−1 starts (one layer of prefetch, the
        in-flight limit the memory model assumes), the first layer's while the previous
        pass runs; without ``prefetch_weights`` it is issued when layer j is reached. The
        pass's block is split evenly over its layers; a wait splits its compute record
        in two, and the wait is recorded as exposed DP time.
        """
        env, act = self.env, actions[i]
        units = self._gathered_units(dev, act, block)
        kind = self._kind(act)

        parts = {0: units}  # units held → the parts' durations, split once

        def part_s(held: int, j: int) -> float:  # part j with ``held`` units taken
            if held not in parts:
                held_block = self._priced(dev.stage, act.chunk, kind, held)
                parts[held] = self._gathered_units(dev, act, held_block)
            return parts[held][j]

        seg_start, seg_from, offset = env.now, 0.0, 0.0
        for j, unit_s in enumerate(units):
            self._prefetch(dev, actions, i, j, gathers)  # no-op when already issued
            gather = gathers[(act.microbatch, act.chunk, act.kind, j)]
            if not gather.triggered:
                if env.now > seg_start:
                    self._record_part(dev, act, seg_start, seg_from, offset)
                wait_start = env.now
                yield gather
                self.dp_waits.append((dev.id, wait_start, env.now))
                seg_start, seg_from = env.now, offset
            if self.prefetch_weights:
                nxt = (i, j + 1) if j + 1 < len(units) else (i + 1, 0)
                self._prefetch(dev, actions, *nxt, gathers)
            yield from self.contention[dev.id].run(lambda held, j=j: part_s(held, j))
            offset += unit_s
        self._record_part(dev, act, seg_start, seg_from, math.inf)

    def _regathers(self, act: Action) -> bool:
        """Whether ``act``'s pass gathers each layer twice (recompute, then backward)."""
        return self.regather_for_recompute and act.kind == "B"

    def _gathered_units(self, dev: Device, act: Action, block: Block) -> list[float]:
        """Durations of the parts of a gathered pass, one gather before each: its layers
        (the block split evenly), or with :attr:`regather_for_recompute` each backward
        layer's recompute and then its backward."""
        layers = self.work.chunks[(dev.stage, act.chunk)].units
        layer_s = block.duration_s / layers
        if not self._regathers(act):
            return [layer_s] * layers
        recompute_s = sum(sp.duration_s for sp in block.spans if sp.phase == "R") / layers
        return [recompute_s, layer_s - recompute_s] * layers

    def _record_part(self, dev: Device, act: Action, start: float, block_from: float,
                     block_to: float, end: float | None = None) -> None:
        """Record the part ``[block_from, block_to)`` of a pass's block, run from ``start``
        to ``end`` (now by default)."""
        self.records.append(Record(dev.id, dev.stage, "compute", _label(act), act.kind,
                                   act.microbatch, act.chunk, start,
                                   self.env.now if end is None else end,
                                   block_from, block_to))

    def _gather_ops(self, dev: Device, act: Action) -> list[CommOp]:
        """The per-layer weight gathers ``act``'s pass waits for (empty if none,
        :meth:`Workload.gathers_before`), built once per chunk."""
        if not self.work.gathers_before(act.kind, act.microbatch):
            return []
        chunk_key = (dev.stage, act.chunk)
        if chunk_key not in self.gather_ops:
            self.gather_ops[chunk_key] = self.work.weight_gathers(self.work.chunks[chunk_key])
        return self.gather_ops[chunk_key]

    def _prefetch(self, dev: Device, actions: list[Action], i: int, layer: int,
                  gathers: dict[tuple[int, int, str, int], simpy.Event]) -> None:
        """Issue the gather of one layer's weights for action ``i``, if it needs one
        (:meth:`Workload.gathers_before`).

        The backward walks the layers in reverse, so its j-th gather is of layer L−1−j
        (of layer L−1−⌊j/2⌋ when each layer is gathered for its recompute and again for
        its backward).
        """
        if i >= len(actions):
            return
        act = actions[i]
        key = (act.microbatch, act.chunk, act.kind, layer)
        ops = self._gather_ops(dev, act)
        if not ops or key in gathers:
            return
        if act.kind == "F":
            op = ops[layer]
        else:
            op = ops[len(ops) - 1 - layer // (2 if self._regathers(act) else 1)]
        done = self.env.event()
        gathers[key] = done
        self.env.process(self._gather(dev, op, done, (act.microbatch, act.kind)))

    def _gather(self, dev: Device, op: CommOp, done: simpy.Event,
                tag: object) -> Iterator[simpy.Event]:
        """One layer's weights: :attr:`Workload.gather_messages` all-gathers back to back."""
        for message in range(self.work.gather_messages):
            yield from self._collective(dev, op, tag=(tag, message))
        done.succeed()

    def run(self) -> Trace:
        """Simulate the step and return the trace."""
        procs = [self.env.process(self._device(d)) for d in self.devices]
        self.env.run(until=simpy.AllOf(self.env, procs))
        by_stage = _by_stage(self.devices)
        opt = [r.start_s for r in self.records if r.name == "optimizer"]
        return Trace(
            records=sorted(self.records, key=lambda r: (r.device, r.start_s, r.stream)),
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
        )


def _label(act: Action) -> str:
    return f"{act.kind}{act.microbatch}" + (f"c{act.chunk}" if act.chunk else "")


def _by_stage(devices: list[Device]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = defaultdict(list)
    for d in devices:
        out[d.stage].append(d.id)
    return out
