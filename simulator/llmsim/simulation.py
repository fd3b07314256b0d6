"""One call from a scenario to a result: plan → workload → schedule → costs → engine."""

from __future__ import annotations

import gc
import math
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from operator import itemgetter

from llmsim import hetero, hetero_replicas, schedules
from llmsim.costs.collectives import posted_p2p_units
from llmsim.engine import CostModel, Device, Engine, Trace, devices_for
from llmsim.engine.devices import fold_identical_tp_ranks
from llmsim.errors import UserError
from llmsim.memory import memory_per_stage
from llmsim.plan import Plan
from llmsim.result import Result, StageBreakdown, optimal_batch_tokens
from llmsim.specs import Scenario
from llmsim.trace import PASSES
from llmsim.workload import build_workload, pp_message_bytes


def build_engine(scenario: Scenario, costs: CostModel | None = None,
                 fold_identical: bool = True) -> Engine:
    """The engine that replays one step of ``scenario`` (see :func:`simulate`), not run;
    in full fidelity, with identical tensor-parallel ranks simulated once
    (``fold_identical``, :func:`~llmsim.engine.devices.fold_identical_tp_ranks`).

    With a ``placement`` (a heterogeneous job) each stage is priced on its node group's
    hardware and the layers are split by :func:`llmsim.hetero.balanced` first. Data-parallel
    replicas on node groups have one engine per group's replica (:func:`simulate`)."""
    if scenario.placement is not None and scenario.placement.by_replicas:
        raise UserError("placement.replicas: each group's replica runs on its own engine; "
                        "simulate the scenario, or build the engine of one of "
                        "llmsim.hetero_replicas.replica_runs(scenario)")
    scenario = hetero.balanced(scenario)
    plan = Plan.from_scenario(scenario)
    par = scenario.parallelism
    workload = build_workload(scenario.model, par, scenario.training, scenario.dp)
    schedule = schedules.build(par.schedule, par.pp, workload.microbatches, par.virtual_stages)
    stage_costs = None
    if scenario.placement is not None and costs is None:
        stage_costs = costs = hetero.staged_costs(scenario)
    if costs is None:
        from llmsim.costs import HardwareCosts
        from llmsim.costs.jitter import jittered

        # The step's jitter (step 0 of the scenario's seed): a transform of the durations
        # the cost model prices, identity without noise (llmsim.costs.jitter).
        costs = jittered(HardwareCosts.from_scenario(scenario, plan), scenario)
    devices = devices_for(scenario.fidelity, par.pp, par.tp, scenario.dp)
    node_of = _node_of(plan) if scenario.placement is None else hetero.node_of(scenario)
    replicas: dict[int, tuple[int, ...]] = {}
    if scenario.fidelity == "full" and fold_identical:
        devices, replicas = fold_identical_tp_ranks(devices, par.pp, node_of)
    p2p_units = tuple(posted_p2p_units(scenario.system, workload.pp_message_bytes, within)
                      for within in (False, True))
    engine = Engine(workload, schedule, costs, devices, par.overlap_dp_comm,
                    split_backward=par.schedule in schedules.SPLIT_BACKWARD,
                    overlap_pp=par.overlap_pp_comm, overlap_tp=par.overlap_tp_comm,
                    prefetch_weights=par.prefetch_weights,
                    regather_for_recompute=workload.regather_for_recompute,
                    node_of=node_of,
                    collective_units=scenario.system.node.collective_units,
                    p2p_units=p2p_units,
                    aligned_grad_sync=par.grad_reduce_launch == "pp_aligned",
                    stage_costs=stage_costs, schedule_name=par.schedule, replicas=replicas)
    if engine.rendezvous:
        check_posted_units(scenario)
    return engine


def check_posted_units(scenario: Scenario) -> None:
    """An overlapped interleaved pipeline can have a send or receive posted with each of
    its two neighbours at once; the compute must keep some units beside them and the
    other kernels that hold units (raises :class:`UserError` when it cannot)."""
    par, node = scenario.parallelism, scenario.system.node
    if not (par.overlap_pp_comm and par.virtual_stages > 1 and par.pp > 1) \
            or schedules.placement(par.schedule, par.pp, par.virtual_stages):
        return  # sends are batched on the pipeline group: nothing is posted singly
    message = pp_message_bytes(scenario.model, par, scenario.training)
    posted = 2 * max(posted_p2p_units(scenario.system, message, within)
                     for within in (False, True))
    units = node.accelerator.gemm.compute_units
    held = node.collective_units + max(par.tp_overlap_units.values(), default=0)
    if posted + held >= units:
        raise UserError(
            f"system.node.p2p_channels_per_peer / system.network.p2p_channels_per_net_peer: "
            f"two posted pipeline operations hold {posted} of {node.accelerator.name}'s "
            f"{units} compute units and other kernels {held} more, which leaves none to "
            f"the compute of an overlapped interleaved pipeline; use fewer channels"
        )


def simulate(scenario: Scenario, costs: CostModel | None = None,
             progress: Callable[[float], None] | None = None) -> Result:
    """Simulate one training step of ``scenario``.

    ``costs`` replaces the hardware cost model (e.g. to price communication at zero in
    a what-if study); by default it is :class:`llmsim.costs.HardwareCosts`, with the
    scenario's ``jitter`` (step 0 of its seed) when it has any.
    ``progress(share)`` is called every few seconds of a long run with the share of its
    pipeline actions begun (``Engine.run``); it changes no result. With data-parallel
    replicas on node groups, each group's replica is simulated and the step waits for the
    slowest (:mod:`llmsim.hetero_replicas`).
    """
    if scenario.placement is not None and scenario.placement.by_replicas:
        split = hetero_replicas.micro_batch_split(scenario)
        runs = {key: simulate(sub, sub_costs, progress) for key, (sub, sub_costs)
                in hetero_replicas.replica_runs(scenario, split, costs).items()}
        result = hetero_replicas.combined(scenario, runs, split)
        result.warnings = _warnings(scenario, result.memory)
        return result
    with collector_paused():  # the locals (schedule, engine) freed before it resumes
        return _simulated(hetero.balanced(scenario), costs, progress)


def _simulated(scenario: Scenario, costs: CostModel | None,
               progress: Callable[[float], None] | None) -> Result:
    """:func:`simulate` of a scenario on one engine (its layers balanced)."""
    engine = build_engine(scenario, costs)
    par, trn, workload = scenario.parallelism, scenario.training, engine.work
    trace = engine.run(progress)
    step = trace.step_end_s + trn.step_overhead_s
    if not 0 < step < math.inf:
        raise UserError(
            f"the simulated step takes {step} s, which has no throughput to report; look for "
            "rates or sizes near zero or infinity in the scenario (accelerator TFLOP/s, "
            "bandwidths, the model's sizes) and correct them"
        )
    reps = _representatives(trace)
    parts = [_stage_breakdown(trace, s, step, reps[s]) for s in range(par.pp)]
    stages = [breakdown for breakdown, _ in parts]
    memory = (memory_per_stage(scenario.model, par, trn, scenario.dp,
                               scenario.system.node.accelerator)
              if scenario.placement is None else hetero.group_memory(scenario))
    return Result(
        scenario=scenario,
        workload=workload,
        trace=trace,
        memory=memory,
        step_time_s=step,
        stages=stages,
        bubble_fraction_per_stage=[bubble for _, bubble in parts],
        warnings=_warnings(scenario, memory),
    )


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while a step is built and recorded: its
    schedule's actions and its records are up to hundreds of thousands of new objects,
    none in a reference cycle, and the collector's passes over them took a third of a
    ZeRO-3 step's time. Objects freed inside cost the collector nothing when it resumes
    (a caller that keeps only a summary of the result pauses it around both).

    Those still alive (the result: its records, ~10⁴ tuples in a 1F1B step) go straight
    to the oldest generation, where a full collection sees them if they are still alive
    then, instead of a young collection scanning them all at the next allocation (a
    tenth of a 1F1B step's time): frozen and unfrozen at once (``gc.freeze``,
    ``gc.unfreeze``: two list splices), unless the caller keeps objects frozen itself."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            if not gc.get_freeze_count():
                gc.freeze()
                gc.unfreeze()
            gc.enable()


def _node_of(plan: Plan) -> Callable[[Device, int], int]:
    """The node that holds ``stage`` of a device's pipeline (its tp and dp coordinates;
    the reduced fidelity's one pipeline is the first)."""
    def node(device: Device, stage: int) -> int:
        t, d = device.pipe if isinstance(device.pipe, tuple) else (0, 0)
        return plan.location(plan.rank(tp=t, dp=d, pp=stage))[0]
    return node


_Representative = tuple[list, list, list]
"""The records, the pipeline waits and the weight-gather waits of one stage's first device."""


def _representatives(trace: Trace) -> dict[int, _Representative]:
    """Per stage, its first device's records and pipeline waits (the records are sorted
    by device: each device's are one slice, found by bisection)."""
    first: dict[int, int] = {}
    records = trace.records
    i = 0
    while i < len(records):  # one step per device
        device, stage = records[i].device, records[i].stage
        first.setdefault(stage, device)
        i = bisect_right(records, device, lo=i, key=_device_of)
    by_device: dict[int, _Representative] = {}
    for device in first.values():
        lo = bisect_left(records, device, key=_device_of)
        hi = bisect_right(records, device, lo=lo, key=_device_of)
        by_device[device] = (records[lo:hi], [], [])
    for wait in trace.pp_waits:
        if wait[0] in by_device:
            by_device[wait[0]][1].append(wait)
    for dp_wait in trace.dp_waits:
        if dp_wait[0] in by_device:
            by_device[dp_wait[0]][2].append(dp_wait)
    return {stage: by_device[device] for stage, device in first.items()}


_device_of = itemgetter(0)
"""A record's device."""


def _stage_breakdown(trace: Trace, stage: int, step_s: float,
                     rep: _Representative) -> tuple[StageBreakdown, float]:
    """Split ``step_s`` of one stage's representative device into its parts; with its
    bubble fraction (:func:`_bubble_fraction`, from the same walk over its records)."""
    records, waits, dp_waits = rep
    busy: list[float] = []  # the compute stream's passes and bucket kernels, in order
    compute = tp = a2a = cp = pp = optimizer = 0.0
    dp = sum(end - start for _, start, end in dp_waits)  # passes waiting for gathered weights
    shares: dict[int, list] = {}  # id of a block → [it, the share of it the records ran]
    pass_block = trace.pass_block()  # Trace.block_of's lookup
    # Without pairs or passes before accumulate_from_microbatch, its plain form inlined.
    blocks = trace.blocks if not trace.pass_kinds and trace.accumulate_from_microbatch <= 0 \
        else None
    inf = math.inf
    for r in records:  # each field read once: a step has ~10⁴ records, a ZeRO-3 one ~10⁵
        kind, stream = r.kind, r.stream
        if kind == "W" and stream == "dp":  # a gradient bucket: in dp's tail below
            continue
        start_s, end_s = r.start_s, r.end_s
        if stream == "compute" and kind in PASSES:  # Trace.block_of, its lookup read here
            busy.append(end_s - start_s)
            block = (blocks[(r.stage, r.chunk, kind)] if blocks is not None
                     else pass_block(r.stage, kind, r.microbatch, r.chunk))
            # Record.block_share and Record.slowed_s, inlined (a whole block's share is
            # d / d = 1.0 exactly: the same value without the arithmetic).
            duration_s = block.duration_s
            from_s, to_s = r.block_from_s, r.block_to_s
            share = (1.0 if duration_s <= 0 or (to_s == inf and from_s == 0.0) else
                     (min(to_s, duration_s) - from_s) / duration_s)
            ran = shares.get(id(block))
            if ran is None:
                shares[id(block)] = [block, share]
            else:
                ran[1] += share
            share_s = duration_s * share  # the compute units other kernels held meanwhile:
            excess = end_s - start_s - share_s
            if excess > 1e-9 * share_s:
                dp += excess
        elif kind == "D":  # a gradient bucket's kernels before its reduction
            if stream == "compute":
                busy.append(end_s - start_s)
            if end_s <= trace.stage_last_compute_s[stage]:  # later ones: the tail below
                dp += end_s - start_s
        elif kind == "O":
            if stream == "compute":
                optimizer += end_s - start_s
            elif stream == "pp":  # the tied embedding's gradient exchange
                pp += end_s - start_s
            else:  # the ZeRO weight all-gather after the optimizer: nothing overlaps it
                dp += end_s - start_s
    for block, share in shares.values():
        compute += block.compute_s * share
        tp += block.tp_s * share
        a2a += block.a2a_s * share
        cp += block.cp_s * share
    dp += trace.stage_dp_done_s[stage] - trace.stage_last_compute_s[stage]
    pp += sum(end - max(start, sent) for _, start, end, sent in waits)
    # Of the passes' slowed time, what posted sends and receives held is pipeline time.
    held_by_pp = min(trace.pp_slowed_s.get(records[0].device, 0.0) if records else 0.0, dp)
    pp, dp = pp + held_by_pp, dp - held_by_pp
    bubble = step_s - compute - tp - a2a - cp - optimizer - dp - pp
    return (StageBreakdown(stage, compute, tp, pp, dp, max(bubble, 0.0), optimizer, a2a, cp),
            _bubble_fraction(trace, busy))


def _bubble_fraction(trace: Trace, busy: list[float]) -> float:
    """Idle share of the compute stream of a stage's first device during the pipeline
    phase, ``busy`` the seconds of its passes and gradient buckets' kernels."""
    phase = max(trace.stage_last_compute_s.values())
    return (phase - sum(busy)) / phase if phase > 0 else 0.0


def _warnings(scenario: Scenario, memory: list) -> list[str]:
    out = []
    if not all(m.fits for m in memory):
        worst = max(memory, key=lambda m: m.total_bytes / m.capacity_bytes)
        out.append(f"does not fit: stage {worst.stage} needs {worst.total_bytes / 1e9:.1f} GB "
                   f"of {worst.capacity_bytes / 1e9:.1f} GB; raise tp/pp, the ZeRO stage or "
                   "recompute")
    trn = scenario.training
    if trn.seq_len > scenario.model.max_seq_len:
        what = ("its learned position embedding has only that many rows"
                if scenario.model.position_embedding == "learned"
                else "rotary positions run past the trained context")
        out.append(f"training.seq_len {trn.seq_len} is above the model's max_seq_len "
                   f"{scenario.model.max_seq_len} ({what}); priced as given — raise "
                   "model.max_seq_len if the longer context is meant")
    if trn.power_limit_w is not None:
        unclocked = sorted({g.node.accelerator.name for g in scenario.group_systems().values()
                            if g.node.accelerator.clocks is None})
        if unclocked:
            out.append(f"training.power_limit_w {trn.power_limit_w:g} W has no effect on "
                       f"{', '.join(unclocked)}: its catalog entry has no measured clocks, so "
                       "its rates stay the catalog's (docs/cost-models.md, sustained clocks); "
                       "remove the limit or give the accelerator a clocks block")
    budget = trn.flops if trn.flops is not None else (
        6 * scenario.model.active_params_per_token * trn.tokens if trn.tokens is not None else None)
    if budget is not None:
        b_opt = optimal_batch_tokens(budget)
        if trn.tokens_per_step > 2 * b_opt:
            out.append(f"global batch {trn.tokens_per_step / 1e6:.1f} M tokens is over twice "
                       f"the near-optimal {b_opt / 1e6:.1f} M tokens for {budget:.1e} FLOPs "
                       "(DeepSeek LLM batch scaling law); generalisation may suffer — consider "
                       "batch ramp-up or LAMB")
    return out
