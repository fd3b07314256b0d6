"""Jitter spec: how much the duration of one op varies from rank to rank and step to step,
and how many devices run persistently slow (llmsim.costs.jitter draws them).

Every field defaults to "no noise": a scenario without a ``jitter:`` section simulates
exactly the deterministic step.
"""

from __future__ import annotations

from pydantic import Field, PositiveInt

from llmsim.specs._base import Spec


class Jitter(Spec):
    """Per-op duration noise and slow devices, drawn from the scenario's ``seed``."""

    compute_cv: float = Field(default=0.0, ge=0, le=1)
    """Coefficient of variation of one rank's kernel time around the cost model's (a
    mean-one lognormal factor per op, independent across ranks, ops and steps), 0–1.
    0: no compute noise."""
    comm_cv: float = Field(default=0.0, ge=0, le=1)
    """Coefficient of variation of one collective's or transfer's time (a mean-one
    lognormal factor per op and step, shared by its group), 0–1. 0: no noise."""
    slow_fraction: float = Field(default=0.0, ge=0, lt=1)
    """Share of the job's devices that run persistently slow (a lower clock), 0–1."""
    slow_speed: float = Field(default=1.0, gt=0, le=1)
    """Speed of a slow device's compute-bound kernels (GEMMs, attention) relative to a
    healthy one, 0–1 (0.9: 10 % slower). Memory-bound kernels keep their speed."""
    steps: PositiveInt = Field(default=20, le=10_000)
    """Seeded steps simulated for the step time's mean and tail (p50, p90, p99)."""

    @property
    def is_zero(self) -> bool:
        """Whether nothing is drawn: the step is the deterministic one."""
        return (self.compute_cv == 0 and self.comm_cv == 0
                and (self.slow_fraction == 0 or self.slow_speed == 1))
