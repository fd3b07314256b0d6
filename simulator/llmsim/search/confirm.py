"""Confirming the estimator's best layouts with the SimPy engine, and ranking them.

The estimator ranks every layout; the engine re-runs the best ``top`` of them and its
numbers decide the final order. The confirmed rows carry both, and their ratio
(``est_over_engine``), which ``docs/search.md`` summarises.
"""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor
from typing import TYPE_CHECKING, Any

from llmsim.search.space import LAYOUT_FIELDS, Layout, apply
from llmsim.specs import Scenario

if TYPE_CHECKING:
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
    """The engine's numbers for one layout (the result of :func:`llmsim.simulate`)."""
    from llmsim.simulation import simulate

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


def confirm(base: Scenario, table: pd.DataFrame, objective: str, top: int,
            workers: int) -> tuple[pd.DataFrame, Scenario | None]:
    """Run the engine on the ``top`` best rows by the estimator; return the table ranked
    (confirmed rows first, by the engine) and the best layout's scenario."""
    import pandas as pd

    est_col, eng_col, larger = OBJECTIVES[objective]
    if table.empty or est_col not in table:
        return table, None
    table = table.sort_values([est_col, "key"], ascending=[not larger, True],
                              na_position="last", kind="mergesort").reset_index(drop=True)
    head = [layout_of_row(r) for _, r in table.head(top).iterrows()]
    if workers > 1 and len(head) > 1:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            rows = list(pool.map(engine_row, [base] * len(head), head))
    else:
        rows = [engine_row(base, layout) for layout in head]
    if not rows:
        return table, None
    engine = pd.DataFrame(rows)
    table = table.merge(engine, on="key", how="left")
    table["est_over_engine"] = table["est_step_time_s"] / table["step_time_s"]
    confirmed = table[table["step_time_s"].notna()].sort_values(
        [eng_col, "key"], ascending=[not larger, True], na_position="last", kind="mergesort")
    rest = table[table["step_time_s"].isna()]
    table = pd.concat([confirmed, rest], ignore_index=True)
    best = apply(base, layout_of_row(table.iloc[0]))
    return table, best
