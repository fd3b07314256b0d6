"""The engine replays the schedules added to the registry (ZB-H2, ZB-V): with equal
stages and free communication its pipeline phase is the reference timeline's, and ZB-V's
V sends each message to the stage its route names."""

from __future__ import annotations

from collections import Counter

import pytest
from helpers import LayerOnlyCosts, make_scenario

from llmsim import schedules, simulate
from llmsim.errors import UserError
from llmsim.memory import memory_per_stage
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
