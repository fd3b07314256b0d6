"""Runs of equal stages: the estimator prices consecutive equal stages once, as a run
(:meth:`llmsim.search.parts.SharedParts._runs`), and the pipeline's closed forms and
walks over runs (:func:`llmsim.search.pipeline.pipeline_runs_s`) give what they give over
the same stages one by one, but for the floating-point order of their sums; a stage's
gradient tail is memoised on its runs of equal chunks (``Estimator._tail_s``)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_search_fast import _valid_layouts

import llmsim
from llmsim.search.estimate import Estimator
from llmsim.search.parts import SharedParts
from llmsim.search.pipeline import StageTimes, pipeline_runs_s, reduction_tail_s
from llmsim.search.price import state_fits
from llmsim.search.space import SpaceOptions, cores

REL = 1e-12
"""Sums over a run (a stage's time by its count) against stage by stage."""

_seconds = st.sampled_from([0.0, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 0.1, 0.7])


@st.composite
def _runs(draw: st.DrawFn, v: int) -> list[tuple[StageTimes, int]]:
    """Runs of stages with random passes, sends and ZeRO-3 parts (two chunks a stage
    where ``v`` is 2, ZB-V's)."""
    runs = []
    for _ in range(draw(st.integers(1, 4))):
        f, b, w = draw(_seconds), draw(_seconds), draw(_seconds)
        buckets = [(draw(st.integers(0, 3)), draw(_seconds)) for _ in range(v)]
        runs.append((StageTimes(
            f=f + 0.1, b=b + 0.1, w=w, sends_f=draw(_seconds), sends_b=draw(_seconds),
            hop_f=draw(_seconds), hop_b=draw(_seconds), zero_gathers_f=draw(_seconds),
            zero_gathers_b=draw(_seconds), grad_buckets=buckets,
            chunk_backward=[(b / v, w / v)] * v, chunk_forward=[f / v] * v,
            first_forward_gather=draw(_seconds), queue_wait=draw(_seconds)),
            draw(st.integers(1, 4))))
    return runs


@settings(max_examples=300, deadline=None)
@given(data=st.data(),
       schedule=st.sampled_from(["1f1b", "gpipe", "interleaved-1f1b", "zb-h1", "zb-h2",
                                 "pipedream", "zb-v"]),
       m=st.integers(1, 24), blocking=st.booleans(), posted=st.booleans(),
       zero3=st.booleans(), prefetch=st.booleans())
def test_runs_price_as_their_stages_one_by_one(data: st.DataObject, schedule: str, m: int,
                                               blocking: bool, posted: bool, zero3: bool,
                                               prefetch: bool) -> None:
    """The phase's length over runs equals it over the stages one by one; per run, the
    latest end is its stages' latest and the last end its last stage's."""
    v = 2 if schedule in ("zb-v", "interleaved-1f1b") else 1
    runs = data.draw(_runs(v))
    kw = {"blocking": blocking, "posted_singly": posted and schedule == "interleaved-1f1b",
          "zero3": zero3, "prefetch": prefetch}
    total, ends = pipeline_runs_s(schedule, runs, m, v, **kw)
    single, stage_ends = pipeline_runs_s(schedule, [(st_, 1) for st_, n in runs
                                                    for _ in range(n)], m, v, **kw)
    assert total == pytest.approx(single, rel=REL, abs=1e-12)
    s = 0
    for (_, n), (latest, last) in zip(runs, ends, strict=True):
        assert latest == pytest.approx(max(first for first, _ in stage_ends[s:s + n]),
                                       rel=REL, abs=1e-12)
        assert last == pytest.approx(stage_ends[s + n - 1][1], rel=REL, abs=1e-12)
        s += n


class _OneStageARun(Estimator):
    """The estimator with every stage its own run (what it priced before runs merged)."""

    def _runs(self, plan_key: tuple, split: list[list[int]], node_of: list[int],
              sends: list | None = None) -> list:
        merged = SharedParts._runs(self, plan_key, split, node_of, sends)
        return [(s + k, kind, within, 1) for s, kind, within, n in merged for k in range(n)]


@pytest.mark.parametrize("name", ["selene-gpt3", "frontier", "frontier-moe", "deepseek-v3"])
def test_stages_merged_into_runs_price_as_one_by_one(name: str) -> None:
    """On a seeded sample of the scenario's layouts (every schedule, ZeRO 0–3, the overlap
    switches; A100, MI250X and H800 machines, dense and MoE models), the estimates with
    runs equal those with one stage a run within :data:`REL`; deep pipelines' middle
    stages do merge."""
    scenario = llmsim.load_scenario(name).model_copy(update={"fidelity": "reduced"})
    # (other machines' and MoE models' whole spaces take long to enumerate: at their tp)
    fixed = {} if name == "selene-gpt3" else {"tp": scenario.parallelism.tp}
    fixed |= {"micro_batch": 1} if scenario.model.moe else {}
    space = list(cores(scenario, SpaceOptions(fixed=fixed), state_fits(scenario, 0.1)))
    sample = sorted(random.Random(11).sample(space, 40))
    merged, single, compared = Estimator(), _OneStageARun(), 0
    for layout, sc in _valid_layouts(scenario, sample):
        got, want = merged.estimate(sc), single.estimate(sc)
        for field in ("step_time_s", "pipeline_s", "dp_tail_s", "optimizer_s",
                      "model_flops_per_step"):
            assert getattr(got, field) == pytest.approx(getattr(want, field), rel=REL), \
                (layout.key, field)
        compared += 1
    assert compared > 40
    assert len(merged._stage_runs) and any(n > 1 for runs in merged._stage_runs.values()
                                           for *_, n in runs)


_TAILS = Estimator()
"""One estimator across the examples below: its tail memo meets keys again."""


@settings(max_examples=200, deadline=None)
@given(groups=st.lists(st.tuples(st.integers(1, 6), st.integers(0, 3),
                                 st.sampled_from([0.0, 0.25, 1.5]),
                                 st.sampled_from([0.5, 1.0]), st.sampled_from([0.0, 0.5])),
                       min_size=1, max_size=4),
       p=st.integers(1, 4), split=st.booleans(), zero3=st.booleans())
def test_a_tail_memoised_on_runs_of_chunks_equals_the_fifo(groups: list, p: int, split: bool,
                                                           zero3: bool) -> None:
    """The tail memoised on a stage's runs of equal chunks ((chunks, bucket, backward,
    weight-gradient) each) is :func:`reduction_tail_s` of the chunks one by one."""
    times = StageTimes(1.0, 1.0, 1.0,
                       grad_buckets=[(n, s) for k, n, s, _, _ in groups for _ in range(k)],
                       chunk_backward=[(b, w) for k, _, _, b, w in groups for _ in range(k)])
    drawn = tuple((k, (n, s), b, w) for k, n, s, b, w in groups)
    want = reduction_tail_s(times, p, overlap=True, split_backward=split, zero3=zero3)
    assert _TAILS._tail_s(times, p, True, split, zero3, drawn) == want
