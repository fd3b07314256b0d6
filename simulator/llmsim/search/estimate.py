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
from typing import Any

from llmsim.blocks import Block
from llmsim.costs import HardwareCosts
from llmsim.memory import StageMemory, memory_per_stage
from llmsim.ops import CommOp, ComputeOp
from llmsim.optimizer import optimizer_step
from llmsim.params import layers_params_per_device, param_tensors
from llmsim.partition import chunk_first_layer, chunk_layers
from llmsim.plan import Plan
from llmsim.result import SECONDS_PER_DAY
from llmsim.schedules import SPLIT_BACKWARD, placement
from llmsim.search.pipeline import StageTimes, pipeline_runs_s, reduction_tail_s
from llmsim.specs import Scenario
from llmsim.workload import (
    Chunk,
    Workload,
    chunk_extras,
    chunk_params,
    pass_ops,
    shard_ranks,
    step_traffic,
)


@dataclass(frozen=True, slots=True)
class Estimate:
    """The estimator's prediction for one layout."""

    step_time_s: float
    pipeline_s: float
    """Forward and backward passes of every micro-batch, to the last stage's last pass."""
    dp_tail_s: float
    """Gradient reduction (and ZeRO traffic) after the last pass, on the slowest stage."""
    optimizer_s: float
    """Optimizer step and the ZeRO-1/2 weight gather after it."""
    model_flops_per_step: float
    tokens_per_step: int
    devices: int
    peak_flops_per_device: float
    run_flops: float | None
    run_tokens: float | None

    @property
    def tokens_per_s(self) -> float:
        """Training tokens per second, whole job."""
        return self.tokens_per_step / self.step_time_s

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation, 0–1."""
        return self.model_flops_per_step / self.step_time_s / self.devices \
            / self.peak_flops_per_device

    @property
    def days_to_train(self) -> float | None:
        """Days for the run's tokens or FLOP budget (as :attr:`Result.days_to_train`)."""
        if self.run_tokens is not None:
            return self.run_tokens / self.tokens_per_s / SECONDS_PER_DAY
        if self.run_flops is not None:
            return self.run_flops / (self.model_flops_per_step / self.step_time_s) \
                / SECONDS_PER_DAY
        return None


@dataclass(frozen=True, slots=True)
class _Parts:
    """The priced blocks one layer shape's chunks are made of: seconds and model FLOPs
    (per device) of each part's pass."""

    dense: tuple[float, float, float, float]
    """Forward, recompute, input-gradient and weight-gradient seconds of a dense block."""
    moe: tuple[float, float, float, float]
    """The same of an expert (MoE) block (the dense block's when the model has none)."""
    embedding: tuple[float, float, float]
    head: tuple[float, float, float]
    model_flops: tuple[float, float, float, float]
    """Per-device model FLOPs (F + B + W) of a dense block, an MoE block, the embedding
    and the head."""


@dataclass(frozen=True, slots=True)
class _Stage:
    """What a stage costs apart from its pipeline sends (shared by equal stages)."""

    times: StageTimes
    optimizer_s: float
    flops: float
    """Model FLOPs of one micro-batch on the stage's devices (all its TP ranks)."""
    tail_s: float
    """Gradient reduction after the stage's last pass (:func:`reduction_tail_s`)."""


def _seconds(ops: tuple, costs: HardwareCosts, overlap_tp: bool) -> float:
    return Block.of(ops, costs, overlap_tp).duration_s if ops else 0.0


def _model_flops(*ops_lists: tuple) -> float:
    return sum(op.flops for ops in ops_lists for op in ops
               if isinstance(op, ComputeOp) and op.phase != "R")


class Estimator:
    """Prices layouts of one base scenario (its system, model and training fixed),
    memoising every part that layouts share."""

    def __init__(self) -> None:
        self._costs: dict[tuple, tuple[Plan, HardwareCosts]] = {}
        self._parts: dict[tuple, _Parts] = {}
        self._extras: dict[tuple, tuple[float, float, float]] = {}
        self._grads: dict[tuple, float] = {}
        self._chunk_buckets: dict[tuple, tuple[int, float]] = {}
        self._starts: dict[tuple, list[list[int]]] = {}
        self._blocks: dict[tuple, float] = {}
        self._params: dict[tuple, tuple[int, int]] = {}
        self._nodes: dict[tuple, list[int]] = {}
        self._splits: dict[tuple, list[list[int]]] = {}
        self._families: dict[tuple[int, int, int], int] = {}
        self._held: list[tuple] = []

    # -- shared parts -------------------------------------------------------------------
    def _family(self, sc: Scenario) -> int:
        """An index of the scenario's system, model and training objects: every memo key
        starts with it, so one estimator can serve scenarios of several machines."""
        key = (id(sc.system), id(sc.model), id(sc.training))
        index = self._families.get(key)
        if index is None:
            index = self._families[key] = len(self._families)
            self._held.append((sc.system, sc.model, sc.training))  # keeps the ids unique
        return index

    def plan_costs(self, sc: Scenario) -> tuple[Plan, HardwareCosts]:
        """The plan of ``sc`` and its hardware costs (one per distinct placement)."""
        par = sc.parallelism
        key = (self._family(sc), sc.nodes_used, par.tp, par.pp, sc.dp, par.ep, par.cp,
               tuple(par.rank_order), self._servers(sc))
        hit = self._costs.get(key)
        if hit is None:
            plan = Plan.from_scenario(sc)
            hit = self._costs[key] = (plan, HardwareCosts.from_scenario(sc, plan))
        return hit

    @staticmethod
    def _servers(sc: Scenario) -> int:
        """Parameter servers of ``sc`` (0: all-reduce), which the costs and the gradient
        buckets depend on."""
        par = sc.parallelism
        return par.parameter_servers if par.dp_mode == "parameter_server" else 0

    def memory(self, sc: Scenario) -> list[StageMemory]:
        """:func:`memory_per_stage` of ``sc``, memoised on the fields it reads."""
        return self.memory_of(sc, sc.parallelism, sc.training, sc.dp)

    def memory_of(self, base: Scenario, par: Any, training: Any, dp: int) -> list[StageMemory]:
        """:func:`memory_per_stage` of ``base``'s model on its accelerator with the layout
        ``par``, ``training`` and ``dp`` (no scenario needed). Not memoised: a search asks
        once per layout, and a memo would hold every layout's stages."""
        return memory_per_stage(base.model, par, training, dp, base.system.node.accelerator)

    def _layer_parts(self, sc: Scenario, plan: Plan, costs: HardwareCosts) -> _Parts:
        par = sc.parallelism
        tp_path = plan.placements["tp"]
        key = (self._family(sc), tp_path, plan.placements.get("ep"),
               plan.placements.get("cp"), par.tp, par.ep, par.cp, par.micro_batch,
               par.sequence_parallel, par.recompute, par.overlap_tp_comm, par.tp_overlap_rs_splits,
               par.tp_overlap_comm_units, par.tp_overlap_concurrent_chunks,
               tuple(sorted((k, v.model_dump_json()) for k, v in par.tp_overlap_gemms.items())))
        hit = self._parts.get(key)
        if hit is None:
            ops, otp = pass_ops(sc.model, par, sc.training), par.overlap_tp_comm

            def priced(o: tuple) -> float:  # recompute variants share F, B and W
                block_key = (self._family(sc), tp_path, plan.placements.get("ep"),
                             plan.placements.get("cp"), otp, o)
                seconds = self._blocks.get(block_key)
                if seconds is None:
                    seconds = self._blocks[block_key] = _seconds(o, costs, otp)
                return seconds

            moe = ops.moe or ops.dense
            hit = self._parts[key] = _Parts(
                dense=tuple(priced(o) for o in ops.dense),
                moe=tuple(priced(o) for o in moe),
                embedding=tuple(priced(o) for o in ops.embedding),
                head=tuple(priced(o) for o in ops.head),
                model_flops=(_model_flops(*ops.dense), _model_flops(*moe),
                             _model_flops(*ops.embedding), _model_flops(*ops.head)))
        return hit

    def _chunk_extras(self, sc: Scenario, plan_key: tuple, costs: HardwareCosts, n: int,
                      first: bool, last: bool, start: int) -> tuple[float, float, float]:
        par = sc.parallelism
        key = (plan_key, par.grad_reduce_dtype, n, first, last,
               start if sc.model.moe is not None else 0)
        hit = self._extras.get(key)
        if hit is None:
            amax_f, amax_b, accumulate = chunk_extras(sc.model, par, sc.training, n, first,
                                                      last, start)
            hit = self._extras[key] = (_seconds(amax_f, costs, False),
                                       _seconds(amax_b, costs, False),
                                       _seconds(accumulate, costs, False))
        return hit

    def _nodes_of_stages(self, plan_key: tuple, plan: Plan) -> list[int]:
        """The node of each stage of the first pipeline (the engine's representative)."""
        hit = self._nodes.get(plan_key)
        if hit is None:
            hit = self._nodes[plan_key] = [plan.location(plan.rank(pp=s))[0]
                                           for s in range(plan.parallelism.pp)]
        return hit

    def _split(self, sc: Scenario) -> list[list[int]]:
        """:func:`chunk_layers` of ``sc``, memoised."""
        par = sc.parallelism
        key = (self._family(sc), par.pp, par.virtual_stages, par.first_stage_layers,
               par.last_stage_layers)
        hit = self._splits.get(key)
        if hit is None:
            hit = self._splits[key] = chunk_layers(sc.model.layers, par)
        return hit

    def _first_layers(self, sc: Scenario, split: list[list[int]]) -> list[list[int]]:
        """:func:`chunk_first_layer` of every chunk (stage, chunk), memoised; all 0 for a
        model whose layers are all alike (only an MoE model's layers differ by index)."""
        par = sc.parallelism
        key = (self._family(sc), par.pp, par.virtual_stages, par.first_stage_layers,
               par.last_stage_layers, par.schedule)
        hit = self._starts.get(key)
        if hit is None:
            if sc.model.moe is None:
                hit = [[0] * len(row) for row in split]
            else:
                hops = placement(par.schedule, par.pp, par.virtual_stages) or None
                hit = [[chunk_first_layer(split, s, c, hops) for c in range(len(row))]
                       for s, row in enumerate(split)]
            self._starts[key] = hit
        return hit

    def _chunk_params(self, sc: Scenario, n: int, first: bool, last: bool,
                      start: int) -> tuple[int, int, int, int]:
        """Parameters, expert parameters and parameter tensors of a chunk on one device,
        and its MoE blocks, memoised."""
        par, model = sc.parallelism, sc.model
        moe_start = start if model.moe is not None else 0
        hops = placement(par.schedule, par.pp, par.virtual_stages)
        # One LM head copy where the first and last chunks share a stage (ZB-V's V).
        head_p = 1 if hops and hops[0][0] == hops[-1][0] else par.pp
        key = (self._family(sc), par.tp, head_p, par.ep, n, first, last, moe_start)
        hit = self._params.get(key)
        if hit is None:
            _, experts = layers_params_per_device(model, par.tp, par.ep, start, n)
            moe_blocks = sum(model.moe.is_moe_layer(i) for i in range(start, start + n)) \
                if model.moe is not None else 0
            hit = self._params[key] = (
                chunk_params(model, par.tp, n, first, last, head_p, par.ep, start), experts,
                param_tensors(model, n, first, last, head_p), moe_blocks)
        return hit

    def _buckets(self, plan_key: tuple, costs: HardwareCosts, traffic: Workload,
                 chunk: Chunk) -> tuple[int, float]:
        """(count, mean seconds) of ``chunk``'s gradient buckets: each bucket's
        compute-stream kernels and its reduction, memoised."""
        memo = (plan_key, chunk.params, chunk.expert_params, traffic.zero,
                traffic.grad_all_reduce, traffic.bucket_bytes, traffic.grad_bytes_per_param,
                traffic.grad_bucket_nan_check, traffic.grad_bucket_prescale)
        hit = self._chunk_buckets.get(memo)
        if hit is not None:
            return hit
        count, total = 0, 0.0
        for n, op in traffic.dp_grad_buckets(chunk):
            key = (plan_key, op.axis, op.collective, op.bytes, op.staging_passes,
                   traffic.grad_bucket_nan_check, traffic.grad_bucket_prescale)
            seconds = self._grads.get(key)
            if seconds is None:
                seconds = self._grads[key] = costs.comm_s(op) + sum(
                    costs.compute_s(k) for k in traffic.grad_sync_prep(op))
            count, total = count + n, total + n * seconds
        hit = self._chunk_buckets[memo] = (count, total / count if count else 0.0)
        return hit

    # -- one layout ---------------------------------------------------------------------
    def estimate(self, sc: Scenario) -> Estimate:
        """The estimated step of a validated scenario (any fidelity: it is the reduced one)."""
        par, trn, model = sc.parallelism, sc.training, sc.model
        p, v, dp = par.pp, par.virtual_stages, sc.dp
        plan, costs = self.plan_costs(sc)
        plan_key = (self._family(sc), sc.nodes_used, par.tp, p, dp, par.ep, par.cp,
                    self._servers(sc))
        parts = self._layer_parts(sc, plan, costs)
        traffic = step_traffic(model, par, trn, dp)
        m = traffic.microbatches
        ef, eb, ew = parts.embedding
        hf, hb, hw = parts.head
        df_, dr, db, dw = parts.dense
        mf, mr, mb, mw = parts.moe
        fl_dense, fl_moe, fl_emb, fl_head = parts.model_flops
        split = self._split(sc)
        starts = self._first_layers(sc, split)
        split_backward = par.schedule in SPLIT_BACKWARD
        posted_singly = par.overlap_pp_comm and v > 1 and p > 1
        send_s = {within: costs.comm_s(CommOp("pp_send", "send_recv", "pp", "F",
                                              traffic.pp_message_bytes, within_node=within,
                                              two_rank=posted_singly))
                  for within in (False, True)}
        gather_s = costs.comm_s(CommOp("pp_gather", "all_gather", "tp", "F",
                                       traffic.pp_gather_bytes, copies=par.tp)) \
            if traffic.pp_gather_bytes else 0.0
        node_of = self._nodes_of_stages(plan_key, plan)
        sharded = traffic.grad_ranks > 1
        zero3 = traffic.zero == 3 and sharded
        a = min(traffic.accumulate_from_microbatch, m)
        overlapped_gather = traffic.gathers_before("F", 0) and not traffic.gathers_before("F", 1)
        hops = placement(par.schedule, p, v)  # () for the looping c·p + s
        virtual = {hop: k for k, hop in enumerate(hops)}
        kinds: dict[tuple, _Stage] = {}  # stages with the same chunks cost the same
        runs: list[list] = []  # [StageTimes, count] of consecutive equal stages
        keys: list[tuple] = []
        tails: list[float] = []
        flops_per_replica = opt_s = 0.0
        for s in range(p):
            kind_key = (tuple(split[s]), s == 0, s == p - 1)
            kind = kinds.get(kind_key)
            if kind is None:
                f = b = w = w_first = waited = gathers_f = gathers_b = flops = 0.0
                grads: list[tuple[int, float]] = []
                backward: list[tuple[float, float]] = []
                forward: list[float] = []
                chunks: dict[tuple[int, int], Chunk] = {}
                tensors_s = 0
                for c in range(v):
                    vs, n = virtual.get((s, c), c * p + s), split[s][c]
                    first, last = vs == 0, vs == p * v - 1
                    start = starts[s][c]
                    params, experts, tensors, k = self._chunk_params(sc, n, first, last, start)
                    amax_f, amax_b, acc = self._chunk_extras(sc, plan_key, costs, n, first,
                                                             last, start)
                    cf = first * ef + (n - k) * df_ + k * mf + amax_f + last * hf
                    cb = last * hb + (n - k) * (dr + db) + k * (mr + mb) + amax_b + first * eb
                    cw = last * hw + (n - k) * dw + k * mw + first * ew
                    f, b, w, w_first = f + cf, b + cb, w + cw + acc, w_first + cw
                    backward.append((cb, cw + acc))
                    forward.append(cf)
                    flops += ((n - k) * fl_dense + k * fl_moe + first * fl_emb
                              + last * fl_head) * par.tp
                    tensors_s += tensors
                    chunk = chunks[(s, c)] = Chunk(s, c, vs, n, first, last, params, (), (), (),
                                                   expert_params=experts)
                    grads.append(self._buckets(plan_key, costs, traffic, chunk))
                    gather = traffic.weight_gather(chunk)
                    layer_gather = (costs.comm_s(gather) * traffic.gather_messages
                                    if gather is not None else 0.0)
                    units = chunk.units
                    if traffic.gathers_before("F", 1):
                        gathers_f += units * layer_gather
                    if traffic.gathers_before("B", 1):
                        gathers_b += units * layer_gather * (1 + traffic.regather_for_recompute)
                    if overlapped_gather:  # the first forward's layers wait for their weights
                        waited += layer_gather + (units - 1) * max(0.0, layer_gather - cf / units)
                own = StageTimes(f=f, b=b, w=(w * (m - a) + w_first * a) / m,
                                 zero_gathers_f=gathers_f, zero_gathers_b=gathers_b,
                                 grad_buckets=grads, chunk_backward=backward,
                                 first_forward_gather=waited, chunk_forward=forward)
                work = replace(traffic, chunks=chunks)
                opt = costs.compute_s(optimizer_step(par, trn, work.stage_params(s), tensors_s,
                                                     shard_ranks(work, s)))
                opt += sum(costs.comm_s(op) for op in work.dp_param_gathers(s)) \
                    if sharded else 0.0
                tail = reduction_tail_s(own, p, overlap=par.overlap_dp_comm,
                                        split_backward=split_backward, zero3=zero3)
                kind = kinds[kind_key] = _Stage(own, opt, flops, tail)
            # Pipeline sends of one micro-batch (forward out of every virtual stage but the
            # last, backward out of every one but the first) and the gathers of sliced ones.
            within = (node_of[s] == node_of[(s + 1) % p], node_of[s] == node_of[(s - 1) % p])
            run_key = (kind_key, within)
            flops_per_replica += kind.flops
            opt_s = max(opt_s, kind.optimizer_s)
            if keys and keys[-1] == run_key:
                runs[-1][1] += 1
                continue
            keys.append(run_key)
            to_next, to_prev = send_s[within[0]], send_s[within[1]]
            out_f, out_b = _sends_out(hops, s) if hops else (v - (s == p - 1), v - (s == 0))
            received = out_b + out_f * (1 + traffic.pp_regather_output)
            own = kind.times
            runs.append([StageTimes(
                own.f, own.b, own.w,
                out_f * to_next if p > 1 else 0.0,
                out_b * to_prev if p > 1 else 0.0,
                received * gather_s if p > 1 else 0.0,
                to_next if s < p - 1 else 0.0,
                to_prev if s > 0 else 0.0,
                own.zero_gathers_f, own.zero_gathers_b, own.grad_buckets,
                own.chunk_backward, own.first_forward_gather,
                chunk_forward=own.chunk_forward), 1])
            tails.append(kind.tail_s)
        pipe, ends = pipeline_runs_s(par.schedule, [(st, n) for st, n in runs], m, v,
                                     blocking=not par.overlap_pp_comm,
                                     posted_singly=posted_singly, zero3=zero3,
                                     prefetch=par.prefetch_weights)
        ready = max(first + tail for (first, _), tail in zip(ends, tails, strict=True))
        tied = traffic.embedding_grad_allreduce
        if tied is not None:
            done_first, done_last = ends[0][0] + tails[0], ends[-1][1] + tails[-1]
            ready = max(ready, max(done_first, done_last) + costs.comm_s(tied))
        step = ready + opt_s + trn.step_overhead_s
        accel = sc.system.node.accelerator
        return Estimate(step_time_s=step, pipeline_s=pipe, dp_tail_s=ready - pipe,
                        optimizer_s=opt_s,
                        model_flops_per_step=flops_per_replica * m * dp * par.ep * par.cp,
                        tokens_per_step=trn.tokens_per_step, devices=sc.devices,
                        peak_flops_per_device=accel.peak_flops(trn.precision),
                        run_flops=trn.flops, run_tokens=trn.tokens)


def _sends_out(hops: tuple[tuple[int, int], ...], s: int) -> tuple[int, int]:
    """(forward, backward) pipeline sends of one micro-batch out of stage ``s`` along a
    placed route: one per virtual stage of s whose next (previous) one is on another
    stage."""
    out_f = sum(hops[k][0] == s != hops[k + 1][0] for k in range(len(hops) - 1))
    out_b = sum(hops[k][0] == s != hops[k - 1][0] for k in range(1, len(hops)))
    return out_f, out_b
