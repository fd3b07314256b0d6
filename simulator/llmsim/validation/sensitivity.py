"""The range of predictions the unstated values of a validation row give.

``choices.yaml`` fixes one value for everything a source leaves open; where the value
moves the result, a single choice hides how much the row could be off for that reason
alone. ``workloads/validation/sensitivity.yaml`` lists, for rows whose sources do not state
them, the values each such setting could plausibly take, each with its reason; the row is
simulated with every combination of them (the chosen values included) and the table gives
the range of the errors: the range of the answer the source allows, not a fitted value.
``benchmarks/sensitivity.py`` prints the tables of ``docs/validation.md``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from llmsim.errors import UserError
from llmsim.loader import read_yaml
from llmsim.validation.predictions import predict
from llmsim.validation.reports import TARGET_WORST_PCT
from llmsim.validation.runs import Choice, Run, _expand, load_runs, validation_dir

if TYPE_CHECKING:
    import pandas as pd

MAX_COMBINATIONS = 64
"""Most combinations one row may ask for (each is a whole simulation)."""


@dataclass(frozen=True)
class Variation:
    """One setting a source does not state and the values it could take."""

    key: str
    """Dotted key as in ``choices.yaml`` (``parallelism.micro_batch``)."""
    values: tuple[Any, ...]
    """Values tried, the row's chosen one among them."""
    why: str
    """Why these values and not others."""


def _variations(raw: Mapping[str, Any], where: str) -> dict[str, Variation]:
    out = {}
    for key, item in (raw or {}).items():
        if (not isinstance(item, dict) or set(item) != {"values", "why"} or not item["why"]
                or not isinstance(item["values"], list) or len(item["values"]) < 2):
            raise UserError(f"{where}: {key!r} needs 'values' (a list of two or more) and a "
                            "non-empty 'why'")
        out[key] = Variation(key, tuple(item["values"]), str(item["why"]))
    return out


def load_variations() -> list[tuple[set[str] | str, dict[str, Variation]]]:
    """The entries of ``sensitivity.yaml``: (row ids, or an id prefix; the variations)."""
    spec = read_yaml(validation_dir() / "sensitivity.yaml")
    entries = []
    for i, entry in enumerate(spec.get("rows", [])):
        where = f"sensitivity.yaml rows[{i}]"
        if "match" in entry:
            rows: set[str] | str = str(entry["match"])
        elif "ids" in entry:
            rows = _expand(entry["ids"])
        else:
            raise UserError(f"{where}: give the rows as 'match: PREFIX' or 'ids: [...]'")
        entries.append((rows, _variations(entry.get("vary"), where)))
    return entries


def variations_for(run: Run) -> dict[str, Variation]:
    """The variations of ``run`` (later entries of the file add to earlier ones)."""
    out: dict[str, Variation] = {}
    for rows, vary in load_variations():
        hit = run.id.startswith(rows) if isinstance(rows, str) else run.id in rows
        if hit:
            out |= vary
    return out


def chosen_value(run: Run, key: str) -> Any:
    """The value ``run`` uses for ``key``: its choice, else the field's default (None)."""
    return run.value(key)


def combinations(run: Run, variations: Mapping[str, Variation]) -> list[dict[str, Any]]:
    """Every combination of the variations' values, the row's chosen one first."""
    for v in variations.values():
        if chosen_value(run, v.key) not in v.values:
            raise UserError(
                f"sensitivity.yaml: {run.id}'s chosen {v.key} = {chosen_value(run, v.key)!r} "
                f"is not among the values {list(v.values)}; add it so the range includes it")
    keys = list(variations)
    combos = [dict(zip(keys, values, strict=True))
              for values in itertools.product(*(variations[k].values for k in keys))]
    if len(combos) > MAX_COMBINATIONS:
        raise UserError(f"sensitivity.yaml: {run.id} asks for {len(combos)} combinations, "
                        f"more than {MAX_COMBINATIONS}; vary fewer settings")
    chosen = {k: chosen_value(run, k) for k in keys}
    return [chosen] + [c for c in combos if c != chosen]


def with_values(run: Run, values: Mapping[str, Any]) -> Run:
    """``run`` with some of its choices replaced (a ``None`` value drops the choice)."""
    choices = dict(run.choices)
    for key, value in values.items():
        if value is None:
            choices.pop(key, None)
        else:
            choices[key] = Choice(value, "sensitivity: one of the values the source allows")
    return replace(run, choices=choices)


def sensitivity(run: Run) -> pd.DataFrame:
    """One row per combination: the values, the prediction and its error (NaN where the
    combination is not a valid layout), whether it fits in memory, and whether it is the
    row's chosen combination."""
    import pandas as pd

    records = []
    variations = variations_for(run)
    for i, values in enumerate(combinations(run, variations)):
        try:
            p = predict(with_values(run, values))
            predicted, error, fits = p.predicted, p.error_pct, p.result.fits
        except UserError:
            predicted = error = float("nan")
            fits = False
        records.append({"id": run.id, **{k: str(v) for k, v in values.items()},
                        "predicted": predicted, "error_pct": error, "fits": fits,
                        "chosen": i == 0})
    return pd.DataFrame(records)


def ranges(frames: Iterable[pd.DataFrame]) -> pd.DataFrame:
    """Per row: the chosen combination's error and the lowest and highest error over the
    combinations that are valid layouts and fit in memory (all valid ones where none
    fits), with the values that give each."""
    import pandas as pd

    rows = []
    for df in frames:
        keys = [c for c in df.columns
                if c not in ("id", "predicted", "error_pct", "fits", "chosen")]
        valid = df.dropna(subset=["error_pct"])
        fitting = valid[valid.fits]
        if len(fitting):  # a layout that does not fit in memory could not have run
            valid = fitting
        low, high = valid.loc[valid.error_pct.idxmin()], valid.loc[valid.error_pct.idxmax()]
        rows.append({
            "id": df.id.iloc[0],
            "combinations": len(df),
            "valid": len(valid),
            "fit": bool(len(fitting)),
            "chosen_error_pct": float(df.loc[df.chosen, "error_pct"].iloc[0]),
            "low_error_pct": float(low.error_pct),
            "high_error_pct": float(high.error_pct),
            "low_values": ", ".join(f"{k}={low[k]}" for k in keys),
            "high_values": ", ".join(f"{k}={high[k]}" for k in keys),
        })
    return pd.DataFrame(rows)


def goal_ranges(df: pd.DataFrame) -> pd.DataFrame:
    """:func:`ranges` of the target rows of a validated frame that are worse than the
    accuracy goal's :data:`~llmsim.validation.reports.TARGET_WORST_PCT` at their chosen
    values and whose source leaves settings unstated (``sensitivity.yaml`` varies them):
    what :func:`~llmsim.validation.reports.accuracy_goal` judges those rows by. Empty
    (no columns) where there are none; a few simulations per row."""
    import pandas as pd

    worse = df[df["target"] & (df["error_pct"].abs() > TARGET_WORST_PCT)]
    runs = {r.id: r for r in load_runs() if r.id in set(worse["id"])}
    frames = [sensitivity(run) for rid in worse["id"]
              if rid in runs and variations_for(run := runs[rid])]
    return ranges(frames) if frames else pd.DataFrame()


def markdown(table: pd.DataFrame) -> str:
    """The ranges as a Markdown table."""
    lines = ["| row | chosen % | range % | lowest at | highest at |",
             "|---|---:|---|---|---|"]
    for r in table.itertuples():
        lines.append(f"| {r.id} | {r.chosen_error_pct:+.1f} | {r.low_error_pct:+.1f} … "
                     f"{r.high_error_pct:+.1f} ({r.valid} of {r.combinations}) | "
                     f"{r.low_values} | {r.high_values} |")
    return "\n".join(lines)
