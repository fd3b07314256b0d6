"""The whole run as checkpointed segments interrupted by failures: the expected wall
time in closed form, and a seeded Monte Carlo of its spread.

The run's ``work_s`` seconds of training are cut into segments of ``interval_s`` compute
followed by a checkpoint that stops training for ``checkpoint_s`` (the last segment is
the remainder, with no checkpoint after it). Failures arrive as a Poisson process of
rate λ while the job runs (exponential times between failures, as in Young 1974 and
Daly 2006). A failure at time t into a segment loses those t seconds and costs
``restart_s`` (relaunch and checkpoint read) before the segment starts again; the
restart itself is taken not to fail (Daly lets it fail too, a factor e^{λR} on the
failure cost, which differs by λR² / 2 per failure). With an asynchronous checkpoint
still being written ``write_s`` after its snapshot, a failure within that time also
loses the previous interval.

Per segment of length L = τ + δ the failures before it completes are geometric with
success probability p = e^{−λL}; over K such segments their count is negative binomial
(K, p), and each lost time is an exponential truncated to [0, L). The expected time of a
segment is (e^{λL} − 1)·(1/λ + R + extra) (Daly 2006, eq. 13 with a failure-free
restart); the Monte Carlo draws the counts and lost times, vectorised over runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from llmsim.errors import UserError

MAX_EXACT_DRAWS = 5_000_000
"""Above this many failures over all runs the sum of each run's lost times is drawn
from its normal approximation (central limit theorem) instead of failure by failure."""
MAX_FAILURES_PER_SEGMENT = 50.0
"""λL above which a segment is not expected to complete (e^50 restarts)."""
MAX_FAILURES_PER_RUN = 1e12
"""Expected failures over a whole run above which it is refused: numpy draws a negative
binomial through a Poisson variable whose mean, (1 − p)/p·(K + 10√K) here, must stay
below about 9.2·10¹⁸ (``Generator.negative_binomial`` raises "n too large or p too
small" above), and the runs' failures are summed as 64-bit integers; 10¹² leaves room
for a million runs. A run of that many failures is absurd anyway (the fleet of
``reliability`` fails every minute for two million years)."""


@dataclass(frozen=True)
class RunPlan:
    """A run's training time, checkpoints and failure process."""

    work_s: float
    """Compute time of the whole run without interruptions, seconds."""
    interval_s: float
    """Compute time between checkpoints, seconds (inf: none)."""
    checkpoint_s: float
    """Time training stops for each checkpoint, seconds."""
    restart_s: float
    """Time from a failure to training again (relaunch and read), seconds."""
    rate_per_s: float
    """Failures per second while the job runs."""
    write_s: float = 0.0
    """Asynchronous checkpoints: time the background write takes after the snapshot, s."""

    def segments(self) -> list[tuple[int, float, float]]:
        """(count, compute seconds, segment seconds) of the full segments and the last."""
        if math.isinf(self.interval_s) or self.interval_s >= self.work_s:
            return [(1, self.work_s, self.work_s)]
        full = int(self.work_s // self.interval_s)
        rest = self.work_s - full * self.interval_s
        parts = [(full, self.interval_s, self.interval_s + self.checkpoint_s)]
        if rest > 0:
            parts.append((1, rest, rest))
        return parts

    def checkpoints(self) -> int:
        """Checkpoints written over the run."""
        return sum(n for n, compute, length in self.segments() if length > compute)

    def _extra_s(self, length_s: float) -> float:
        """Expected extra loss per failure in a segment of ``length_s``: the previous
        interval when the failure comes before the asynchronous write is done."""
        lam = self.rate_per_s
        if self.write_s <= 0 or math.isinf(self.interval_s):
            return 0.0
        return self.interval_s * -math.expm1(-lam * min(self.write_s, length_s)) / -math.expm1(
            -lam * length_s)

    def _check(self) -> None:
        for _, _, length in self.segments():
            if self.rate_per_s * length > MAX_FAILURES_PER_SEGMENT:
                raise UserError(
                    f"calendar: a segment of {length / 3600:,.1f} h between checkpoints is "
                    f"{self.rate_per_s * length:,.0f} mean times between failures long, so the "
                    "run never completes; set calendar.checkpoint_interval_s shorter or 'auto'")
        failures = sum(count * math.expm1(self.rate_per_s * length)
                       for count, _, length in self.segments())
        if failures > MAX_FAILURES_PER_RUN:
            raise UserError(
                f"calendar: the run is {self.work_s / 86400:,.3g} days of training and would "
                f"see {failures:,.3g} failures, more than the {MAX_FAILURES_PER_RUN:,.0e} its "
                "Monte Carlo draws; give a smaller training.tokens or training.flops, or a "
                "shorter calendar.checkpoint_interval_s")


@dataclass(frozen=True)
class ExpectedRun:
    """Expected wall time of a run and where it goes, seconds."""

    work_s: float
    checkpoint_s: float
    """Time stopped for checkpoints that completed."""
    lost_s: float
    """Work redone after failures."""
    restart_s: float
    """Relaunch and reload after failures."""
    failures: float
    """Expected failures over the run."""

    @property
    def wall_s(self) -> float:
        """Expected wall time of the run, seconds."""
        return self.work_s + self.checkpoint_s + self.lost_s + self.restart_s

    @property
    def goodput(self) -> float:
        """Useful share of the wall time, 0–1."""
        return self.work_s / self.wall_s


def expected_run(plan: RunPlan) -> ExpectedRun:
    """The expected wall time of ``plan`` in closed form (module docstring)."""
    plan._check()
    lam, checkpoint_s = plan.rate_per_s, 0.0
    failures = lost = 0.0
    for count, compute, length in plan.segments():
        checkpoint_s += count * (length - compute)
        if lam == 0:
            continue
        per_segment = math.expm1(lam * length)  # expected failures before it completes
        failures += count * per_segment
        mean_lost = 1.0 / lam - length / per_segment  # truncated exponential on [0, L)
        lost += count * per_segment * (mean_lost + plan._extra_s(length))
    return ExpectedRun(plan.work_s, checkpoint_s, lost, failures * plan.restart_s, failures)


def sample_runs(plan: RunPlan, runs: int, rng: np.random.Generator) -> np.ndarray:
    """Wall seconds of ``runs`` independent runs of ``plan`` drawn with ``rng``."""
    plan._check()
    lam = plan.rate_per_s
    wall = np.zeros(runs)
    for count, _, length in plan.segments():
        wall += count * length
        if lam == 0:
            continue
        failures = rng.negative_binomial(count, math.exp(-lam * length), size=runs)
        wall += failures * plan.restart_s + _lost_s(plan, length, failures, rng)
    return wall


def _lost_s(plan: RunPlan, length: float, failures: np.ndarray,
            rng: np.random.Generator) -> np.ndarray:
    """Per run, the sum of ``failures`` lost times in segments of ``length``."""
    lam = plan.rate_per_s
    tail = -math.expm1(-lam * length)  # P(a failure comes within the segment)
    total = int(failures.sum())
    if total <= MAX_EXACT_DRAWS:
        # t = -log1p(-u · tail) / λ, in place: millions of draws, and each temporary array
        # of them cost more in fresh pages than the arithmetic (the same values, bit for bit)
        t = rng.random(total)
        np.negative(t, out=t)
        t *= tail
        np.log1p(t, out=t)
        np.negative(t, out=t)
        t /= lam
        if plan.write_s > 0 and not math.isinf(plan.interval_s):
            t += plan.interval_s * (t < plan.write_s)
        run_of = np.repeat(np.arange(failures.size), failures)
        return np.bincount(run_of, weights=t, minlength=failures.size)
    mean = 1.0 / lam - length * (1 - tail) / tail
    second = _truncated_exp_second_moment(lam, length)
    extra = plan._extra_s(length)
    p_early = extra / plan.interval_s if extra else 0.0
    var = second - mean**2 + p_early * (1 - p_early) * plan.interval_s**2
    return rng.normal(failures * (mean + extra), np.sqrt(failures * max(var, 0.0)))


def _truncated_exp_second_moment(lam: float, length: float) -> float:
    """E[t²] of an exponential of rate ``lam`` truncated to [0, length)."""
    tail = -math.expm1(-lam * length)
    e = math.exp(-lam * length)
    return (2 / lam**2 - e * (length**2 + 2 * length / lam + 2 / lam**2)) / tail
