"""The engine replays the schedules added to the registry (ZB-H2, ZB-V, Chimera,
DualPipe): with equal stages and free communication its pipeline phase is the reference
timeline's, ZB-V's V sends each message to the stage its route names, Chimera's and
DualPipe's second pipeline runs on the mirrored stages; PipeDream's steady state is
replayed as a run of steps without a flush."""

from __future__ import annotations

from collections import Counter

import pytest
from helpers import LayerOnlyCosts, make_scenario

from llmsim import schedules, simulate
from llmsim.errors import UserError
from llmsim.memory import memory_per_stage
from llmsim.steady_state import pipedream_step_s
from llmsim.workload import build_workload


def _pipeline(schedule: str, p: int, m: int, v: int = 1, **extra):
    return make_scenario(nodes=p, model__layers=2 * p * v, parallelism__tp=8,
                         parallelism__pp=p, parallelism__schedule=schedule,
                         parallelism__virtual_stages=v, training__global_batch=m, **extra)


def _pass_s(result, kind: str) -> float:
    return next(r.end_s - r.start_s for r in result.trace.records
                if r.stream == "compute" and r.kind == kind and r.stage == 1)


@pytest.mark.parametrize(("schedule", "v"), [("zb-h2", 1), ("zb-v", 2)])
@pytest.mark.parametrize(("p", "m"), [(2, 4), (4, 8), (4, 9)])
def test_the_engine_replays_the_reference_timeline(schedule: str, v: int, p: int,
                                                   m: int) -> None:
    result = simulate(_pipeline(schedule, p, m, v), costs=LayerOnlyCosts())
    f, b, w = (_pass_s(result, kind) for kind in "FBW")
    timeline = schedules.unit_timeline(schedules.build(schedule, p, m, v), f=f, b=b, w=w)
    reference = max(end for row in timeline for _, end, _ in row)
    assert max(result.trace.stage_last_compute_s.values()) == pytest.approx(reference,
                                                                              rel=1e-9)
    passes = Counter((r.stage, r.kind, r.microbatch, r.chunk) for r in result.trace.records
                     if r.stream == "compute" and r.kind in "FBW")
    assert set(passes.values()) == {1}
    assert len(passes) == 3 * p * m * v


def test_zb_v_puts_the_first_and_last_virtual_stage_on_stage_0() -> None:
    scenario = _pipeline("zb-v", 4, 8, 2, model__tied_embeddings=True)
    par = scenario.parallelism
    work = build_workload(scenario.model, par, scenario.training, scenario.dp)
    chunk = work.chunks
    assert chunk[(0, 0)].first and chunk[(0, 1)].last
    assert [chunk[(s, 1)].virtual_stage for s in range(4)] == [7, 6, 5, 4]
    assert [work.stage_of(k) for k in range(8)] == [0, 1, 2, 3, 3, 2, 1, 0]
    assert work.embedding_grad_allreduce is None  # one copy of the tied embedding
    memory = memory_per_stage(scenario.model, par, scenario.training, scenario.dp,
                              scenario.system.node.accelerator)
    assert [s.in_flight_microbatches for s in memory] == [4.0] * 4  # 1F1B's first stage
    assert memory[0].params > memory[1].params == memory[2].params  # embedding and head


def test_zb_v_needs_two_virtual_stages() -> None:
    with pytest.raises(UserError, match="set virtual_stages to 2"):
        _pipeline("zb-v", 4, 8, 1)


def test_zb_h2_holds_2p_minus_1_micro_batches() -> None:
    scenario = _pipeline("zb-h2", 4, 8)
    memory = memory_per_stage(scenario.model, scenario.parallelism, scenario.training,
                              scenario.dp, scenario.system.node.accelerator)
    assert [s.in_flight_microbatches for s in memory] == [7.0] * 4


# ---------------------------------------------------------------- Chimera


def _layout(schedule: str, p: int, m: int, **extra):
    """Like :func:`_pipeline`, any field overridable (nodes, pp, layers)."""
    fields = {"nodes": p, "model__layers": 2 * p, "parallelism__tp": 8, "parallelism__pp": p,
              "parallelism__schedule": schedule, "training__global_batch": m, **extra}
    return make_scenario(**fields)


@pytest.mark.parametrize("p", [2, 4, 8])
@pytest.mark.parametrize("units", [1, 2])
def test_the_engine_replays_chimera_with_its_closed_form_bubble(p: int, units: int) -> None:
    m = units * p
    result = simulate(_pipeline("chimera", p, m), costs=LayerOnlyCosts())
    f, b, w = (_pass_s(result, kind) for kind in "FBW")
    # A fused backward (B then W; the gradient leaves after W): one block of b + w.
    timeline = schedules.unit_timeline(schedules.build("chimera", p, m), f=f, b=b + w, w=0)
    reference = max(end for row in timeline for _, end, _ in row)
    phase = max(result.trace.stage_last_compute_s.values())
    assert phase == pytest.approx(reference, rel=1e-9)
    bubble = schedules.SCHEDULES["chimera"].bubble(p, m, 1, f, b + w, 0)
    assert phase == pytest.approx(m * (f + b + w) + bubble, rel=1e-9)
    passes = Counter((r.stage, r.kind, r.microbatch, r.chunk) for r in result.trace.records
                     if r.stream == "compute" and r.kind in "FBW")
    assert set(passes.values()) == {1}
    assert len(passes) == 3 * p * m  # each micro-batch through one pipeline's p stages
    assert {mb for (s, _, mb, c) in passes if c == 1} == {
        mb for mb in range(m) if mb % p >= p // 2}  # the second half of each unit goes up


def test_chimera_up_pipeline_runs_stage_p_minus_1_minus_s_on_stage_s() -> None:
    scenario = _pipeline("chimera", 4, 8, model__tied_embeddings=True)
    par = scenario.parallelism
    work = build_workload(scenario.model, par, scenario.training, scenario.dp)
    one = build_workload(scenario.model, par.model_copy(update={"schedule": "1f1b"}),
                         scenario.training, scenario.dp)
    assert work.pipelines == 2 and work.chunks_per_stage == 1
    for s in range(4):
        up = work.chunks[(s, 1)]
        assert up.virtual_stage == 3 - s and up.forward == work.chunks[(3 - s, 0)].forward
        assert work.stage_params(s) == one.stage_params(s) + one.stage_params(3 - s)
    assert work.chunks[(0, 0)].first and work.chunks[(0, 1)].last
    assert [work.stage_of(k, 1) for k in range(4)] == [3, 2, 1, 0]
    assert [work.stage_of(k, 0) for k in range(4)] == [0, 1, 2, 3]
    assert work.model_flops() == pytest.approx(one.model_flops(), rel=1e-12)
    assert work.embedding_grad_allreduce is None  # stage 0 holds both sums after the pair's
    assert one.embedding_grad_allreduce is not None
    memory = memory_per_stage(scenario.model, par, scenario.training, scenario.dp,
                              scenario.system.node.accelerator)
    alone = memory_per_stage(scenario.model, par.model_copy(update={"schedule": "1f1b"}),
                             scenario.training, scenario.dp, scenario.system.node.accelerator)
    for s in range(4):  # Li & Hoefler 2021 Table 1: 2·M_θ; both replicas' state
        assert memory[s].params == alone[s].params + alone[3 - s].params
        assert memory[s].optimizer_bytes == pytest.approx(
            alone[s].optimizer_bytes + alone[3 - s].optimizer_bytes, rel=1e-12)
    # m = 2p: each pipeline's 1F1B holds p − i and i + 1 (p + 1 in all); m = p: Table 1's
    assert [s.in_flight_microbatches for s in memory] == [5.0] * 4
    unit = scenario.model_copy(update={"training": scenario.training.model_copy(
        update={"global_batch": 4})})
    memory = memory_per_stage(unit.model, par, unit.training, unit.dp,
                              unit.system.node.accelerator)
    assert [s.in_flight_microbatches for s in memory] == [3.0, 4.0, 4.0, 3.0]


@pytest.mark.parametrize("zero", [0, 1])
def test_chimera_all_reduces_each_stages_two_replicas(zero: int) -> None:
    scenario = _layout("chimera", 4, 8, nodes=8, parallelism__zero=zero)
    result = simulate(scenario)
    work, dp = result.workload, scenario.dp
    assert dp == 2
    exchanges = [r for r in result.trace.records if r.name == "replica_grad_allreduce"]
    assert sorted(r.stage for r in exchanges) == [0, 1, 2, 3]
    for r in exchanges:  # after the data-parallel reductions, before the optimizer
        assert r.start_s >= result.trace.stage_dp_done_s[r.stage]
        assert r.end_s <= result.trace.optimizer_start_s
        op = work.replica_grad_exchange(r.stage)
        assert op.bytes == work.stage_params(r.stage) * work.grad_bytes_per_param / (
            dp if zero else 1)
    mirror = {r.stage: (r.start_s, r.end_s) for r in exchanges}
    assert mirror[0] == mirror[3] and mirror[1] == mirror[2]  # each pair at once
    one = simulate(_layout("1f1b", 4, 8, nodes=8, parallelism__zero=zero))
    assert not any(r.name == "replica_grad_allreduce" for r in one.trace.records)


@pytest.mark.parametrize(("extra", "message"), [
    ({"parallelism__pp": 3, "nodes": 3, "model__layers": 6}, "need an even pp"),
    ({"parallelism__zero": 3}, "zero 0 to 2"),
])
def test_chimera_bad_layouts_are_one_sentence_errors(extra: dict, message: str) -> None:
    with pytest.raises(UserError, match=message):
        _layout("chimera", 4, 8, **extra)


# ---------------------------------------------------------------- DualPipe


@pytest.mark.parametrize(("p", "m"), [(2, 4), (4, 8), (4, 10), (8, 16)])
def test_the_engine_replays_dualpipe_its_pairs_one_after_the_other(p: int, m: int) -> None:
    result = simulate(_layout("dualpipe", p, m), costs=LayerOnlyCosts())
    f, b, w = (_pass_s(result, kind) for kind in "FBW")
    timeline = schedules.unit_timeline(schedules.build("dualpipe", p, m), f=f, b=b, w=w)
    reference = max(end for row in timeline for _, end, _ in row)
    assert max(result.trace.stage_last_compute_s.values()) == pytest.approx(reference,
                                                                              rel=1e-9)
    # README: PP + 1 micro-batches' activations, 2× the parameters (stage s and p − 1 − s)
    assert [s.in_flight_microbatches for s in result.memory] == [p + 1.0] * p
    assert result.workload.pipelines == 2


@pytest.mark.parametrize("p", [4, 6, 8])
@pytest.mark.parametrize("extra", [0, 2, 2])
def test_dualpipe_bubble_is_the_readme_form_at_equal_pass_times(p: int, extra: int) -> None:
    m = 2 * p + extra * p // 2
    m += m % 2
    timeline = schedules.unit_timeline(schedules.build("dualpipe", p, m), f=1, b=1, w=1)
    step = max(end for row in timeline for _, end, _ in row)
    idle = [step - sum(end - start for start, end, _ in row) for row in timeline]
    assert idle == [schedules.SCHEDULES["dualpipe"].bubble(p, m, 1, 1, 1, 1)] * p
    assert idle[0] == p // 2 - 1
    for f, b, w in ((1, 2, 1), (2, 3, 1), (3, 4, 2)):  # pairs not overlapped: below it
        timeline = schedules.unit_timeline(schedules.build("dualpipe", p, m), f=f, b=b, w=w)
        step = max(end for row in timeline for _, end, _ in row)
        assert step - m * (f + b + w) <= schedules.SCHEDULES["dualpipe"].bubble(
            p, m, 1, f, b, w)


def test_dualpipe_needs_twice_the_stages_in_micro_batches() -> None:
    with pytest.raises(UserError, match="at least twice the stages"):
        schedules.build("dualpipe", 4, 6)


# ---------------------------------------------------------------- PipeDream


def _cycle_s(result, stage: int) -> float:
    """t_F + t_B + t_W of one micro-batch on ``stage``."""
    return sum(next(r.end_s - r.start_s for r in result.trace.records
                    if r.stream == "compute" and r.kind == kind and r.stage == stage)
               for kind in "FBW")


@pytest.mark.parametrize(("p", "m", "uneven"), [(2, 4, {}), (4, 8, {}), (8, 16, {}),
                                                (4, 8, {"model__layers": 9,
                                                        "parallelism__first_stage_layers": 3}),
                                                (4, 4, {"model__layers": 7,
                                                        "parallelism__first_stage_layers": 1})])
def test_pipedream_steady_state_runs_at_the_slowest_stage_pace(p: int, m: int,
                                                               uneven: dict) -> None:
    scenario = _layout("1f1b", p, m, **uneven)
    one_step = simulate(scenario, costs=LayerOnlyCosts())
    steady = pipedream_step_s(scenario, LayerOnlyCosts())
    # No flush: no bubble per step (the registry's 0), m micro-batches at the slowest
    # stage's pace (Narayanan et al. 2019 §3.2); 1F1B with a flush pays its fill and drain.
    assert steady == pytest.approx(m * max(_cycle_s(one_step, s) for s in range(p)),
                                   rel=1e-9)
    assert schedules.SCHEDULES["pipedream"].bubble(p, m, 1, 1, 1, 1) == 0
    assert steady < max(one_step.trace.stage_last_compute_s.values())


@pytest.mark.parametrize(("extra", "steps", "message"), [
    ({}, 2, "give a whole number ≥ 3"),
    ({"parallelism__pp": 1, "nodes": 1}, 3, "needs a pipeline"),
])
def test_pipedream_steady_state_bad_input(extra: dict, steps: int, message: str) -> None:
    with pytest.raises(UserError, match=message):
        pipedream_step_s(_layout("1f1b", 4, 8, **extra), LayerOnlyCosts(), steps=steps)


@pytest.mark.parametrize("schedule", ["chimera", "dualpipe"])
@pytest.mark.parametrize("zero", [0, 1])
def test_two_pipelines_reduced_and_full_fidelity_agree(schedule: str, zero: int) -> None:
    """Every device simulated (its replica all-reduce a barrier of the pair) gives the
    step the one-device-per-stage run gives."""
    scenario = _layout(schedule, 4, 16, parallelism__tp=4, parallelism__zero=zero)
    assert scenario.dp == 2
    reduced = simulate(scenario)
    full = simulate(scenario.model_copy(update={"fidelity": "full"}))
    assert full.step_time_s == pytest.approx(reduced.step_time_s, rel=1e-12)
    assert sum(r.name == "replica_grad_allreduce" for r in full.trace.records) \
        == len(full.trace.replicas)
