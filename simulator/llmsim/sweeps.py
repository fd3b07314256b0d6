"""Sweeps: one scenario simulated over a grid of field values (``llmsim sweep``).

Each point of the grid is the scenario with one value of every varied field
(``{"parallelism.micro_batch": [1, 2, 4], "nodes": [64, 128]}`` is six points), loaded
and simulated as ``llmsim run`` would; a point a rule rejects is a row with its error,
not a failure of the sweep. Where the layout search (:mod:`llmsim.search`) looks for the
best layout, a sweep shows how a result moves with the fields you choose.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import TYPE_CHECKING, Any

from llmsim.errors import UserError

if TYPE_CHECKING:
    import pandas as pd

MAX_POINTS = 10_000
"""Largest grid a sweep runs (each point is a simulation)."""


def parse_vary(items: Sequence[str]) -> dict[str, list[Any]]:
    """``["parallelism.micro_batch=1,2,4"]`` → ``{"parallelism.micro_batch": [1, 2, 4]}``
    (values read as YAML scalars: numbers, booleans, names)."""
    from llmsim.loader import parse_override

    out: dict[str, list[Any]] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip() or not raw.strip():
            raise UserError(f"--vary: {item!r} is not KEY=V1,V2,…; e.g. "
                            "--vary parallelism.micro_batch=1,2,4")
        if key in out:
            raise UserError(f"--vary: {key} is given twice; list all its values in one --vary")
        out[key.strip()] = [parse_override(f"{key}={value.strip()}")[1]
                            for value in raw.split(",")]
    return out


def grid(vary: Mapping[str, Sequence[Any]]) -> list[dict[str, Any]]:
    """Every combination of the varied values, the first field varying slowest."""
    if not vary:
        raise UserError("--vary: give at least one field to vary, e.g. "
                        "--vary parallelism.micro_batch=1,2,4")
    points = 1
    for key, values in vary.items():
        if not values:
            raise UserError(f"--vary: {key} has no values")
        points *= len(values)
    if points > MAX_POINTS:
        raise UserError(f"--vary: the grid has {points:,} points, more than {MAX_POINTS:,}; "
                        "vary fewer values (or use llmsim search)")
    keys = list(vary)
    return [dict(zip(keys, combo, strict=True))
            for combo in itertools.product(*(vary[k] for k in keys))]


def point(source: Any, point: Mapping[str, Any]) -> dict[str, Any]:
    """Simulate one point: its values, then the result's numbers (or its error)."""
    from llmsim.loader import load_scenario
    from llmsim.simulation import simulate

    row: dict[str, Any] = dict(point)
    try:
        scenario = load_scenario(source, dict(point))
        result = simulate(scenario)
    except UserError as err:
        return {**row, "error": err.message}
    peak = max(result.memory, key=lambda m: m.total_bytes)
    return {**row, "error": None, "devices": result.devices,
            "step_time_s": result.step_time_s, "tokens_per_s": result.tokens_per_s,
            "mfu": result.mfu, "bubble_fraction": result.bubble_fraction,
            "memory_gb": peak.total_bytes / 1e9, "fits": result.fits,
            "days": result.days_to_train,
            **{f"{part}_s": seconds for part, seconds in result.breakdown_s.items()}}


def sweep(source: Any, vary: Mapping[str, Sequence[Any]], *, workers: int | None = None,
          progress: Callable[[int, int], None] | None = None) -> pd.DataFrame:
    """Simulate ``source`` (a scenario name, path or mapping) at every point of ``vary``'s
    grid; one row per point, in grid order."""
    import pandas as pd

    if not isinstance(source, (str, os.PathLike, Mapping)):
        raise UserError("sweep: give a scenario name, a path or a mapping (a loaded Scenario "
                        "cannot be re-validated with new values)")
    points = grid(vary)
    from llmsim.loader import load_scenario

    load_scenario(source)  # a bad scenario is one error, not one per point
    workers = workers or os.cpu_count() or 1
    rows: list[dict[str, Any] | None] = [None] * len(points)
    if workers > 1 and len(points) > 1:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            futures = {pool.submit(point, source, p): i for i, p in enumerate(points)}
            for done, future in enumerate(as_completed(futures), 1):
                rows[futures[future]] = future.result()
                if progress is not None:
                    progress(done, len(points))
    else:
        for i, p in enumerate(points):
            rows[i] = point(source, p)
            if progress is not None:
                progress(i + 1, len(points))
    return pd.DataFrame(rows)


def plot(table: pd.DataFrame, keys: Sequence[str]) -> Any:
    """Step time and MFU against the first varied field, one line per value of the
    others. Returns the figure."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    ok = table[table["error"].isna()] if "error" in table else table
    first, rest = keys[0], list(keys[1:])
    groups = ok.groupby(rest, dropna=False) if rest else [((), ok)]
    for label, part in groups:
        name = ", ".join(f"{k}={v}" for k, v in zip(rest, label if isinstance(label, tuple)
                                                      else (label,), strict=False)) or None
        xs = [str(x) for x in part[first]]
        top.plot(xs, part["step_time_s"], marker="o", label=name)
        bottom.plot(xs, part["mfu"] * 100, marker="o", label=name)
    top.set_ylabel("step time (s)")
    bottom.set_ylabel("MFU (%)")
    bottom.set_xlabel(first)
    if rest:
        top.legend(fontsize="small")
    return fig
