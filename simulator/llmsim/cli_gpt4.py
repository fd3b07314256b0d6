"""``llmsim gpt4``: the days-to-GPT-4 table (cli.py registers it; docs/gpt4.md)."""

import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from llmsim import catalog, gpt4, gpt4_sources
from llmsim.cli_console import console
from llmsim.errors import UserError

if TYPE_CHECKING:
    import pandas as pd


def _num(value: Any, fmt: str) -> str:
    """``value`` formatted, or an em dash when missing."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    return format(value, fmt)


def _calendar_days(r: Any) -> str:
    """Expected calendar days with the Monte Carlo's 10–90 % (llmsim.calendar)."""
    if r.calendar_days is None or r.calendar_days != r.calendar_days:  # None or NaN
        return "—"
    return f"{r.calendar_days:,.0f} ({r.calendar_days_p10:,.0f}–{r.calendar_days_p90:,.0f})"


def render_table(df: "pd.DataFrame", console: Console) -> None:
    """Print the table side by side, a unit in every header, then one line per machine
    on why llmsim's days differ from the source's."""
    table = Table(title="Days to train GPT-4 (3·10²⁵ FLOPs, gpt4-proxy-dense): the source "
                  "documents against llmsim's best layout", title_justify="left")
    for name in ("system", "devices (idle)", "source days", "source method days",
                 "llmsim best layout", "step s", "MFU %", "memory GB/device", "llmsim days",
                 "llmsim / source", "calendar days (10–90 %)", "MWh"):
        table.add_column(name, justify="left" if name in ("system", "llmsim best layout")
                         else "right")
    for r in df.itertuples():
        devices = f"{int(r.devices):,} ({int(r.idle_devices):,})" if r.layout else "—"
        doubt = " (?)" if r.source_doubtful else ""
        stated = "" if r.factor_stated else ", assumed"
        method = (f"{r.method_days:,.0f} = {r.peak_eflops:,.2f} EFLOP/s "
                  f"×{r.factor:g}{stated}")
        layout = (r.layout or "no layout fits") + (" (catalog's)" if r.catalog_layout_won
                                                   else "")
        table.add_row(f"{r.system}\n{r.source}", devices, f"{r.source_days:,.0f}{doubt}",
                      method, layout, _num(r.step_time_s, ",.1f"),
                      _num(None if r.mfu is None else 100 * r.mfu, ".1f"),
                      _num(r.memory_gb, ".1f"), _num(r.days, ",.0f"),
                      _num(r.days_over_source, ".2f"), _calendar_days(r),
                      _num(r.run_mwh, ",.0f"))
    console.print(table)
    for r in df.itertuples():
        console.print(f"[bold]{r.system}[/bold]: {r.why}", highlight=False, soft_wrap=True)
    console.print("devices are llmsim's (MI250X GCDs, Ponte Vecchio stacks: two per package); "
                  "source method = 3·10²⁵ FLOPs / (catalog peak × the source's accelerators) "
                  "× its factor (×2 OpenAI and ×4 Fugaku as the source states, ×2 assumed for "
                  "the other GPU machines)", highlight=False, soft_wrap=True)
    console.print("calendar days = the best layout's run with failures, restarts and "
                  "checkpoints (each system's failure rates, Daly's interval), expected, with "
                  "the 10–90 % of a seeded Monte Carlo; MWh = its energy (devices, and nodes, "
                  "network and PUE where the catalog has them; — without power figures): "
                  "docs/calendar.md", highlight=False, soft_wrap=True)


def best_yaml(result: gpt4.SystemResult) -> str:
    """The best layout as a scenario file ``llmsim run`` takes as is: the catalog
    scenario with its nodes, parallel layout and global batch replaced."""
    import yaml

    assert result.best is not None  # callers check
    best, row = result.best, result.source
    from llmsim import loader
    from llmsim.search.space import Layout

    raw = loader.read_yaml(catalog.path_of("scenarios", row.scenario))
    raw["name"] = f"{row.scenario}-gpt4-best"
    raw["description"] = (f"llmsim gpt4's best layout for {row.label} "
                          f"({best.devices:,} devices): {gpt4.compact_of(best)}; "
                          f"from the catalog scenario {row.scenario}")
    if best.placement is None:  # a placement says the nodes of each group itself
        raw["nodes"] = best.nodes_used
    else:  # the searched placement, not the catalog's (whose stages add up to its pp)
        raw["placement"] = best.placement.model_dump(mode="json", exclude_defaults=True)
    # Every field the best layout sets away from its default, so that settings the layout
    # rules out (apply drops them) and uneven stage splits of another pp are gone too.
    fields = best.parallelism.model_dump(mode="json")
    raw["parallelism"] = {k: v for k, v in fields.items()
                          if k in best.parallelism.model_dump(exclude_defaults=True)
                          or k in Layout.__dataclass_fields__}
    raw.setdefault("training", {})["global_batch"] = best.training.global_batch
    return yaml.safe_dump(raw, sort_keys=False, allow_unicode=True, width=100)


def plot_days(df: "pd.DataFrame", path: Path) -> Path:
    """Days per machine, log scale: the source's, its method recomputed, llmsim's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.27
    xs = range(len(df))
    for i, (col, label) in enumerate((("source_days", "source's table"),
                                      ("method_days", "source's method, recomputed"),
                                      ("days", "llmsim, best layout found"))):
        values = df[col].astype(float).fillna(0.0)
        ax.bar([x + (i - 1) * width for x in xs], values, width, label=label)
    ax.set_xticks(list(xs), df["system"])
    ax.set_yscale("log")
    ax.set_ylabel("days to train 3·10²⁵ FLOPs")
    ax.set_title("Days to GPT-4 per machine")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_outputs(df: "pd.DataFrame", results: list[gpt4.SystemResult], out_dir: Path
                  ) -> list[Path]:
    """``gpt4.csv``, a ``<system>-best.yaml`` per machine with a layout, ``gpt4.png``."""
    paths = [out_dir / "gpt4.csv"]
    df.to_csv(paths[0], index=False)
    for result in results:
        if result.best is not None:
            path = out_dir / f"{result.source.system}-best.yaml"
            path.write_text(best_yaml(result), encoding="utf-8")
            paths.append(path)
    paths.append(plot_days(df, out_dir / "gpt4.png"))
    return paths


def gpt4_cmd(
    systems: Annotated[str | None, typer.Option(
        "--systems",
        help=f"Comma-separated machines (default all: {','.join(gpt4_sources.SYSTEMS)}).")]
    = None,
    max_layouts: Annotated[int | None, typer.Option(
        "--max-layouts", help="Core layouts sampled per machine (default: the whole space, "
        "35,000–660,000 core layouts, less those the search's bound skips).")]
    = gpt4.DEFAULT_MAX_LAYOUTS,
    top: Annotated[int, typer.Option(
        "--top", help="Layouts the engine confirms per machine (the estimator's best).")] = 3,
    confirm_timeout_s: Annotated[float, typer.Option(
        "--confirm-timeout", help="Seconds one engine run of a candidate may take before "
        "the next candidate is tried.")] = gpt4.CONFIRM_TIMEOUT_S,
    workers: Annotated[int | None, typer.Option(
        "--workers", help="Processes (default: every core).")] = None,
    out_dir: Annotated[Path | None, typer.Option(
        "--out", help="Write gpt4.csv, <system>-best.yaml and gpt4.png here (and each "
        "machine's priced layouts under <system>/search).")] = None,
) -> None:
    """Days to train GPT-4 (3·10²⁵ FLOPs) on each machine of the source documents: their
    estimate, their method recomputed, and llmsim's best layout found by the search."""
    from llmsim.out_dir import check_out_dir

    if workers is not None and workers < 1:
        raise UserError(f"--workers: {workers} must be 1 or more (processes)")
    rows = gpt4.select(systems)
    if out_dir is not None:
        check_out_dir(out_dir)
    err = console(stderr=True, piped_width=220)
    df, results = gpt4.days_table(
        ",".join(r.system for r in rows), max_layouts=max_layouts, top=top, workers=workers,
        out=out_dir, confirm_timeout_s=confirm_timeout_s,
        progress=lambda name: err.print(f"searching {name} …", highlight=False))
    out = console(piped_width=220)
    render_table(df, out)
    if out_dir is not None:
        paths = write_outputs(df, results, out_dir)
        out.print("wrote " + ", ".join(str(p) for p in paths), highlight=False,
                  soft_wrap=True)
