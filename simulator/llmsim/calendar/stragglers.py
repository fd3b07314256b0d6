"""Stragglers: the step time's mean and tail over seeded steps simulated with per-op
noise and slow devices (:func:`step_spread`; the noise itself is drawn by the cost model,
:mod:`llmsim.costs.jitter`), and an analytical estimate beside it.

The analytical estimate answers the simpler question "if each of n ranks' step time
varied independently around the simulated one, how much longer would the synchronous step
be on average?" with the expected maximum of n normal draws.

Blom's approximation of the expected largest of n standard normal order statistics
(Blom 1958, "Statistical estimates and transformed beta-variables"; Harter 1961 tabulates
the exact values): E[max] ≈ Φ⁻¹((n − 0.375) / (n + 0.25)). It is 4.5 % high at n = 2
(exactly 1/√π) and within 1 % of the exact value from n = 8 to 10⁵
(tests/test_calendar_stragglers.py). Independence is an assumption: measured stragglers
are often one slow rank that stays slow for the whole job (Lin et al., "Understanding
stragglers in large model training using what-if analysis", OSDI 2025), which this
estimate does not describe.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from llmsim.costs import HardwareCosts
from llmsim.costs.jitter import jittered
from llmsim.errors import UserError
from llmsim.plan import Plan
from llmsim.simulation import simulate
from llmsim.specs import Jitter, Scenario


def expected_max_standard_normal(n: int) -> float:
    """E[max of n independent standard normals] (Blom's approximation; 0 for n = 1)."""
    if n < 1:
        raise UserError(f"stragglers: participants = {n}; give at least 1")
    return NormalDist().inv_cdf((n - 0.375) / (n + 0.25))


def straggler_step_s(step_time_s: float, cv: float, participants: int) -> float:
    """Mean synchronous step time when each of ``participants`` ranks' own step time is
    normal with mean ``step_time_s`` and coefficient of variation ``cv``, independently,
    and the step ends when the slowest ends, seconds."""
    if cv < 0:
        raise UserError(f"stragglers: cv = {cv}; give a coefficient of variation ≥ 0")
    return step_time_s * (1 + cv * expected_max_standard_normal(participants))


@dataclass(frozen=True)
class StepSpread:
    """The step time over seeded steps of a scenario with jitter (llmsim.costs.jitter)."""

    step_times_s: tuple[float, ...]
    """Each seeded step's time, seconds (step 0 is what :func:`llmsim.simulate` gives)."""
    deterministic_s: float
    """The step without noise, seconds."""

    @property
    def mean_s(self) -> float:
        """Mean step time, seconds."""
        return float(np.mean(self.step_times_s))

    def percentile_s(self, q: float) -> float:
        """The ``q``-th percentile of the step time (linear interpolation), seconds."""
        return float(np.percentile(self.step_times_s, q))

    @property
    def slowdown(self) -> float:
        """Mean step time over the deterministic one (1: no straggler cost)."""
        return self.mean_s / self.deterministic_s

    def to_dict(self) -> dict[str, float | int]:
        """Plain JSON-able values, units in the key names."""
        return {"steps": len(self.step_times_s), "deterministic_s": self.deterministic_s,
                "mean_s": self.mean_s, "p50_s": self.percentile_s(50),
                "p90_s": self.percentile_s(90), "p99_s": self.percentile_s(99),
                "slowdown": self.slowdown}


def step_spread(scenario: Scenario, steps: int | None = None,
                deterministic_s: float | None = None) -> StepSpread:
    """Simulate ``steps`` seeded steps of ``scenario`` (default ``jitter.steps``), each
    with its own draws of the per-op noise and the seed's slow devices, and the step
    without noise (or take it as ``deterministic_s``)."""
    steps = steps or scenario.jitter.steps
    plan = Plan.from_scenario(scenario)
    times = tuple(
        simulate(scenario, costs=jittered(HardwareCosts.from_scenario(scenario, plan),
                                          scenario, step)).step_time_s
        for step in range(steps))
    if deterministic_s is None:
        deterministic_s = simulate(scenario.model_copy(update={"jitter": Jitter()})).step_time_s
    return StepSpread(times, deterministic_s)
