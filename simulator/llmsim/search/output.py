"""What a search writes: every priced layout, the best one as a scenario, and a plot.

``layouts.csv`` (or ``layouts.parquet``) holds every priced layout with units in its
column names; ``best.yaml`` is the best layout as a complete scenario that ``llmsim run``
takes as it is; ``search.png`` plots the objective against the devices used, coloured
by memory per device, the confirmed layouts circled and the best starred.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from llmsim.errors import UserError
from llmsim.specs import Scenario

if TYPE_CHECKING:
    import pandas as pd

FORMATS = ("csv", "parquet")

_LABELS = {"days": "days to train", "step_time_s": "step time (s)", "mfu": "MFU",
           "tokens_per_device_s": "tokens/s per device"}


def scenario_yaml(scenario: Scenario, note: str = "") -> str:
    """``scenario`` as YAML that :func:`llmsim.load_scenario` reads back to an equal one."""
    data: dict[str, Any] = scenario.model_dump(mode="json", exclude_defaults=True)
    # The machine and the model in full: a discriminated union's ``kind`` is a default.
    data["system"] = scenario.system.model_dump(mode="json")
    data["model"] = scenario.model.model_dump(mode="json")
    data["training"] = scenario.training.model_dump(mode="json", exclude_defaults=True)
    if scenario.placement is None:  # a placement says the nodes of each group itself
        data["nodes"] = scenario.nodes_used
    data["fidelity"] = "reduced"
    if note:
        data["description"] = (scenario.description + " " + note).strip()
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=100)


def write_outputs(table: pd.DataFrame, out: Path, fmt: str = "csv") -> list[Path]:
    """Write the table, the best layout's scenario and the plot into ``out``."""
    if fmt not in FORMATS:
        raise UserError(f"--format: {fmt!r} is not one of {', '.join(FORMATS)}")
    out.mkdir(parents=True, exist_ok=True)
    written = []
    path = out / f"layouts.{fmt}"
    if fmt == "parquet":
        try:
            # attrs hold the summary and the best scenario, which Parquet's JSON metadata
            # cannot carry (pandas raises on them); the columns are the table.
            plain = table.copy()
            plain.attrs = {}
            plain.to_parquet(path, index=False)
        except ImportError:
            raise UserError("--format parquet needs pyarrow (pip install 'llmsim[parquet]'); "
                            "or use --format csv") from None
    else:
        table.to_csv(path, index=False)
    written.append(path)
    best = table.attrs.get("best")
    if best is not None:
        path = out / "best.yaml"
        row = table.iloc[0]
        path.write_text(scenario_yaml(
            best, f"[Best layout of `llmsim search` by {table.attrs['summary'].objective}: "
                  f"{row['key']}.]"), encoding="utf-8")
        written.append(path)
    if len(table) and "est_step_time_s" in table and table["est_step_time_s"].notna().any():
        path = out / "search.png"
        plot(table).savefig(path, dpi=120, bbox_inches="tight")
        written.append(path)
    return written


def plot(table: pd.DataFrame) -> Any:
    """The objective (the estimator's) against the devices used, coloured by memory per
    device; the engine-confirmed layouts circled, the best one starred. Returns the
    figure."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    column = table.attrs.get("objective_column", "days")
    est = {"days": "est_days", "step_time_s": "est_step_time_s", "mfu": "est_mfu",
           "tokens_per_device_s": "est_tokens_per_device_s"}[column]
    fig, ax = plt.subplots(figsize=(8, 5))
    points = ax.scatter(table["devices"], table[est], c=table["memory_gb"], s=6,
                        cmap="viridis", alpha=0.6, linewidths=0)
    fig.colorbar(points, ax=ax, label="memory per device (GB)")
    if column in table:
        confirmed = table[table[column].notna()]
        ax.scatter(confirmed["devices"], confirmed[column], s=40, facecolors="none",
                   edgecolors="black", label="confirmed by the engine")
        if len(confirmed):
            ax.scatter(confirmed["devices"].iloc[:1], confirmed[column].iloc[:1], s=200,
                       marker="*", color="red", label="best")
    ax.set_xscale("log", base=2)
    if column in ("days", "step_time_s"):
        ax.set_yscale("log")
    ax.set_xlabel("devices used")
    ax.set_ylabel(_LABELS[column] + " (estimator; engine for the circled)")
    ax.set_title(f"{len(table):,} layouts priced")
    ax.legend(loc="best")
    return fig
