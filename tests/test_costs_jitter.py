"""Stragglers and jitter (llmsim.costs.jitter): zero noise is today's engine exactly, the
slowest-rank draw against brute-force maxima, seeds, slow devices, and the step's mean
against the closed form on a pipeline-free step."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from helpers import make_scenario
from hypothesis import given, settings
from hypothesis import strategies as st

import llmsim
from llmsim.calendar.stragglers import step_spread
from llmsim.costs import HardwareCosts
from llmsim.costs.host_issue import HostIssue
from llmsim.costs.jitter import JitteredCosts, jittered, lognormal_params, max_lognormal
from llmsim.errors import UserError
from llmsim.ops import CommOp, ComputeOp
from llmsim.plan import Plan
from llmsim.specs import Jitter


def _records(result):
    return [(r.device, r.stream, r.name, r.start_s, r.end_s) for r in result.trace.records]


@pytest.mark.parametrize("overrides", [{}, {"fidelity": "full"},
                                       {"parallelism.schedule": "interleaved-1f1b",
                                        "parallelism.virtual_stages": 2}])
def test_zero_noise_is_todays_engine_exactly(overrides):
    base = make_scenario(**overrides)
    zero = make_scenario(**overrides, **{"jitter.compute_cv": 0.0, "jitter.comm_cv": 0.0,
                                         "jitter.slow_fraction": 0.5, "jitter.slow_speed": 1.0,
                                         "jitter.steps": 3, "seed": 7})
    a, b = llmsim.simulate(base), llmsim.simulate(zero)
    assert a.step_time_s == b.step_time_s
    assert _records(a) == _records(b)
    costs = HardwareCosts.from_scenario(zero, Plan.from_scenario(zero))
    assert jittered(costs, zero, step=5) is costs


def test_selene_gpt3_without_noise_is_unchanged():
    scenario = llmsim.load_scenario("selene-gpt3")
    noisy_zero = llmsim.load_scenario("selene-gpt3", overrides=["jitter.compute_cv=0"])
    assert llmsim.simulate(noisy_zero).step_time_s == llmsim.simulate(scenario).step_time_s


def _brute_force_max(cv: float, ranks: int, samples: int, rng) -> np.ndarray:
    mu, sigma = lognormal_params(cv)
    return np.exp(mu + sigma * rng.standard_normal((samples, ranks))).max(axis=1)


@pytest.mark.parametrize(("cv", "ranks"), [(0.05, 1), (0.05, 8), (0.2, 64), (0.02, 512)])
def test_slowest_rank_draw_matches_brute_force_maxima(cv, ranks):
    rng = np.random.default_rng(1)
    brute = _brute_force_max(cv, ranks, 20_000, rng)
    drawn = np.array([max_lognormal(cv, ranks, 1.0 - u) for u in rng.random(20_000)])
    se = math.hypot(brute.std(), drawn.std()) / math.sqrt(20_000)
    assert abs(drawn.mean() - brute.mean()) < 4 * se
    assert np.percentile(drawn, 90) == pytest.approx(np.percentile(brute, 90), rel=0.01)


def test_one_rank_draw_is_mean_one_with_its_cv():
    rng = np.random.default_rng(2)
    drawn = np.array([max_lognormal(0.1, 1, 1.0 - u) for u in rng.random(40_000)])
    assert drawn.mean() == pytest.approx(1.0, abs=4 * 0.1 / math.sqrt(40_000))
    assert drawn.std() == pytest.approx(0.1, rel=0.03)


@settings(max_examples=60, deadline=None)
@given(cv=st.floats(0.001, 1.0), ranks=st.integers(1, 100_000),
       u=st.floats(1e-12, 1.0), v=st.floats(1e-12, 1.0))
def test_the_draw_is_finite_and_monotone(cv, ranks, u, v):
    lo, hi = sorted((u, v))
    x_lo, x_hi = max_lognormal(cv, ranks, lo), max_lognormal(cv, ranks, hi)
    assert 0 < x_lo <= x_hi < math.inf
    assert max_lognormal(cv, ranks, hi) <= max_lognormal(cv, ranks + 1, hi)


class UnitCosts:
    """Every op takes one second."""

    host_issue = HostIssue(0.0, 0.0)

    def compute_s(self, op):
        return 1.0

    def comm_s(self, op):
        return 1.0


def test_a_slow_device_slows_compute_bound_kernels_only():
    scenario = make_scenario()
    wrapped = JitteredCosts(UnitCosts(), Jitter(slow_fraction=0.1, slow_speed=0.8), 4,
                            np.random.default_rng(0), slow=True)
    gemm = ComputeOp("qkv", "gemm", "F", 1e9, 1e6)
    attn = ComputeOp("attn", "attention", "F", 1e9, 1e6)
    norm = ComputeOp("ln1", "memory", "F", 0.0, 1e6)
    send = CommOp("pp_send", "send_recv", "pp", "F", 1e6)
    assert wrapped.compute_s(gemm) == wrapped.compute_s(attn) == pytest.approx(1 / 0.8)
    assert wrapped.compute_s(norm) == 1.0 and wrapped.comm_s(send) == 1.0
    assert scenario.jitter.is_zero


def test_slow_devices_bound_the_step_between_healthy_and_all_slow():
    base = make_scenario()
    slow = make_scenario(**{"jitter.slow_fraction": 0.5, "jitter.slow_speed": 0.8})
    healthy_s = llmsim.simulate(base).step_time_s
    slow_s = llmsim.simulate(slow).step_time_s
    assert healthy_s < slow_s <= healthy_s / 0.8 * (1 + 1e-12)


def test_same_seed_same_steps_other_seed_other_draws_within_the_spread():
    noisy = {"jitter.compute_cv": 0.1, "jitter.comm_cv": 0.1, "jitter.steps": 12}
    a = step_spread(make_scenario(**noisy, seed=3))
    again = step_spread(make_scenario(**noisy, seed=3))
    other = step_spread(make_scenario(**noisy, seed=4))
    assert a.step_times_s == again.step_times_s
    assert a.step_times_s != other.step_times_s
    assert len(set(a.step_times_s)) == len(a.step_times_s)  # each step its own draws
    se = math.hypot(np.std(a.step_times_s), np.std(other.step_times_s)) / math.sqrt(12)
    assert abs(a.mean_s - other.mean_s) < 4 * se
    assert a.percentile_s(50) <= a.percentile_s(90) <= a.percentile_s(99)
    assert a.step_times_s[0] == llmsim.simulate(make_scenario(**noisy, seed=3)).step_time_s


def test_pipeline_free_step_mean_is_the_expected_slowest_rank():
    """tp 8 · pp 1 on one node: the step is its compute ops one after another (each at the
    slowest of 8 ranks), the TP collectives between them (no noise) and the optimizer,
    so the mean extra time is (E[max of 8] − 1) × the compute time."""
    over = {"parallelism.tp": 8, "parallelism.pp": 1, "training.global_batch": 4}
    cv, steps = 0.1, 40
    plain = llmsim.simulate(make_scenario(**over))
    spread = step_spread(make_scenario(**over, **{"jitter.compute_cv": cv,
                                                  "jitter.steps": steps}),
                         deterministic_s=plain.step_time_s)
    stage = plain.stages[0]
    assert stage.bubble_s == pytest.approx(0.0, abs=1e-9 * plain.step_time_s)
    compute_s = stage.compute_s + stage.optimizer_s
    e_max = _brute_force_max(cv, 8, 200_000, np.random.default_rng(5)).mean()
    expected = plain.step_time_s + (e_max - 1) * compute_s
    # Each step's noise averages over its ops: the standard error of the mean step is
    # the steps' own spread over √steps.
    se = np.std(spread.step_times_s) / math.sqrt(steps)
    assert abs(spread.mean_s - expected) < 4 * se + 1e-3 * plain.step_time_s
    assert spread.slowdown > 1


def test_micro_batches_draw_their_own_noise():
    """A pipeline-free step of m micro-batches sums m independent draws per pass op, so
    its coefficient of variation is 1/√m of a one-micro-batch step's (with one shared
    draw per step it would be the same); the mean is unchanged."""
    cv, steps, cvs, slowdowns = 0.2, 40, {}, {}
    for m in (1, 16):
        over = {"parallelism.tp": 8, "parallelism.pp": 1, "training.global_batch": m}
        plain_s = llmsim.simulate(make_scenario(**over)).step_time_s
        spread = step_spread(make_scenario(**over, **{"jitter.compute_cv": cv,
                                                      "jitter.steps": steps}))
        cvs[m] = np.std(spread.step_times_s) / spread.mean_s
        slowdowns[m] = spread.mean_s / plain_s
    assert 2.5 < cvs[1] / cvs[16] < 6.5  # √16 = 4, each CV known to about ±11 %
    assert slowdowns[16] == pytest.approx(slowdowns[1], rel=0.02)


def test_jittered_pass_ops_average_the_micro_batches_draws():
    scenario = make_scenario(**{"jitter.compute_cv": 0.3})
    costs = HardwareCosts.from_scenario(scenario, Plan.from_scenario(scenario))
    wrapped = jittered(costs, scenario)
    assert isinstance(wrapped, JitteredCosts) and wrapped.micro_batches == scenario.micro_batches
    gemm = ComputeOp("g", "gemm", "F", 2e12, 1e6, mnk=(1000, 1000, 1000))
    per_step = [wrapped.compute_s(gemm) for _ in range(400)]
    per_pass = [wrapped.pass_compute_s(gemm) for _ in range(400)]
    ratio = np.std(per_step) / np.std(per_pass)
    assert ratio == pytest.approx(math.sqrt(scenario.micro_batches), rel=0.25)


def test_bad_jitter_is_a_user_error():
    with pytest.raises(UserError, match="compute_cv"):
        make_scenario(**{"jitter.compute_cv": -0.1})
    with pytest.raises(UserError, match="slow_speed"):
        make_scenario(**{"jitter.slow_speed": 0})


def test_cli_reports_the_step_spread_end_to_end(tmp_path, capsys):
    from test_cli import run_cli, tiny_file

    path = tiny_file(tmp_path)
    jitter = ["--set", "jitter.compute_cv=0.05", "--set", "jitter.steps=4"]
    code, out, _ = run_cli(["run", str(path), "--json", *jitter], capsys)
    assert code == 0
    spread = json.loads(out)["step_time_spread"]
    assert spread["steps"] == 4
    assert spread["deterministic_s"] < spread["mean_s"] and spread["p50_s"] <= spread["p99_s"]
    code, out, _ = run_cli(["run", str(path), "--json"], capsys)
    assert json.loads(out)["step_time_spread"] is None
    code, out, _ = run_cli(["run", str(path), *jitter], capsys)
    assert code == 0 and "Step time with jitter (4 seeded steps)" in out


@pytest.mark.parametrize("layout", [
    {"nodes": 2, "parallelism.zero": 3, "parallelism.pp": 1},
    {"nodes": 2, "parallelism.schedule": "interleaved-1f1b", "parallelism.virtual_stages": 2},
    {"nodes": 2, "fidelity": "full"},
    {"nodes": 4, "parallelism.overlap_dp_comm": False},
])
def test_noisy_steps_keep_the_breakdown_whole(layout):
    """With data-parallel reductions, ZeRO-3 gathers, interleaving or every device
    simulated, a noisy step still splits into parts that are each ≥ 0 and add up to it."""
    noisy = {"jitter.compute_cv": 0.3, "jitter.comm_cv": 0.3, "seed": 5}
    result = llmsim.simulate(make_scenario(**layout, **noisy))
    assert all(v >= 0 for v in result.breakdown_s.values())
    assert sum(result.breakdown_s.values()) == pytest.approx(result.step_time_s, rel=1e-9)
