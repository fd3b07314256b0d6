"""The parts of a step that many layouts share, priced once (the estimator's memo).

The estimator (:mod:`llmsim.search.estimate`) prices each layout's passes from blocks
that depend on a few of its fields only — the layer shape (tp, micro-batch, sequence
parallelism, recompute, the TP overlap), the placement (tp, pp, dp, nodes), a chunk's
layers — so :class:`SharedParts` keeps one of each, keyed on exactly the fields it
reads, for as long as the process lives (a search's worker prices hundreds of
thousands of layouts of one base scenario).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llmsim.blocks import Block
from llmsim.costs import HardwareCosts
from llmsim.memory import StageMemory, memory_per_stage
from llmsim.moe import pairs_overlap
from llmsim.ops import ComputeOp
from llmsim.params import layers_params_per_device, param_tensors
from llmsim.partition import chunk_first_layer, chunk_layers
from llmsim.plan import Plan
from llmsim.schedules import placement
from llmsim.search.chunk_queue import chunk_queue_s, host_binds
from llmsim.search.memo import BoundedMemo
from llmsim.specs import Parallelism, Scenario
from llmsim.workload import Chunk, PassOps, Workload, chunk_extras, chunk_params, pass_ops

KIND_MEMO = 4096
"""Layouts' kinds of stages whose passes one estimator keeps (emptied when full): the
layouts of a family — the same but for the ZeRO stage and the parameter-gather overlap —
come near one another in a batch (:mod:`.batching`), and share them."""


@dataclass(frozen=True, slots=True)
class Parts:
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
    batch_input: float = 0.0
    """Seconds of the batch's broadcasts before a chunk's forward (``PassOps.batch_input``)."""
    batch_input_on_every_chunk: bool = True
    """They come before every chunk's forward; False: the first and last chunks' only."""
    queued: PassOps | None = None
    """The layer shape's op lists where the host's issue binds in one of its blocks
    (:func:`~llmsim.search.chunk_queue.host_binds`): its chunks' passes are then priced as
    one queue each (:meth:`SharedParts._chunk_queue`); None: the blocks' sums."""


def contention_key(par: Parallelism) -> tuple[bool, bool]:
    """The switches the cost model's prices depend on besides the placement: which axes'
    transfers run at once and share links (:func:`llmsim.costs.topology.base.
    concurrent_axes`), part of every memo key of priced collectives."""
    return par.overlap_dp_comm, par.overlap_pp_comm


def servers(sc: Scenario) -> int:
    """Parameter servers of ``sc`` (0: all-reduce), which the costs and the gradient
    buckets depend on."""
    par = sc.parallelism
    return par.parameter_servers if par.dp_mode == "parameter_server" else 0


def seconds(ops: tuple, costs: HardwareCosts, overlap_tp: bool) -> float:
    return Block.of(ops, costs, overlap_tp).duration_s if ops else 0.0


def _model_flops(*ops_lists: tuple) -> float:
    return sum(op.flops for ops in ops_lists for op in ops
               if isinstance(op, ComputeOp) and op.phase != "R")


def _gemm_overlaps(par: Parallelism) -> tuple:
    """``par.tp_overlap_gemms`` as a memo key (none, the usual case, without dumping)."""
    if not par.tp_overlap_gemms:
        return ()
    return tuple(sorted((k, v.model_dump_json()) for k, v in par.tp_overlap_gemms.items()))


class SharedParts:
    """The parts of a step that layouts share, each priced once and memoised: per
    placement the plan and its costs, per layer shape the blocks' seconds, per chunk its
    parameters, extras and gradient buckets, per split the stages' runs."""

    def __init__(self) -> None:
        self._costs: dict[tuple, tuple[Plan, HardwareCosts]] = {}
        self._parts: dict[tuple, Parts] = {}
        self._extras: dict[tuple, tuple[float, float, float]] = {}
        self._grads: dict[tuple, float] = {}
        self._chunk_buckets: dict[tuple, tuple[int, float]] = {}
        self._layer_gathers: dict[tuple, float] = {}
        self._starts: dict[tuple, list[list[int]]] = {}
        self._blocks: dict[tuple, tuple[float, bool]] = {}
        self._queues: dict[tuple, tuple[float, float, float]] = {}
        self._params: dict[tuple, tuple[int, int]] = {}
        self._nodes: dict[tuple, list[int]] = {}
        self._splits: dict[tuple, list[list[int]]] = {}
        self._families: dict[tuple[int, int, int], int] = {}
        self._held: list[tuple] = []
        self._last_family: tuple[tuple, int] = ((), -1)
        self._last_scenario: tuple[Any, int] = (None, -1)
        """The scenario :meth:`_family` was last given (held: its id stays its own) and its
        index: an estimate asks for its scenario's several times."""
        self._stage_runs: dict[tuple, list] = {}
        self._messages: dict[tuple, tuple[dict[bool, float], float]] = {}
        self._optimizers: dict[tuple, float] = {}
        self._groups: dict[tuple, list] = {}
        self._placements: dict[tuple[str, int, int], tuple] = {}
        self._kinds = BoundedMemo(KIND_MEMO)

    # -- shared parts -------------------------------------------------------------------
    def _family(self, sc: Scenario) -> int:
        """An index of the scenario's system, model and training objects: every memo key
        starts with it, so one estimator can serve scenarios of several machines."""
        last = self._last_scenario
        if sc is last[0]:  # a spec is frozen: the same object, the same index
            return last[1]
        key = (id(sc.system), id(sc.model), id(sc.training))
        if key == self._last_family[0]:
            index = self._last_family[1]
        else:
            index = self._families.get(key)
            if index is None:
                index = self._families[key] = len(self._families)
                self._held.append((sc.system, sc.model, sc.training))  # keeps the ids unique
            self._last_family = (key, index)
        self._last_scenario = (sc, index)
        return index

    def plan_costs(self, sc: Scenario) -> tuple[Plan, HardwareCosts]:
        """The plan of ``sc`` and its hardware costs (one per distinct placement)."""
        par = sc.parallelism
        key = (self._family(sc), sc.nodes_used, par.tp, par.pp, sc.dp, par.ep, par.cp,
               par.etp, tuple(par.rank_order), *contention_key(par), servers(sc))
        hit = self._costs.get(key)
        if hit is None:
            plan = Plan.from_scenario(sc)
            hit = self._costs[key] = (plan, HardwareCosts.from_scenario(sc, plan))
        return hit

    def memory(self, sc: Scenario) -> list[StageMemory]:
        """:func:`memory_per_stage` of ``sc``, memoised on the fields it reads."""
        return self.memory_of(sc, sc.parallelism, sc.training, sc.dp)

    def memory_of(self, base: Scenario, par: Any, training: Any, dp: int) -> list[StageMemory]:
        """:func:`memory_per_stage` of ``base``'s model on its accelerator with the layout
        ``par``, ``training`` and ``dp`` (no scenario needed). Not memoised: a search asks
        once per layout, and a memo would hold every layout's stages."""
        return memory_per_stage(base.model, par, training, dp, base.system.node.accelerator)

    def _layer_parts(self, sc: Scenario, plan: Plan, costs: HardwareCosts) -> Parts:
        par = sc.parallelism
        tp_path = plan.placements["tp"]
        key = (self._family(sc), tp_path, plan.placements.get("ep"),
               plan.placements.get("cp"), *contention_key(par), par.tp, par.ep, par.cp,
               par.etp, par.micro_batch,
               par.sequence_parallel, par.recompute, par.overlap_tp_comm, par.tp_overlap_rs_splits,
               par.tp_overlap_comm_units, par.tp_overlap_concurrent_chunks,
               _gemm_overlaps(par), par.moe_a2a_overlap, par.moe_shared_expert_overlap,
               par.moe_comm_units, pairs_overlap(par))  # (DualPipe's pairs hide the a2a)
        hit = self._parts.get(key)
        if hit is None:
            ops, otp = pass_ops(sc.model, par, sc.training), par.overlap_tp_comm

            binds = False

            def priced(o: tuple) -> float:  # recompute variants share F, B and W
                nonlocal binds
                block_key = (self._family(sc), tp_path, plan.placements.get("ep"),
                             plan.placements.get("cp"), *contention_key(par), otp, o)
                entry = self._blocks.get(block_key)
                if entry is None:
                    block = Block.of(o, costs, otp) if o else None
                    entry = self._blocks[block_key] = (
                        (block.duration_s, host_binds(o, block, costs)) if block else (0.0, False))
                binds = binds or entry[1]
                return entry[0]

            moe = ops.moe or ops.dense
            dense_s = tuple(priced(o) for o in ops.dense)
            moe_s = tuple(priced(o) for o in moe)
            embedding_s = tuple(priced(o) for o in ops.embedding)
            head_s = tuple(priced(o) for o in ops.head)
            hit = self._parts[key] = Parts(
                dense=dense_s, moe=moe_s, embedding=embedding_s, head=head_s,
                batch_input=priced(ops.batch_input),
                batch_input_on_every_chunk=ops.batch_input_on_every_chunk,
                model_flops=(_model_flops(*ops.dense), _model_flops(*moe),
                             _model_flops(*ops.embedding), _model_flops(*ops.head)),
                queued=ops if binds else None)
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
            hit = self._extras[key] = (seconds(amax_f, costs, False),
                                       seconds(amax_b, costs, False),
                                       seconds(accumulate, costs, False))
        return hit

    def _chunk_queue(self, sc: Scenario, plan_key: tuple, costs: HardwareCosts, parts: Parts,
                     n: int, first: bool, last: bool,
                     start: int) -> tuple[float, float, float]:
        """Forward, backward and weight-gradient seconds of a chunk whose layer shape the
        host's issue binds (``parts.queued``), each pass one queue as the engine lays it
        out (:func:`~llmsim.search.chunk_queue.chunk_queue_s`), memoised on which of its
        layers are MoE blocks (what its first layer decides), not on that layer."""
        assert parts.queued is not None
        moe = sc.model.moe
        kinds = tuple(moe.is_moe_layer(i) for i in range(start, start + n)) if moe else ()
        key = (id(parts), plan_key, n, first, last, kinds)
        hit = self._queues.get(key)
        if hit is None:
            amax_f, amax_b, _ = chunk_extras(sc.model, sc.parallelism, sc.training, n, first,
                                             last, start)
            hit = self._queues[key] = chunk_queue_s(
                sc.model, sc.training, parts.queued, (amax_f, amax_b), costs,
                sc.parallelism.overlap_tp_comm, n, first, last, start)
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

    def _placement(self, schedule: str, p: int, v: int) -> tuple:
        """:func:`~llmsim.schedules.placement` of (schedule, p, v), memoised, and per
        stage its (forward, backward) pipeline sends of one micro-batch along that route
        (:func:`sends_out`; None for the looping placement, whose route is empty)."""
        hit = self._placements.get((schedule, p, v))
        if hit is None:
            hops = placement(schedule, p, v)
            hit = self._placements[(schedule, p, v)] = (
                hops, [sends_out(hops, s) for s in range(p)] if hops else None)
        return hit

    def _chunk_params(self, sc: Scenario, n: int, first: bool, last: bool,
                      start: int) -> tuple[int, int, int, int]:
        """Parameters, expert parameters and parameter tensors of a chunk on one device,
        and its MoE blocks, memoised."""
        par, model = sc.parallelism, sc.model
        moe_start = start if model.moe is not None else 0
        hops = self._placement(par.schedule, par.pp, par.virtual_stages)[0]
        # One LM head copy where the first and last chunks share a stage (ZB-V's V).
        head_p = 1 if hops and hops[0][0] == hops[-1][0] else par.pp
        # The routed experts are split over the expert ranks (tp·ep with whole experts) and
        # their matrices over etp, as the engine's workload counts them.
        ranks, etp = par.expert_ranks, par.etp
        key = (self._family(sc), par.tp, head_p, ranks, etp, n, first, last, moe_start)
        hit = self._params.get(key)
        if hit is None:
            _, experts = layers_params_per_device(model, par.tp, ranks, start, n, etp)
            moe_blocks = sum(model.moe.is_moe_layer(i) for i in range(start, start + n)) \
                if model.moe is not None else 0
            hit = self._params[key] = (
                chunk_params(model, par.tp, n, first, last, head_p, ranks, start, etp),
                experts,
                param_tensors(model, n, first, last, head_p), moe_blocks)
        return hit

    def _runs(self, plan_key: tuple, split: list[list[int]], node_of: list[int],
              sends: list[tuple[int, int]] | None = None,
              ) -> list[tuple[int, tuple, tuple[bool, bool], int]]:
        """The stages as runs of consecutive equal ones, memoised: (first stage, its kind —
        its chunks' layers and whether it is the first or the last stage —, whether its
        neighbours are on its node, stages in the run). Stages of one run also send the
        same along a placed route (``sends``: per stage its (forward, backward) sends,
        :meth:`_placement`; None: the looping placement, the same for every stage but
        the first and the last, which are kinds of their own)."""
        memo = (plan_key, id(split), id(sends))
        hit = self._stage_runs.get(memo)
        if hit is None:
            p, out, last = len(split), [], None
            for s in range(p):
                kind = (tuple(split[s]), s == 0, s == p - 1)
                within = (node_of[s] == node_of[(s + 1) % p], node_of[s] == node_of[(s - 1) % p])
                alike = (kind, within, sends[s] if sends else None)
                if alike == last:
                    out[-1][3] += 1
                else:
                    out.append([s, kind, within, 1])
                last = alike
            hit = self._stage_runs[memo] = [tuple(run) for run in out]
        return hit

    def _buckets(self, plan_key: tuple, costs: HardwareCosts, traffic: Workload,
                 chunk: Chunk) -> tuple[int, float]:
        """(count, mean seconds) of ``chunk``'s gradient buckets: each bucket's
        compute-stream kernels and its reduction, memoised."""
        memo = (plan_key, chunk.params, chunk.expert_params, traffic.zero,
                traffic.grad_all_reduce, traffic.bucket_bytes, traffic.grad_bytes_per_param,
                traffic.grad_bucket_nan_check, traffic.grad_bucket_prescale,
                traffic.bucket_matrices and chunk.units)
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

    def _layer_gather_s(self, costs: HardwareCosts, traffic: Workload, chunk: Chunk) -> float:
        """Seconds of one layer's weight gather of ``chunk`` (ZeRO-3, or ZeRO-1/2 with
        ``overlap_param_gather``; 0: none): its :meth:`Workload.gather_parts`, each
        :attr:`Workload.gather_messages` times, memoised on what :meth:`Workload.
        weight_gather` and :meth:`Workload.gather_parts` read (the costs, held as long as
        the estimator, so their id stays theirs)."""
        memo = (id(costs), chunk.params, chunk.expert_params, chunk.units, traffic.zero,
                traffic.overlap_param_gather, traffic.dp, traffic.ep, traffic.cp,
                traffic.param_bytes_per_param, traffic.gather_messages,
                traffic.gather_copies, traffic.gather_fill_passes, traffic.gather_host_s)
        hit = self._layer_gathers.get(memo)
        if hit is None:
            gather = traffic.weight_gather(chunk)
            hit = self._layer_gathers[memo] = (
                sum(costs.comm_s(part) for part in traffic.gather_parts(chunk, gather))
                * traffic.gather_messages if gather is not None else 0.0)
        return hit


def sends_out(hops: tuple[tuple[int, int], ...], s: int) -> tuple[int, int]:
    """(forward, backward) pipeline sends of one micro-batch out of stage ``s`` along a
    placed route: one per virtual stage of s whose next (previous) one is on another
    stage."""
    out_f = sum(hops[k][0] == s != hops[k + 1][0] for k in range(len(hops) - 1))
    out_b = sum(hops[k][0] == s != hops[k - 1][0] for k in range(1, len(hops)))
    return out_f, out_b
