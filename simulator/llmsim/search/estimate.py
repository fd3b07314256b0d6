"""The estimator: a step time in microseconds of work, from the engine's own cost models.

The layout search prices tens of thousands of layouts; the SimPy engine takes 0.2–9 s a
step. The estimator prices the same passes the engine replays — each chunk's forward,
backward and weight-gradient passes are the engine's :class:`~llmsim.blocks.Block` of
the same ops (:func:`llmsim.workload.pass_ops`) on the same
:class:`~llmsim.costs.HardwareCosts`, the gradient buckets and weight gathers are
:class:`~llmsim.workload.Workload`'s own, the optimizer is :func:`optimizer_step` — and
replaces only the replay: the schedule's timing is a closed form over the stages'
per-micro-batch times (:mod:`llmsim.search.pipeline`), the gradient reduction's tail a
closed form of a FIFO of equal buckets. One block per distinct layer shape is priced
once and reused by every layout that shares it (the pass of a chunk of n layers is n
blocks back to back, as the engine lays them out).

What it leaves out, and the engine keeps: compute units held by concurrent collectives
and posted sends (contention), Megatron-Core's aligned gradient launch, and the exact
interleaving of warm-up and cool-down; the search confirms its best layouts with the
engine, and ``docs/search.md`` states how far apart the two are.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from llmsim.costs import HardwareCosts
from llmsim.ops import CommOp
from llmsim.optimizer import optimizer_step
from llmsim.schedules import SPLIT_BACKWARD
from llmsim.search.estimate_record import Estimate
from llmsim.search.gathered_waits import gathered_waits_s
from llmsim.search.memo import BoundedMemo
from llmsim.search.pairs import stage_pair_parts
from llmsim.search.parts import KIND_MEMO, contention_key, servers
from llmsim.search.pipedream_updates import update_shares_s
from llmsim.search.pipeline import StageTimes, pipeline_runs_s, reduction_tail_s
from llmsim.search.stage_kinds import StageKinds
from llmsim.search.two_pipelines import Device, has_two_pipelines, phase_s
from llmsim.search.unit_reductions import unit_reductions_s
from llmsim.search.zero3_queue import (
    DEFERS_W,
    blended_wait_s,
    deferred_w_follows,
    deferred_wait_s,
    per_microbatch_s,
    stage_cooldown_shares,
)
from llmsim.specs import Parallelism, Scenario, Training
from llmsim.workload import (
    Chunk,
    Workload,
    shard_ranks,
    step_traffic,
)

TAIL_MEMO_FROM_CHUNKS = 4
"""A kind's gradient tail is memoised from this many chunks a stage on (below it the
FIFO's loop costs less than the memo's key)."""


@dataclass(slots=True)
class _Stage:
    """What a stage costs apart from its pipeline sends (equal stages share it; not frozen)."""

    times: StageTimes
    stage: int
    """The first stage of this kind (the one whose chunks are priced)."""
    tensors: int
    """Parameter tensors on one of its devices (the optimizer's kernels)."""
    flops: float
    """Model FLOPs of one micro-batch on the stage's devices (all its TP ranks)."""
    tail_s: float
    """Gradient reduction after the stage's last pass (:func:`reduction_tail_s`)."""
    params: int
    """Parameters on one of its devices."""
    expert_params: int
    """Of them, the routed experts'."""
    chunk_0: Chunk
    """Its first chunk (two pipelines: the stage's parameters, :class:`Device`)."""


class Estimator(StageKinds):
    """Prices layouts of one base scenario (its system, model and training fixed),
    memoising every part that layouts share (:class:`~llmsim.search.parts.SharedParts`)."""

    def __init__(self) -> None:
        super().__init__()
        self._pipelines = BoundedMemo(KIND_MEMO)
        """A family's pipeline phase (:func:`pipeline_runs_s`), by exactly what it reads:
        the kinds' passes (their memo entry, held in the value so that its id stays its
        own), the sends and, per kind, what differs between the family's layouts."""
        self._tails = BoundedMemo(KIND_MEMO)
        """A kind's gradient tail (:meth:`_tail_s`), by its buckets and backward passes."""

    # -- one layout ---------------------------------------------------------------------
    def estimate(self, sc: Scenario) -> Estimate:
        """The estimated step of a validated scenario (any fidelity: it is the reduced one)."""
        par, trn, model = sc.parallelism, sc.training, sc.model
        p, v, dp = par.pp, par.virtual_stages, sc.dp
        plan, costs = self.plan_costs(sc)
        plan_key = (self._family(sc), sc.nodes_used, par.tp, p, dp, par.ep, par.cp, par.etp,
                    *contention_key(par), servers(sc))
        parts = self._layer_parts(sc, plan, costs)
        traffic = step_traffic(model, par, trn, dp)
        m = traffic.microbatches
        split = self._split(sc)
        starts = self._first_layers(sc, split)
        split_backward = par.schedule in SPLIT_BACKWARD
        walked = par.schedule == "zb-v"  # its order walked (.pipeline.zb_v_walk_s)
        posted_singly = par.overlap_pp_comm and v > 1 and p > 1
        send_s, gather_s = self._pipeline_messages(costs, traffic, posted_singly, par.tp)
        node_of = self._nodes_of_stages(plan_key, plan)
        sharded = traffic.grad_ranks > 1
        zero3 = traffic.zero == 3 and sharded
        a = min(traffic.accumulate_from_microbatch, m)
        gathers_f_on, gathers_b_on = traffic.gathers_before("F", 1), traffic.gathers_before("B", 1)
        overlapped_gather = not gathers_f_on and traffic.gathers_before("F", 0)
        hops, placed_sends = self._placement(par.schedule, p, v)  # () for c·p + s
        runs = self._runs(plan_key, split, node_of, placed_sends)
        shares = stage_cooldown_shares(par.schedule, p, m, v) if zero3 else [0.0] * p
        kinds: dict[tuple, _Stage] = {}  # stages with the same chunks cost the same
        placed: list[tuple] = []  # (first stage, neighbours within its node, count, kind)
        tails: list[float] = []
        flops_per_replica = 0.0
        cooled: dict[tuple, float] = {}  # ZeRO-3: a kind's least cool-down share (.zero3_queue)
        for s, kind_key, _, count in runs if zero3 else ():
            cooled[kind_key] = min(cooled.get(kind_key, 1.0), *shares[s:s + count])
        waits_rs = zero3 and par.overlap_dp_comm and (not split_backward or walked)
        # (ZB-H1 and ZB-H2 defer W into the bubbles their closed forms subtract: a wait
        # added to W would shorten the estimate, so theirs is the cycle's, queue_wait;
        # ZB-V's walk subtracts nothing, its W passes wait as the engine's do)
        deferred = zero3 and par.overlap_dp_comm and par.schedule in DEFERS_W
        follows: dict[tuple, set] = {}  # ZB-H1/H2: a kind's stages' (W→F, W→B) counts
        if deferred:
            per_stage = deferred_w_follows(par.schedule, p, m)
            for s, kind_key, _, count in runs:
                follows.setdefault(kind_key, set()).update(per_stage[s:s + count])
        shared = self._kind_passes(sc, plan_key, costs, parts, split, starts, node_of, m, a)
        gathering = gathers_f_on or gathers_b_on or overlapped_gather or waits_rs or deferred
        for s, kind_key, within, count in runs:
            kind = kinds.get(kind_key)
            if kind is None:
                (f, b, w, w_first, flops, tensors_s, params_s, experts_s, backward, forward,
                 chunk_0, groups) = shared[kind_key]
                waited = gathers_f = gathers_b = 0.0
                queue_wait = 0.0  # ZB-H1/H2 at ZeRO-3: the slowest of the kind's stages
                grads: list[tuple[int, float]] = []
                drawn: list[tuple] = []  # per run of equal chunks: what the tail reads
                rs_waits: list[float] = []  # ZeRO-3's reduce-scatters before gathers
                gathered: list[tuple[float, int]] = []  # first forwards' (.posted_sends)
                for chunk, repeat, cf, cb, cw, acc in groups:
                    bucket = self._buckets(plan_key, costs, traffic, chunk)
                    grads += [bucket] * repeat
                    drawn.append((repeat, bucket, cb, cw + acc))
                    if not gathering:
                        continue
                    units = chunk.units
                    layer_gather = self._layer_gather_s(costs, traffic, chunk)
                    gather_b = units * layer_gather * (1 + traffic.regather_for_recompute)
                    first_wait = layer_gather + (units - 1) * max(0.0,
                                                                  layer_gather - cf / units)
                    # each sum chunk by chunk, as the engine's (not repeat × one chunk's)
                    if gathers_f_on:
                        gather_f = units * layer_gather
                        for _ in range(repeat):
                            gathers_f += gather_f
                    if gathers_b_on:
                        for _ in range(repeat):
                            gathers_b += gather_b
                    if overlapped_gather:  # the first forward's layers wait for weights
                        for _ in range(repeat):
                            waited += first_wait
                        gathered += [(layer_gather, units)] * repeat
                    if waits_rs:
                        rs_waits += [blended_wait_s(
                            bucket, layer_gather, cf / units, cb / units, cooled[kind_key],
                            regather=traffic.regather_for_recompute,
                            prefetch=par.prefetch_weights,
                            weight_s=cw + acc if units == 1 else None)] * repeat
                    if deferred:
                        queue_wait += repeat * max(deferred_wait_s(
                            bucket, layer_gather, cf / units, cb / units, pair, m,
                            regather=traffic.regather_for_recompute,
                            prefetch=par.prefetch_weights,
                            weight_s=cw + acc if units == 1 else None)
                            for pair in follows[kind_key])
                own = StageTimes(f=f, b=b, w=(w * (m - a) + w_first * a) / m
                                 + per_microbatch_s(rs_waits, m, par.schedule, p),
                                 zero_gathers_f=gathers_f, zero_gathers_b=gathers_b,
                                 grad_buckets=grads, chunk_backward=backward,
                                 first_forward_gather=waited, chunk_forward=forward,
                                 queue_wait=queue_wait, chunk_gathers=gathered)
                tail = self._tail_s(own, p, par.overlap_dp_comm, split_backward, zero3,
                                    tuple(drawn))
                kind = kinds[kind_key] = _Stage(own, s, tensors_s, flops, tail, params_s,
                                                experts_s, chunk_0)
            flops_per_replica += kind.flops * count
            placed.append((s, within, count, kind.times))
            tails.append(kind.tail_s)

        def stage_runs() -> list[tuple[StageTimes, int]]:
            """The runs of equal stages with their pipeline sends of one micro-batch (forward
            out of every virtual stage but the last, backward out of every one but the
            first) and the gathers of sliced ones."""
            out = []
            for s, within, count, own in placed:
                to_next, to_prev = send_s[within[0]], send_s[within[1]]
                out_f, out_b = placed_sends[s] if hops else (v - (s == p - 1), v - (s == 0))
                received = out_b + out_f * (1 + traffic.pp_regather_output)
                out.append((StageTimes(
                    own.f, own.b, own.w,
                    out_f * to_next if p > 1 else 0.0,
                    out_b * to_prev if p > 1 else 0.0,
                    received * gather_s if p > 1 else 0.0,
                    to_next if s < p - 1 else 0.0,
                    to_prev if s > 0 else 0.0,
                    own.zero_gathers_f, own.zero_gathers_b, own.grad_buckets,
                    own.chunk_backward, own.first_forward_gather,
                    chunk_forward=own.chunk_forward, queue_wait=own.queue_wait,
                    chunk_gathers=own.chunk_gathers), count))
            return out

        # One pipeline: the slowest kind's optimizer step (the one on the step's path).
        one_opt_s, family = 0.0, ()
        if not has_two_pipelines(par.schedule) and par.schedule != "pipedream":
            for kind in kinds.values():
                one_opt_s = max(one_opt_s,
                                self._optimizer_s(costs, par, trn, traffic, kind, sharded))
            # A family's layouts (the same but for what the stages' gradients, ZeRO gathers
            # and waits read) share their pipeline phase where those are equal.
            family = (id(shared), id(send_s), gather_s, traffic.pp_regather_output,
                      par.schedule, m, v, par.overlap_pp_comm, posted_singly, zero3,
                      par.prefetch_weights,
                      *(_pipeline_reads(kind.times, zero3) for kind in kinds.values()))

        # The pipeline phase
        tied = traffic.embedding_grad_allreduce
        if has_two_pipelines(par.schedule):  # Chimera, DualPipe: .two_pipelines
            devices = [Device(st, kinds[key].chunk_0, kinds[key].tensors,
                              kinds[key].times.grad_buckets[0])
                       for (_, key, _, n), (st, _) in zip(runs, stage_runs(), strict=True)
                       for _ in range(n)]
            pipe, ready, opt_s = phase_s(devices, par.schedule, m,
                                         blocking=not par.overlap_pp_comm,
                                         overlap_dp=par.overlap_dp_comm, traffic=traffic,
                                         costs=costs, par=par, training=trn, node_of=node_of,
                                         pairs=stage_pair_parts(sc, costs, split, starts))
        elif par.schedule == "pipedream":  # a reduction and an update after every backward
            updates = [self._optimizer_s(costs, par, trn, traffic, kinds[key], sharded)
                       for _, key, _, _ in runs]
            pipe, reduce_s, opt_s = update_shares_s(
                stage_runs(), tails, updates, m,
                tied_s=costs.comm_s(tied) if tied is not None else 0.0,
                blocking=not par.overlap_pp_comm, zero3=zero3, prefetch=par.prefetch_weights)
            ready = pipe + reduce_s
        else:
            opt_s = one_opt_s
            hit = self._pipelines.get(family)
            if hit is None:
                hit = self._pipelines.put(family, (shared, *pipeline_runs_s(
                    par.schedule, stage_runs(), m, v, blocking=not par.overlap_pp_comm,
                    posted_singly=posted_singly, zero3=zero3,
                    prefetch=par.prefetch_weights)))
            _, pipe, ends = hit
            ready = max(first + tail for (first, _), tail in zip(ends, tails, strict=True))
            if tied is not None:
                done_first, done_last = ends[0][0] + tails[0], ends[-1][1] + tails[-1]
                ready = max(ready, max(done_first, done_last) + costs.comm_s(tied))
        step = ready + opt_s + trn.step_overhead_s + gathered_waits_s(sc, costs) \
            + unit_reductions_s(sc, costs)
        accel = sc.system.node.accelerator
        return Estimate(step_time_s=step, pipeline_s=pipe, dp_tail_s=ready - pipe,
                        optimizer_s=opt_s,
                        model_flops_per_step=flops_per_replica * m * dp * par.ep * par.cp,
                        tokens_per_step=trn.tokens_per_step, devices=sc.devices,
                        peak_flops_per_device=accel.peak_flops(trn.precision),
                        run_flops=trn.flops, run_tokens=trn.tokens)

    # -- memoised on exactly what they read --------------------------------------------
    def _pipeline_messages(self, costs: HardwareCosts, traffic: Workload,
                           posted_singly: bool, tp: int) -> tuple[dict[bool, float], float]:
        """Seconds of one pipeline send ({within a node: seconds}) and of the all-gather
        that rebuilds a sliced message (0: none), memoised on the costs (one per
        placement, held as long as the estimator) and the message."""
        key = (id(costs), traffic.pp_message_bytes, posted_singly, traffic.pp_gather_bytes,
               tp)
        hit = self._messages.get(key)
        if hit is None:
            send_s = {within: costs.comm_s(CommOp("pp_send", "send_recv", "pp", "F",
                                                  traffic.pp_message_bytes,
                                                  within_node=within, two_rank=posted_singly))
                      for within in (False, True)}
            gather_s = costs.comm_s(CommOp("pp_gather", "all_gather", "tp", "F",
                                           traffic.pp_gather_bytes, copies=tp)) \
                if traffic.pp_gather_bytes else 0.0
            hit = self._messages[key] = (send_s, gather_s)
        return hit

    def _tail_s(self, st: StageTimes, p: int, overlap: bool, split_backward: bool,
                zero3: bool, drawn: tuple | None = None) -> float:
        """:func:`reduction_tail_s` of a kind's stage, memoised on what it reads (its
        chunks' buckets and backward passes, or ``drawn``: the same as runs of equal
        chunks) where its loop over the chunks is long (:data:`TAIL_MEMO_FROM_CHUNKS`):
        layouts of a family that differ only in what the buckets do not read (the
        parameter-gather overlap, a ZeRO stage whose buckets are alike) share it."""
        if not overlap or len(st.grad_buckets) < TAIL_MEMO_FROM_CHUNKS:
            return reduction_tail_s(st, p, overlap=overlap, split_backward=split_backward,
                                    zero3=zero3)
        key = (drawn or (tuple(st.grad_buckets), tuple(st.chunk_backward)), p,
               split_backward, zero3)
        hit = self._tails.get(key)
        if hit is None:
            hit = self._tails.put(key, reduction_tail_s(st, p, overlap=True,
                                                        split_backward=split_backward,
                                                        zero3=zero3))
        return hit

    def _optimizer_s(self, costs: HardwareCosts, par: Parallelism, trn: Training,
                     traffic: Workload, kind: _Stage, sharded: bool) -> float:
        """Seconds of the optimizer step of a stage of ``kind`` and, with ZeRO-1/2, the
        weight gathers after it, memoised on what :func:`optimizer_step`,
        :func:`shard_ranks` and :meth:`Workload.dp_param_gathers` read: the costs
        (placement, training), the ZeRO settings, the gradient groups and the stage's
        parameters (which they read as the sums over its chunks: one chunk of those sums
        stands for them)."""
        # ZeRO-3's persistent-parameter gather reads the stage's layers: its chunks are
        # taken as v like its first (exact with one chunk a stage)
        layers = kind.chunk_0.layers * par.virtual_stages
        key = (id(costs), par.zero, par.grad_reduce_dtype, traffic.overlap_param_gather,
               traffic.param_bytes_per_param, traffic.grad_groups, sharded, kind.params,
               kind.expert_params, kind.tensors, traffic.persistent_layer_elements, layers,
               kind.chunk_0.last)
        hit = self._optimizers.get(key)
        if hit is None:
            s = kind.stage
            work = replace(traffic, chunks={(s, 0): Chunk(
                s, 0, s, layers, False, kind.chunk_0.last, kind.params, (), (), (),
                expert_params=kind.expert_params)})
            hit = costs.compute_s(optimizer_step(par, trn, kind.params, kind.tensors,
                                                 shard_ranks(work, s)))
            hit += sum(costs.comm_s(op) for op in work.dp_param_gathers(s)) \
                if sharded else 0.0
            self._optimizers[key] = hit
        return hit


def _pipeline_reads(st: StageTimes, zero3: bool) -> tuple:
    """What :func:`pipeline_runs_s` reads of a kind's stage times beyond its passes and
    sends (shared by a family): the weight-gradient time with ZeRO-3's waits, the ZeRO-3
    gathers and reduction, the first forwards' gathers and the ZeRO-3 queue wait."""
    return (st.w, st.zero_gathers_f, st.zero_gathers_b, st.first_forward_gather,
            st.queue_wait, tuple(st.chunk_gathers), st.reduction_s if zero3 else 0.0)
