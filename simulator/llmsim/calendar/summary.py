"""From a step's result to the calendar: checkpoint plan, failures, days and energy."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from llmsim.calendar.checkpoint import CheckpointCost, checkpoint_cost, daly_interval_s
from llmsim.calendar.energy import (
    JOULES_PER_KWH,
    JOULES_PER_MWH,
    RunEnergy,
    StepEnergy,
    run_energy,
    step_energy,
)
from llmsim.calendar.failures import JobFailures, job_failures
from llmsim.calendar.montecarlo import ExpectedRun, RunPlan, expected_run, sample_runs
from llmsim.result import SECONDS_PER_DAY, Result


@dataclass(frozen=True)
class CalendarSummary:
    """Calendar days, goodput, the checkpoint plan and the energy of a whole run."""

    days_to_train: float
    """Days of uninterrupted training (the step result's)."""
    failures: JobFailures
    checkpoint: CheckpointCost
    plan: RunPlan
    expected: ExpectedRun
    days_p10: float
    """10th percentile of the Monte Carlo's calendar days."""
    days_median: float
    days_p90: float
    runs: int
    """Monte Carlo runs."""
    seed: int
    step: StepEnergy | None
    energy: RunEnergy | None

    @property
    def calendar_days(self) -> float:
        """Expected calendar days (closed form)."""
        return self.expected.wall_s / SECONDS_PER_DAY

    @property
    def goodput(self) -> float:
        """Useful share of the wall time, 0–1."""
        return self.expected.goodput

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able values, units in the key names."""
        p, c, f = self.plan, self.checkpoint, self.failures
        out: dict[str, Any] = {
            "days_to_train": self.days_to_train,
            "calendar_days": self.calendar_days,
            "calendar_days_median": self.days_median,
            "calendar_days_p10": self.days_p10,
            "calendar_days_p90": self.days_p90,
            "monte_carlo_runs": self.runs,
            "seed": self.seed,
            "goodput": self.goodput,
            "failures_per_day": f.per_day,
            "mtbf_h": None if math.isinf(f.mtbf_s) else f.mtbf_s / 3600,
            "expected_failures": self.expected.failures,
            "checkpoint": {
                "size_bytes": c.total_bytes, "per_device_bytes": c.per_device_bytes,
                "write_s": c.write_s, "read_s": c.read_s, "snapshot_s": c.snapshot_s,
                "storage": c.storage, "has_storage": c.has_storage,
                "blocking_s": p.checkpoint_s,
                "interval_s": None if math.isinf(p.interval_s) else p.interval_s,
                "async": p.write_s > 0, "restart_s": p.restart_s, "count": p.checkpoints(),
            },
            "time_s": {"work": self.expected.work_s, "checkpoints": self.expected.checkpoint_s,
                       "lost_work": self.expected.lost_s, "restarts": self.expected.restart_s},
        }
        if self.step is not None and self.energy is not None:
            e, s = self.energy, self.step
            out["energy"] = {
                "step_j": s.total_j, "power_mw": s.power_w / 1e6, "pue": s.pue,
                "step_split_j": {"gemm": s.gemm_j, "memory": s.memory_j, "comm": s.comm_j,
                                 "wait": s.wait_j, "nodes_network": s.nodes_j},
                "step_kwh": s.total_j / JOULES_PER_KWH,
                "run_mwh": e.mwh, "training_mwh": e.training_j / JOULES_PER_MWH,
                "redone_mwh": e.redone_j / JOULES_PER_MWH,
                "stopped_mwh": e.stopped_j / JOULES_PER_MWH,
                "co2_tonnes": e.tonnes_co2, "cost_usd": e.cost,
                "grid_gco2_per_kwh": e.gco2_per_kwh, "price_per_kwh": e.price_per_kwh,
            }
        return out


def run_plan(result: Result, cost: CheckpointCost, failures: JobFailures) -> RunPlan:
    """The run's segments: the scenario's interval or Daly's optimum, never shorter than
    one step nor, with asynchronous checkpoints, than one background write."""
    s = result.scenario
    cal = s.calendar
    work_s = (result.days_to_train or 0.0) * SECONDS_PER_DAY
    blocking = cost.snapshot_s if cal.async_checkpoint else cost.write_s
    if cal.checkpoint_interval_s == "auto":
        interval = daly_interval_s(blocking, failures.mtbf_s)
    else:
        interval = float(cal.checkpoint_interval_s)
    floor = max(result.step_time_s, cost.write_s if cal.async_checkpoint else 0.0)
    interval = max(interval, floor)
    restart = s.system.reliability.restart_s + cost.read_s
    write = cost.write_s if cal.async_checkpoint else 0.0
    return RunPlan(work_s, interval, blocking, restart, failures.rate_per_s, write)


def summarize(result: Result, runs: int | None = None) -> CalendarSummary | None:
    """Calendar days (expected, and the Monte Carlo's median and 10–90 %), goodput, the
    checkpoint plan and the energy of ``result``'s run; None when the scenario gives no
    run size (training.tokens or training.flops)."""
    days = result.days_to_train
    if days is None or not math.isfinite(days):
        return None
    s = result.scenario
    failures = job_failures(s.system, s.nodes_used)
    cost = checkpoint_cost(s.model, s.parallelism, s.training, s.dp, s.system,
                           s.calendar.snapshot_gbps)
    plan = run_plan(result, cost, failures)
    expected = expected_run(plan)
    runs = runs or s.calendar.monte_carlo_runs
    walls = sample_runs(plan, runs, np.random.default_rng(s.seed)) / SECONDS_PER_DAY
    p10, median, p90 = (float(v) for v in np.percentile(walls, [10, 50, 90]))
    step = step_energy(result)
    energy = None
    if step is not None:
        stopped = expected.checkpoint_s + expected.restart_s
        energy = run_energy(step, expected.work_s, expected.lost_s, stopped,
                            s.calendar.grid_gco2_per_kwh, s.calendar.price_per_kwh)
    return CalendarSummary(days, failures, cost, plan, expected, p10, median, p90, runs,
                           s.seed, step, energy)


TABLE_COLUMNS = ("calendar_days", "calendar_days_p10", "calendar_days_p90", "goodput",
                 "run_mwh")
"""What :func:`table_columns` gives: expected calendar days, the Monte Carlo's 10th and
90th percentiles, goodput (0–1) and the run's energy (MWh)."""


def table_columns(result: Result, runs: int | None = None) -> dict[str, float | None]:
    """``result``'s whole run as columns of a table of machines (the days-to-GPT-4 table,
    :mod:`llmsim.gpt4`): :data:`TABLE_COLUMNS`, each None where the scenario gives no run
    size (all of them) or the accelerator no power figures (``run_mwh``)."""
    cal = summarize(result, runs)
    if cal is None:
        return dict.fromkeys(TABLE_COLUMNS)
    return {"calendar_days": cal.calendar_days, "calendar_days_p10": cal.days_p10,
            "calendar_days_p90": cal.days_p90, "goodput": cal.goodput,
            "run_mwh": cal.energy.mwh if cal.energy is not None else None}
