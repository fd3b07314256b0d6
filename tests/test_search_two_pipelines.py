"""The search over the schedules with two pipelines (llmsim.search.two_pipelines):
Chimera and DualPipe priced by the estimator as the engine replays them, and searched."""

from __future__ import annotations

import pytest
from test_search import TINY, TINY_FIX

import llmsim
from llmsim import schedules
from llmsim.search import search
from llmsim.search.confirm import layout_of_row
from llmsim.search.estimate import Estimator
from llmsim.search.space import SpaceOptions, apply, cores
from llmsim.search.two_pipelines import allows, compiled, walk
from llmsim.simulation import simulate


@pytest.mark.parametrize(("schedule", "pp", "zero", "micro_batch", "overlap_dp"), [
    ("chimera", 2, 1, 1, True), ("chimera", 4, 0, 2, True), ("chimera", 4, 2, 1, False),
    ("dualpipe", 2, 1, 2, True), ("dualpipe", 4, 1, 1, True), ("dualpipe", 4, 2, 2, False),
])
def test_estimator_agrees_with_the_engine_on_two_pipelines(schedule: str, pp: int, zero: int,
                                                           micro_batch: int,
                                                           overlap_dp: bool) -> None:
    scenario = llmsim.load_scenario(TINY, [
        f"parallelism.schedule={schedule}", f"parallelism.pp={pp}", f"parallelism.zero={zero}",
        f"parallelism.micro_batch={micro_batch}", f"parallelism.overlap_dp_comm={overlap_dp}"])
    estimate = Estimator().estimate(scenario)
    result = simulate(scenario)
    assert estimate.step_time_s == pytest.approx(result.step_time_s, rel=0.05)
    assert estimate.mfu == pytest.approx(result.mfu, rel=0.05)


@pytest.mark.parametrize("schedule", ["chimera", "dualpipe"])
def test_estimator_agrees_with_the_engine_on_gpt3_with_two_pipelines(schedule: str) -> None:
    """GPT-3 175B on 1,024 A100 (pp 8, 96 micro-batches): the first and last stages carry
    the embedding and the LM head twice over (devices 0 and p − 1)."""
    scenario = llmsim.load_scenario("selene-gpt3", [f"parallelism.schedule={schedule}"])
    assert Estimator().estimate(scenario).step_time_s == pytest.approx(
        simulate(scenario).step_time_s, rel=0.01)


@pytest.mark.parametrize(("schedule", "p", "m"), [("chimera", 4, 8), ("chimera", 6, 12),
                                                  ("dualpipe", 4, 8), ("dualpipe", 6, 16)])
def test_the_walk_of_equal_stages_equals_the_reference_timeline(schedule: str, p: int,
                                                                m: int) -> None:
    """With equal passes and free sends the walk is the schedules' reference timing
    (:func:`llmsim.schedules.unit_timeline`, whose fused backward is one pass)."""
    f, b, w = 1.0, 1.7, 0.6
    order = compiled(schedule, p, m)
    ends = walk(order, [f, b, w] * 2 * p + [f, b] * 2 * p, [0.0] * (1 + 2 * p))  # + pairs'
    split = schedule in schedules.SPLIT_BACKWARD
    timeline = schedules.unit_timeline(schedules.build(schedule, p, m), f=f,
                                       b=b if split else b + w, w=w if split else 0.0)
    assert max(ends) == pytest.approx(max(end for row in timeline for _, end, _ in row),
                                      rel=1e-12)


def test_allows_is_the_schedules_own_rule() -> None:
    for schedule in ("chimera", "dualpipe"):
        for p in (2, 3, 4, 6):
            for m in range(1, 25):
                try:
                    schedules.build(schedule, p, m)
                    built = True
                except llmsim.errors.UserError:
                    built = False
                assert allows(schedule, p, m) == built, (schedule, p, m)


def test_the_space_holds_two_pipeline_layouts_that_run() -> None:
    scenario = llmsim.load_scenario(TINY)
    fixed = {"zero": 1, "recompute": "none", "sequence_parallel": False}
    layouts = [c for c in cores(scenario, SpaceOptions(fixed=fixed))
               if c.schedule in ("chimera", "dualpipe")]
    assert {c.schedule for c in layouts} == {"chimera", "dualpipe"}
    assert all(c.pp % 2 == 0 for c in layouts)
    for layout in layouts[:6]:
        sc = apply(scenario, layout)
        assert simulate(sc).step_time_s > 0


def test_the_best_of_a_tiny_two_pipeline_space_is_the_brute_force_engine_best() -> None:
    scenario = llmsim.load_scenario(TINY)
    fix = [*TINY_FIX, "parallelism.tp=2"]
    table = search(scenario, fix=fix, top=10_000, workers=1, objective="step_time")
    assert {"chimera", "dualpipe"} <= set(table["schedule"])
    assert len(table[table["step_time_s"].notna()]) == len(table)
    two = table[table["schedule"].isin(["chimera", "dualpipe"])]
    assert two["est_over_engine"].to_numpy() == pytest.approx(1.0, rel=0.05)
    brute = min(simulate(apply(scenario, layout_of_row(r))).step_time_s
                for _, r in table.iterrows())
    assert table.iloc[0]["step_time_s"] == pytest.approx(brute, rel=1e-12)


@pytest.mark.parametrize(("overlap", "units"), [(False, 0), (True, 0), (True, 20)])
def test_dualpipe_s_overlapped_pairs_are_estimated_as_the_engine_runs_them(
        overlap: bool, units: int) -> None:
    """DualPipe with ``moe_a2a_overlap`` (llmsim.engine.pairs): the walk's paired passes
    keep only the all-to-alls the partner's computation leaves exposed, on the units the
    all-to-all kernels leave (llmsim.search.pairs), so the estimate follows the engine;
    with the overlap the step is shorter than without it, in both."""
    from test_moe_dualpipe import _scenario

    base = _scenario(overlap)
    scenario = base.model_copy(update={"parallelism": base.parallelism.model_copy(
        update={"moe_comm_units": units})})
    estimate = Estimator().estimate(scenario).step_time_s
    assert estimate == pytest.approx(simulate(scenario).step_time_s, rel=0.02)
    if overlap:
        assert estimate < Estimator().estimate(_scenario(False)).step_time_s


def test_a_pair_keeps_what_its_partner_does_not_hide() -> None:
    """:func:`llmsim.search.pairs.paired_passes`: F keeps max(0, a_F − c_B − c_W), B
    max(0, a_B − c_F)."""
    from llmsim.search.pairs import PairParts, paired_passes

    own, partner = PairParts(1.0, 0.5, 2.0, 3.0, 0.25), PairParts(0.4, 0.0, 0.1, 0.0, 0.1)
    assert paired_passes(own, partner) == pytest.approx((1.3, 4.6))
    assert paired_passes(partner, own) == (0.4, 0.1)
