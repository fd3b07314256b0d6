"""Stragglers and jitter: a cost model that scales every duration another one prices by a
seeded random factor (design §13: the engine's one random hook).

**Where it hooks.** :func:`llmsim.simulation.build_engine` wraps the hardware cost model
with :func:`jittered` when the scenario has a non-zero ``jitter:`` section. Every
duration the engine replays comes from its cost model — each pass's ops in
:meth:`llmsim.blocks.Block.of`, the pipeline sends and gathers, the gradient buckets, the
optimizer — so any replay of the same blocks sees the noise and none draws it itself.
With no noise :func:`jittered` returns the cost model it was given, untouched: the step
is the deterministic one, exactly.

**The slowest rank.** With symmetry reduction one simulated device stands for the
R = devices / pp ranks of its pipeline stage, which meet at every tensor-parallel
collective and, at the gradient reduction, across data-parallel replicas. Each rank's
kernel time is the cost model's times a mean-one lognormal factor X of coefficient of
variation ``compute_cv`` (σ² = ln(1 + cv²), μ = −σ²/2), independent across ranks, ops and
steps; the representative runs each compute op at the **maximum** of its R ranks'
factors, so every collective and pipeline hand-off after it starts when the slowest rank
arrives. The maximum of R independent draws has the CDF F(x)^R, drawn exactly by
inversion: x = F⁻¹(U^{1/R}) = exp(μ − σ·Φ⁻¹(1 − U^{1/R})), the tail probability
1 − U^{1/R} computed as −expm1(ln U / R) so that it keeps its digits at R = 10⁵. This is
exact where ranks synchronise after every op (a tensor-parallel group) and an upper
bound where they synchronise less often (data-parallel replicas meet only at the
gradient reduction: the maximum of sums is at most the sum of maxima).

**Communication.** A collective or transfer is one event for its group: one mean-one
lognormal factor of coefficient of variation ``comm_cv`` per op and step (the ranks'
arrival skew is already in the compute draws before it).

**Slow devices.** Of the job's N devices, K ~ Binomial(N, ``slow_fraction``) run their
compute-bound kernels (GEMMs, attention) at ``slow_speed``, drawn once per seed: the same
devices stay slow for every step, as the persistent stragglers that Lin et al. ("Understanding
stragglers in large model training using what-if analysis", OSDI 2025) report. With
K ≥ 1 every stage's compute-bound kernels run at the slow speed: a pipeline's steady state
runs at the pace of its slowest stage and the other replicas wait for it at the gradient
reduction, so slowing every stage rather than the slow device's own overstates only the
warm-up and cool-down. Memory-bound kernels keep their time (a lower SM clock leaves HBM
bandwidth as it is: an H100 runs memory-bound kernels at full clock, 559 W, while its
GEMMs throttle, ``hardware/accelerators/h100-sxm5-80gb.yaml``).

**Per micro-batch.** The engine prices each distinct pass once per step and replays it
for each of the step's m micro-batches (:mod:`llmsim.blocks`). A pass's op is therefore
priced by :meth:`JitteredCosts.pass_compute_s` / :meth:`~JitteredCosts.pass_comm_s` at the
**mean of m independent factors**, one per micro-batch: the op's total over the step then
has the mean and the variance of m independent draws (m·E[X] and m·Var[X], where one
shared factor would give m²·Var[X]). What the mean loses is the order of the draws
within the step — which micro-batch drew the slow one — which moves the pipeline's
critical path only in the warm-up and cool-down. The pipeline sends (priced once per
stage pair, :mod:`llmsim.engine.pipeline`) are drawn the same way; ops that run once per
step (the optimizer, the gradient buckets' preparation and reduction) draw one factor.

**Draws.** Factors come from a :class:`numpy.random.Generator` seeded from
(``seed``, step), in the order the engine prices its ops; the slow devices from
(``seed``). Same seed and step, same factors.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

from llmsim.costs import CostModel
from llmsim.costs.host_issue import HostIssue
from llmsim.ops import CommOp, ComputeOp
from llmsim.specs import Jitter, Scenario

_NORMAL = NormalDist()
_TINY = 1e-300
"""Smallest tail probability drawn (keeps Φ⁻¹ finite)."""


def lognormal_params(cv: float) -> tuple[float, float]:
    """(μ, σ) of the mean-one lognormal with coefficient of variation ``cv``."""
    sigma2 = math.log1p(cv * cv)
    return -sigma2 / 2, math.sqrt(sigma2)


def max_lognormal(cv: float, ranks: int, u: float) -> float:
    """The maximum of ``ranks`` independent mean-one lognormal factors of coefficient of
    variation ``cv``, by inversion of its CDF at the uniform ``u`` in (0, 1]."""
    mu, sigma = lognormal_params(cv)
    tail = -math.expm1(math.log(max(u, _TINY)) / ranks)  # 1 − u^(1/R)
    tail = min(max(tail, _TINY), 1 - 1e-16)
    return math.exp(mu - sigma * _NORMAL.inv_cdf(tail))


class JitteredCosts:
    """A cost model whose durations are another's times seeded random factors (module
    docstring)."""

    def __init__(self, base: CostModel, jitter: Jitter, ranks: int,
                 rng: np.random.Generator, slow: bool, micro_batches: int = 1) -> None:
        self.base, self.jitter, self.ranks, self.rng = base, jitter, ranks, rng
        self.slow = slow
        """Whether the job holds a slow device (its compute-bound kernels run slower)."""
        self.micro_batches = micro_batches
        """Micro-batches per pipeline per step: the replays of one priced pass."""

    def _factor(self, cv: float, ranks: int, draws: int) -> float:
        """The mean of ``draws`` independent slowest-of-``ranks`` factors."""
        if cv == 0:
            return 1.0
        u = 1.0 - self.rng.random(draws)
        return math.fsum(max_lognormal(cv, ranks, float(x)) for x in u) / draws

    def _compute(self, op: ComputeOp, draws: int) -> float:
        duration = self.base.compute_s(op)
        if self.slow and op.kind != "memory":
            duration /= self.jitter.slow_speed
        return duration * self._factor(self.jitter.compute_cv, self.ranks, draws)

    @property
    def host_issue(self) -> HostIssue:
        """The host's issue of the jittered costs (not jittered)."""
        return self.base.host_issue

    def compute_s(self, op: ComputeOp) -> float:
        """The op's time on the slowest of the ranks the representative stands for, once
        per step, s."""
        return self._compute(op, 1)

    def comm_s(self, op: CommOp) -> float:
        """The collective's or transfer's time with its own noise, once per step, s."""
        return self.base.comm_s(op) * self._factor(self.jitter.comm_cv, 1, 1)

    def pass_compute_s(self, op: ComputeOp) -> float:
        """A pass's op: its time per micro-batch, at the mean of the step's micro-batches'
        factors (module docstring), s."""
        return self._compute(op, self.micro_batches)

    def pass_comm_s(self, op: CommOp) -> float:
        """A pass's collective or transfer, per micro-batch, at the mean of the step's
        micro-batches' factors, s."""
        return self.base.comm_s(op) * self._factor(self.jitter.comm_cv, 1, self.micro_batches)


def slow_devices(scenario: Scenario) -> int:
    """How many of the job's devices are slow, drawn from the scenario's seed."""
    fraction = scenario.jitter.slow_fraction
    if fraction == 0 or scenario.jitter.slow_speed == 1:
        return 0
    rng = np.random.default_rng([scenario.seed % 2**64, 0])
    return int(rng.binomial(scenario.devices, fraction))


def jittered(costs: CostModel, scenario: Scenario, step: int = 0) -> CostModel:
    """``costs`` with the scenario's jitter for seeded step ``step``; ``costs`` itself when
    the scenario has none."""
    jitter = scenario.jitter
    if jitter.is_zero:
        return costs
    rng = np.random.default_rng([scenario.seed % 2**64, 1, step])
    ranks = scenario.devices // scenario.parallelism.pp
    return JitteredCosts(costs, jitter, ranks, rng, slow_devices(scenario) > 0,
                         scenario.micro_batches)
