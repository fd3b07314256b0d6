"""The estimator's first forwards under ``overlap_param_gather`` on a pipeline of one chunk a
stage: each stage's first forward waits for its layers' gathered weights and the next
stage starts only when it has sent, so the waits add up along the fill
(:func:`llmsim.search.pipeline._fill_gather_delay_s`). Issue #41's audit found a MoE + CP
layout of ``openai-a100-moe`` estimated at 0.898 of the engine's step (the estimator
counted one stage's wait): it now equals the engine's."""

from __future__ import annotations

import pytest

from llmsim import load_scenario, simulate
from llmsim.search.estimate import Estimator

LAYOUT = {"tp": 4, "pp": 15, "dp": 65, "cp": 2, "ep": 2, "virtual_stages": 1, "zero": 2,
          "overlap_param_gather": True}


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "zb-h1", "zb-h2"])
def test_gathered_first_forwards_add_up_along_the_fill(schedule: str) -> None:
    base = load_scenario("openai-a100-moe")
    scenario = base.model_copy(update={
        "nodes": 1950,
        "parallelism": base.parallelism.model_copy(update={**LAYOUT, "schedule": schedule})})
    scenario = type(base).model_validate(scenario.model_dump())
    engine = simulate(scenario).step_time_s
    without = simulate(type(base).model_validate(scenario.model_dump() | {
        "parallelism": {**scenario.parallelism.model_dump(),
                        "overlap_param_gather": False}})).step_time_s
    assert engine > 1.05 * without  # the gathers outlast the layers: the fill waits
    assert Estimator().estimate(scenario).step_time_s == pytest.approx(engine, rel=0.01)
