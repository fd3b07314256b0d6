"""Confirming the estimator's best layouts with the SimPy engine, and ranking them.

The estimator ranks every layout; the engine re-runs the best ``top`` of them and its
numbers decide the final order. The confirmed rows carry both, and their ratio
(``est_over_engine``), which ``docs/search.md`` summarises.
"""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from llmsim.search.space import ASYNCHRONOUS, LAYOUT_FIELDS, Layout, apply
from llmsim.specs import Scenario

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

OBJECTIVES: dict[str, tuple[str, str, bool]] = {
    "days": ("est_days", "days", False),
    "step_time": ("est_step_time_s", "step_time_s", False),
    "mfu": ("est_mfu", "mfu", True),
    "tokens_per_device": ("est_tokens_per_device_s", "tokens_per_device_s", True),
}
"""Objective → (estimator column, engine column, whether larger is better)."""


def objective_column(objective: str) -> str:
    """The engine's column of ``objective``."""
    return OBJECTIVES[objective][1]


def layout_of_row(row: Any) -> Layout:
    """The layout a table row describes."""
    return Layout(**{name: _plain(row[name]) for name in LAYOUT_FIELDS if name in row})


def _plain(value: Any) -> Any:
    """numpy scalars as Python values (for hashing and the scenario's validation)."""
    return value.item() if hasattr(value, "item") else value


def engine_row(base: Scenario, layout: Layout) -> dict[str, Any]:
    """The engine's numbers for one layout (the result of :func:`llmsim.simulate`; a
    PipeDream layout's from its replayed steady state, :func:`steady_state_row`)."""
    from llmsim.simulation import simulate

    if layout.schedule in ASYNCHRONOUS:
        return steady_state_row(apply(base, layout), layout.key)
    result = simulate(apply(base, layout))
    return {
        "key": layout.key,
        "step_time_s": result.step_time_s,
        "mfu": result.mfu,
        "days": result.days_to_train,
        "tokens_per_device_s": result.tokens_per_s / result.devices,
        "bubble_fraction": result.bubble_fraction,
        "fits": result.fits,
    }


def steady_state_row(scenario: Scenario, key: str) -> dict[str, Any]:
    """:func:`engine_row` of a PipeDream layout, which the engine does not run as one
    step: its pipeline's steady state replayed by the engine
    (:func:`llmsim.steady_state.pipedream_step_s`, the passes only) in place of the
    estimator's closed form, plus the estimator's shares of the step for the gradient
    reduction and the optimizer step after every backward
    (:mod:`llmsim.search.pipedream_updates`), which the replay leaves out; bubble 0 (the
    steady state has none); fits by the memory model with its stashed weight versions."""
    from llmsim.search.estimate import Estimator
    from llmsim.steady_state import pipedream_step_s

    estimator = Estimator()
    est = estimator.estimate(scenario)
    step_s = pipedream_step_s(scenario) + est.dp_tail_s + est.optimizer_s \
        + scenario.training.step_overhead_s
    exact = replace(est, step_time_s=step_s)
    return {"key": key, "step_time_s": step_s, "mfu": exact.mfu, "days": exact.days_to_train,
            "tokens_per_device_s": exact.tokens_per_s / exact.devices,
            "bubble_fraction": 0.0,
            "fits": all(s.fits for s in estimator.memory(scenario))}


def engine_rows(base: Scenario, layouts: list[Layout], workers: int,
                timeout_s: float | None = None) -> list[dict[str, Any] | None]:
    """The engine's numbers for each layout (:func:`engine_row`), ``workers`` at a time.

    With ``timeout_s`` each run has its own process, ended after ``timeout_s`` seconds
    (None for that layout): some layouts (ZeRO-3 with many micro-batches: a gather per
    layer and micro-batch) take the engine minutes for one step under its
    ``max_sim_passes`` bound.
    """
    workers = max(1, workers)
    if timeout_s is None:
        if workers > 1 and len(layouts) > 1:
            with ProcessPoolExecutor(max_workers=workers) as pool:
                return list(pool.map(engine_row, [base] * len(layouts), layouts))
        return [engine_row(base, layout) for layout in layouts]
    import multiprocessing
    import time

    context = multiprocessing.get_context("fork")
    rows: list[dict[str, Any] | None] = []
    for i in range(0, len(layouts), workers):
        batch = layouts[i:i + workers]
        pools = [context.Pool(1) for _ in batch]
        try:
            pending = [pool.apply_async(engine_row, (base, layout))
                       for pool, layout in zip(pools, batch, strict=True)]
            deadline = time.perf_counter() + timeout_s
            for job in pending:
                try:
                    rows.append(job.get(max(0.0, deadline - time.perf_counter())))
                except multiprocessing.TimeoutError:
                    rows.append(None)
        finally:
            for pool in pools:
                pool.terminate()
    return rows


def ranked(table: pd.DataFrame, est_col: str, larger: bool) -> np.ndarray:
    """The positions of ``table``'s rows best first by ``est_col`` (NaN last), equal values
    by key, equal keys in table order: ``table.sort_values([est_col, "key"], ascending=[not
    larger, True], na_position="last", kind="mergesort")``'s order (tested), by a stable
    numeric sort and a sort of the tied rows' keys alone (a search's table has some 6 % of
    its rows tied; its keys as text cost most of pandas' sort)."""
    import numpy as np

    values = _numbers(table[est_col])
    if values is None:  # not all numbers: pandas' own sort
        return table.reset_index(drop=True).sort_values(
            [est_col, "key"], ascending=[not larger, True], na_position="last",
            kind="mergesort").index.to_numpy()
    signed = -values if larger else values
    order = np.argsort(signed, kind="stable")  # NaN last, NaNs in table order
    ordered = signed[order]
    nan = np.isnan(ordered)
    same = (ordered[1:] == ordered[:-1]) | (nan[1:] & nan[:-1])  # as the previous one
    tied = np.zeros(len(order), dtype=bool)
    tied[1:] |= same
    tied[:-1] |= same
    if tied.any():
        group = np.concatenate([[0], np.cumsum(~same)])[tied]
        rows = order[tied]
        keys = table["key"].to_numpy()[rows].astype(str)
        order[tied] = rows[np.lexsort((keys, group))]
    return order


def _numbers(column: pd.Series) -> np.ndarray | None:
    """``column`` as floats (None as NaN), or None where it holds text."""
    try:
        return column.to_numpy(dtype=float)
    except (TypeError, ValueError):
        return None


def confirm(base: Scenario, table: pd.DataFrame, objective: str, top: int, workers: int,
            timeout_s: float | None = None) -> tuple[pd.DataFrame, Scenario | None, int]:
    """Run the engine on the ``top`` best rows by the estimator; return the table ranked
    (confirmed rows first, by the engine; those that fit before those that do not), the
    best layout's scenario and how many runs took longer than ``timeout_s``.

    A run that times out leaves its row unconfirmed (``timed_out`` True) and the next
    row by the estimator is tried in its place, up to ``2·top`` rows in all.
    """
    import numpy as np
    import pandas as pd

    est_col, eng_col, larger = OBJECTIVES[objective]
    if table.empty or est_col not in table:
        return table, None, 0
    table = table.take(ranked(table, est_col, larger)).reset_index(drop=True)
    rows: list[dict[str, Any]] = []
    timed_out, tried = [], 0
    while len(rows) < top and tried < min(2 * top, len(table)):
        want = min(top - len(rows), len(table) - tried, 2 * top - tried)
        head = [layout_of_row(r) for _, r in table.iloc[tried:tried + want].iterrows()]
        tried += len(head)
        for layout, numbers in zip(head, engine_rows(base, head, workers, timeout_s),
                                   strict=True):
            if numbers is None:
                timed_out.append(layout.key)
            else:
                rows.append(numbers)
    table["timed_out"] = table["key"].isin(timed_out)
    if not rows:
        return table, None, len(timed_out)
    # The engine's columns, set on the rows it ran (all among the first ``tried``), in
    # place: the table holds every priced layout and is not copied.
    engine = pd.DataFrame(rows).set_index("key")
    where = table.index[:tried][table["key"].iloc[:tried].isin(engine.index)]
    for name in engine.columns:
        values = engine.loc[table.loc[where, "key"], name].to_numpy()
        table[name] = pd.Series(values, index=where).reindex(table.index)
    table["est_over_engine"] = table["est_step_time_s"] / table["step_time_s"]
    confirmed = table.loc[where].assign(_over=lambda t: ~t["fits"].astype(bool))
    confirmed = confirmed.sort_values(["_over", eng_col, "key"],
                                      ascending=[True, not larger, True], na_position="last",
                                      kind="mergesort")
    rest = table.index[~table.index.isin(where)]
    order = np.concatenate([confirmed.index.to_numpy(), rest.to_numpy()])
    table = table.take(order).reset_index(drop=True)
    best = apply(base, layout_of_row(table.iloc[0]))
    return table, best, len(timed_out)
