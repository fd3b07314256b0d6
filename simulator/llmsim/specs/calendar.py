"""Calendar spec: the scenario's knobs for checkpoints, the Monte Carlo, CO₂ and cost."""

from __future__ import annotations

from pydantic import Field, PositiveFloat, PositiveInt, field_validator

from llmsim.specs._base import Spec

GRID_GCO2_PER_KWH = 480.0
"""Default grid carbon intensity, gCO₂/kWh: the world's electricity in 2023 (Ember,
"Global Electricity Review 2024": 480 gCO₂/kWh)."""
PRICE_PER_KWH = 0.08
"""Default electricity price, USD/kWh: the US average for industrial customers in 2023
(U.S. EIA, Electric Power Monthly, table 5.3: about 8 cents/kWh)."""
SNAPSHOT_GBPS = 25.0
"""Default device-to-host copy bandwidth per device, GB/s: an assumption of 80 % of a
PCIe 4.0 x16 link's 31.5 GB/s per direction (an H100 on PCIe 5.0 measured 55 GB/s
pinned, ``shared/measurements/h100-sxm5-2026-11``)."""


class Calendar(Spec):
    """How the whole run is checkpointed and simulated, and what its energy costs."""

    checkpoint_interval_s: float | str = "auto"
    """Compute time between checkpoints, seconds, or ``auto``: the interval that
    minimises the expected run time (Young 1974 / Daly 2006)."""
    async_checkpoint: bool = False
    """Whether training resumes once the state is copied to host memory, the file
    system write running in the background (PyTorch DCP ``async_save``, Megatron-LM
    ``--async-save``); otherwise training waits for the write."""
    snapshot_gbps: PositiveFloat = SNAPSHOT_GBPS
    """Device-to-host copy bandwidth per device for an asynchronous checkpoint, GB/s."""
    monte_carlo_runs: PositiveInt = Field(default=1000, le=1_000_000)
    """Runs of the whole training simulated to give the spread of calendar days (at most
    a million: a few arrays of that many doubles, and the bound that
    :data:`llmsim.calendar.montecarlo.MAX_FAILURES_PER_RUN` leaves room for)."""
    grid_gco2_per_kwh: float = Field(default=GRID_GCO2_PER_KWH, ge=0)
    """Carbon intensity of the electricity, gCO₂ per kWh (480: world average 2023)."""
    price_per_kwh: float = Field(default=PRICE_PER_KWH, ge=0)
    """Electricity price, USD per kWh (0.08: US industrial average 2023)."""

    @field_validator("checkpoint_interval_s")
    @classmethod
    def _seconds_or_auto(cls, value: float | str) -> float | str:
        bad = value != "auto" if isinstance(value, str) else value <= 0
        if bad:
            raise ValueError(
                "neither a positive number of seconds nor 'auto'; give the training time "
                "between checkpoints in seconds, e.g. 3600, or 'auto'"
            )
        return value
