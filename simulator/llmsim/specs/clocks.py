"""Sustained-clock spec: the SM clock a device holds by kind of work under its power limit."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, NonNegativeFloat, PositiveFloat, model_validator

from llmsim.specs._base import Spec

WorkKind = Literal["gemm", "gemm_fp8", "attention", "memory", "communication", "idle"]
"""Kinds of work whose board power differs: dense 16-bit GEMMs, FP8 GEMMs, fused
attention, memory-bound kernels, communication only (SMs mostly idle), idle."""

COMPUTE_KINDS: tuple[WorkKind, ...] = ("gemm", "gemm_fp8", "attention")
"""Kinds whose rate the catalog scales with the SM clock (math-bound kernels)."""


class ClockPoint(Spec):
    """One measured operating point of a kind of work: SM clock and board power."""

    mhz: PositiveFloat
    """Median SM clock while the kind of work ran, MHz."""
    power_w: PositiveFloat
    """Median board power at that clock, W."""


class SustainedClocks(Spec):
    """The SM clock of each kind of work under the board's power limit.

    Board power is ``static_w`` plus a dynamic part that grows with the cube of the SM
    clock: P = C·V²·f with the supply voltage V rising in proportion to f over the
    DVFS range (Weste & Harris, "CMOS VLSI Design", 4th ed., §5.1). A kind measured at
    the limit at clock f_m with power P_m would draw
    ``D = (P_m − static_w) / (f_m / max_mhz)³`` above ``static_w`` at ``max_mhz``; under a
    limit L it runs at ``max_mhz · ((L − static_w) / D)^(1/3)``, at most ``max_mhz``. A kind
    measured below the limit at ``max_mhz`` is not power-limited at any higher limit; one that
    draws no more than ``static_w`` (idle) keeps its measured clock. At the measured limit
    the clock is the measured one whatever the exponent.

    The catalog's compute rates (GEMM fractions, attention rates) hold at
    ``rates_at_mhz``; a math-bound kernel runs ``clock / rates_at_mhz`` times as fast, never
    faster than the catalog's rate: llmsim does not extrapolate above the clocks of the
    measurements the rates come from. Memory-bound kernels and communication keep their
    rates (their limit is bandwidth, not the SM clock).
    """

    max_mhz: PositiveFloat
    """Highest SM clock the board runs when it has power headroom, MHz."""
    power_limit_w: PositiveFloat
    """Board power limit the firmware holds (``nvidia-smi -pl``), W."""
    static_w: NonNegativeFloat
    """Board power that does not scale with the SM clock (idle at the lowest clock), W."""
    measured: dict[WorkKind, ClockPoint]
    """Measured clock and power by kind of work (under the board's own limit)."""
    rates_at_mhz: dict[WorkKind, PositiveFloat] = Field(default_factory=dict)
    """SM clock at which the catalog's rate of each compute kind holds, MHz; a kind
    left out keeps the catalog's rate."""

    @model_validator(mode="after")
    def _points_consistent(self) -> SustainedClocks:
        for kind, point in self.measured.items():
            if point.mhz > self.max_mhz:
                raise ValueError(
                    f"clocks.measured.{kind}.mhz: {point.mhz} MHz is above clocks.max_mhz "
                    f"({self.max_mhz} MHz); give the clock the board ran at"
                )
        if self.power_limit_w <= self.static_w:
            raise ValueError(
                f"clocks.power_limit_w: {self.power_limit_w} W is not above clocks.static_w "
                f"({self.static_w} W); give the board's power limit, e.g. 700"
            )
        return self
