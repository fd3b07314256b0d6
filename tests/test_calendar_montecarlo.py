"""The whole run: expected wall time in closed form, the seeded Monte Carlo around it."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmsim.calendar.montecarlo import RunPlan, expected_run, sample_runs
from llmsim.errors import UserError

DAY = 86_400.0
HUNDRED_DAYS = RunPlan(work_s=100 * DAY, interval_s=3600.0, checkpoint_s=120.0,
                       restart_s=900.0, rate_per_s=1 / (3 * 3600))


def test_without_failures_the_run_is_its_work_and_checkpoints():
    plan = RunPlan(work_s=10 * DAY + 1800, interval_s=DAY, checkpoint_s=60.0,
                   restart_s=600.0, rate_per_s=0.0)
    run = expected_run(plan)
    assert plan.checkpoints() == 10
    assert run.wall_s == 10 * DAY + 1800 + 10 * 60
    assert (run.failures, run.lost_s, run.restart_s) == (0, 0, 0)
    walls = sample_runs(plan, 50, np.random.default_rng(1))
    assert np.all(walls == run.wall_s)


def test_one_segment_matches_the_renewal_closed_form():
    # E[T] = (e^{λL} − 1)(1/λ + R) for a segment of L that restarts after R on a failure
    lam, length, restart = 1 / 5000, 7000.0, 300.0
    plan = RunPlan(work_s=length, interval_s=math.inf, checkpoint_s=0.0,
                   restart_s=restart, rate_per_s=lam)
    closed = math.expm1(lam * length) * (1 / lam + restart)
    assert expected_run(plan).wall_s == pytest.approx(closed)


def test_monte_carlo_mean_agrees_with_the_closed_form():
    walls = sample_runs(HUNDRED_DAYS, 4000, np.random.default_rng(7))
    expected = expected_run(HUNDRED_DAYS).wall_s
    assert abs(walls.mean() - expected) < 4 * walls.std() / math.sqrt(walls.size)


def test_asynchronous_write_window_loses_the_previous_interval_too():
    sync = RunPlan(work_s=30 * DAY, interval_s=3600.0, checkpoint_s=10.0, restart_s=600.0,
                   rate_per_s=1 / 7200)
    late = RunPlan(**{**sync.__dict__, "write_s": 300.0})
    lam, length = sync.rate_per_s, 3610.0
    per_failure = 3600.0 * -math.expm1(-lam * 300.0) / -math.expm1(-lam * length)
    failures = expected_run(sync).failures
    extra = expected_run(late).lost_s - expected_run(sync).lost_s
    assert extra == pytest.approx(per_failure * failures, rel=1e-3)
    walls = sample_runs(late, 4000, np.random.default_rng(3))
    assert abs(walls.mean() - expected_run(late).wall_s) < 4 * walls.std() / math.sqrt(4000)


def test_same_seed_same_answer_other_seeds_other_draws_within_the_spread():
    a = sample_runs(HUNDRED_DAYS, 1000, np.random.default_rng(0))
    b = sample_runs(HUNDRED_DAYS, 1000, np.random.default_rng(0))
    assert np.array_equal(a, b)
    p10, p90 = np.percentile(a, [10, 90])
    for seed in (1, 2, 3):
        c = sample_runs(HUNDRED_DAYS, 1000, np.random.default_rng(seed))
        assert not np.array_equal(a, c)
        assert p10 < np.median(c) < p90


def test_a_hundred_day_run_takes_well_under_a_second():
    start = time.perf_counter()
    sample_runs(HUNDRED_DAYS, 1000, np.random.default_rng(0))
    assert time.perf_counter() - start < 1.0


def test_many_failures_use_the_normal_approximation_and_keep_the_mean():
    plan = RunPlan(work_s=300 * DAY, interval_s=600.0, checkpoint_s=5.0, restart_s=60.0,
                   rate_per_s=1 / 900)  # ~29,000 failures a run, 5.8 M over 200 runs
    walls = sample_runs(plan, 200, np.random.default_rng(5))
    assert abs(walls.mean() - expected_run(plan).wall_s) < 4 * walls.std() / math.sqrt(200)


def test_a_run_that_cannot_finish_is_a_user_error():
    plan = RunPlan(work_s=100 * DAY, interval_s=30 * DAY, checkpoint_s=60.0,
                   restart_s=600.0, rate_per_s=1 / 3600)
    with pytest.raises(UserError, match="checkpoint_interval_s"):
        expected_run(plan)


@settings(max_examples=30)
@given(st.floats(1e-7, 1e-4), st.floats(1.5, 10.0))
def test_goodput_falls_as_failures_grow(rate, factor):
    plan = RunPlan(work_s=20 * DAY, interval_s=1800.0, checkpoint_s=30.0, restart_s=600.0,
                   rate_per_s=rate)
    more = RunPlan(**{**plan.__dict__, "rate_per_s": rate * factor})
    assert expected_run(more).goodput < expected_run(plan).goodput <= 1
