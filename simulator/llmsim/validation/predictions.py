"""Predictions: each run simulated and its result expressed as its source measured it
(the source's FLOP convention, :func:`narayanan_flops`), one frame row per run."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd

from llmsim.errors import UserError
from llmsim.result import Result
from llmsim.simulation import collector_paused, simulate
from llmsim.validation.runs import METRICS, Run
from llmsim.validation.scenarios import scenario_for

if TYPE_CHECKING:
    from multiprocessing.pool import Pool


def narayanan_flops(
    batch: int, seq: int, layers: int, hidden: int, vocab: int, recompute: bool
) -> float:
    """FLOPs per iteration as Narayanan et al. 2021 count them (SC21, eq. 3).

    With full recomputation F = 96·B·s·l·h²·(1 + s/6h + V/16lh); without, the forward is
    counted once: 72·B·s·l·h²·(1 + s/6h + V/12lh).
    """
    b, s, n, h, v = batch, seq, layers, hidden, vocab
    if recompute:
        return 96.0 * b * s * n * h * h * (1 + s / (6 * h) + v / (16 * n * h))
    return 72.0 * b * s * n * h * h * (1 + s / (6 * h) + v / (12 * n * h))


def source_flops(run: Run, result: Result) -> float:
    """FLOPs of one step as ``run``'s source counts them (the source's own layer count)."""
    convention = run.value("flops_convention")
    if convention == "model":
        return result.model_flops_per_step
    row, model = run.row, result.scenario.model
    return narayanan_flops(
        int(row["global_batch"]),
        int(row["seq_len"]),
        int(row["layers"]),
        model.hidden,
        model.vocab,
        recompute=convention == "narayanan96",
    )


def predicted_metric(run: Run, result: Result) -> float:
    """llmsim's prediction of ``run.metric``, in the source's convention and unit."""
    if run.metric == "iteration_time_s":
        return result.step_time_s
    per_gpu = source_flops(run, result) / result.step_time_s / run.gpus
    if run.metric == "tflops_per_gpu":
        return per_gpu / 1e12
    if run.metric == "mfu":
        return 100.0 * per_gpu / (float(run.value("peak_tflops")) * 1e12)
    raise UserError(
        f"validation row {run.id}: unknown metric {run.metric!r}; use one of {', '.join(METRICS)}"
    )


@dataclass(frozen=True)
class Prediction:
    """One row compared: measured vs predicted, and the simulation behind it."""

    run: Run
    result: Result
    predicted: float

    @property
    def error_pct(self) -> float:
        """Signed error, (predicted − measured) / measured · 100."""
        return (self.predicted - self.run.measured) / self.run.measured * 100.0


def predict(run: Run) -> Prediction:
    """Simulate ``run`` and express the prediction as its source measured it."""
    result = simulate(scenario_for(run))
    return Prediction(run, result, predicted_metric(run, result))


def _record(p: Prediction) -> dict[str, Any]:
    s, r = p.result.scenario, p.result
    return {
        "id": p.run.id,
        "source": p.run.source,
        "metric": p.run.metric,
        "measured": p.run.measured,
        "predicted": p.predicted,
        "error_pct": p.error_pct,
        "target": p.run.target,
        "system": s.system.name,
        "accelerator": s.system.node.accelerator.name,
        "step_time_s": r.step_time_s,
        "mfu": r.mfu,
        "fits": r.fits,
        "config": f"{p.run.row['model_name']} B={s.training.global_batch}",
        "model": p.run.row["model_name"],
        "microbatches": s.micro_batches,
        "schedule": s.parallelism.schedule,
        **{f"{k}_s": v for k, v in r.breakdown_s.items()},
    }


def validate(runs: Iterable[Run], progress: bool = True, workers: int = 1) -> pd.DataFrame:
    """Predict every run; one row each: id, source, metric, measured, predicted, error_pct …

    Extra columns: ``target``, the ``system`` and ``accelerator`` it runs on (catalog
    names), the predicted step time, MFU and memory fit, the
    ``config`` (model and batch), ``model``, ``microbatches`` (per pipeline) and
    ``schedule`` keys and the critical stage's breakdown (``compute_s`` …).
    ``workers`` local processes simulate the runs (each row's numbers are the same on
    any count: a row is one simulation, alone in its process while it runs); the rows
    keep the order of ``runs``.
    """
    runs = list(runs)
    if workers < 1:
        raise UserError(f"workers {workers}: the runs need at least one process; use 1 or more")
    workers = min(workers, len(runs))
    with _pool(workers) as pool:
        rows = iter(map(_row, runs)) if pool is None else pool.imap(_row, runs)
        if not progress:
            return pd.DataFrame(list(rows))
        from llmsim.progress import track

        # The bar follows the rows as they come back, in order (the pool was forked
        # before the bar's thread started).
        return pd.DataFrame([next(rows) for _ in track(runs, "validating",
                                                       label=lambda r: r.id)])


def _row(run: Run) -> dict[str, Any]:
    """One run predicted, as its frame row (what a worker process sends back: the row,
    not the simulation's trace), with the garbage collector paused until the simulation
    is freed (:func:`~llmsim.simulation.collector_paused`)."""
    with collector_paused():
        return _record(predict(run))


@contextmanager
def _pool(workers: int) -> Iterator[Pool | None]:
    """``workers`` processes forked from this one (None for one, or where the platform
    cannot fork, as on Windows: the runs are simulated here). Forked, the workers start
    with every module this process imported and every catalog file it read."""
    import multiprocessing

    if workers <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        yield None
        return

    with multiprocessing.get_context("fork").Pool(workers) as pool:
        yield pool
