"""``llmsim compare``: scenarios, or variants of one, side by side (cli.py registers it)."""

import math
import shlex
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from llmsim.cli_console import console
from llmsim.errors import UserError

_PARTS = (("compute", "compute"), ("tp_comm", "exposed TP comm"), ("pp_comm", "exposed PP comm"),
          ("dp_comm", "exposed DP comm"), ("bubble", "pipeline bubble / wait"),
          ("optimizer", "optimizer"))


def _relative(value: float | None, first: float | None) -> str:
    """`` (+3.1 %)`` against the first column; empty for the first or a missing value."""
    if value is None or first is None or not (math.isfinite(value) and math.isfinite(first)) \
            or first == 0 or value == first:
        return ""
    return f" ({(value - first) / first * 100:+.1f} %)"


def _columns(scenarios: list[str], variants: list[str]) -> list[tuple[str, str, list[str]]]:
    """(label, scenario, overrides) per column: each scenario, then it with each variant;
    a label is the scenario's file name (its path if two share a name) and the variant."""
    columns = []
    names = [Path(s).name for s in scenarios]  # a file's name, not its folders, if unique
    for scenario in scenarios:
        short = Path(scenario).name if len(set(names)) == len(names) else scenario
        columns.append((short, scenario, []))
        for variant in variants:
            try:
                items = shlex.split(variant)
            except ValueError as exc:
                raise UserError(f"--variant {variant!r}: {exc}; quote values with spaces "
                                "inside the variant") from None
            if not items:
                raise UserError("--variant '': give one or more key=value overrides, e.g. "
                                "--variant 'parallelism.tp=4 parallelism.dp=2048'")
            columns.append((f"{short} [{' '.join(items)}]", scenario, items))
    labels = [label for label, _, _ in columns]
    return [(label if labels.count(label) == 1 else f"{label} #{i + 1}", s, o)
            for i, (label, s, o) in enumerate(columns)]


def _check_csv(path: Path) -> None:
    """Refuse a ``--csv`` file that cannot be written, before anything is simulated."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_dir():
            raise IsADirectoryError(21, "it is a folder")
        with path.open("a", encoding="utf-8"):
            pass
    except OSError as exc:
        raise UserError(f"--csv {str(path)!r}: cannot write there ({exc.strerror}); give a "
                        "file path you can write to") from None


def compare(
    scenarios: Annotated[list[str], typer.Argument(
        metavar="SCENARIO...",
        help="Scenario files or catalog names (one is enough with --variant).")],
    set_: Annotated[list[str] | None, typer.Option(
        "--set", metavar="KEY=VALUE",
        help="Override a field in every scenario (repeatable).")] = None,
    variants: Annotated[list[str] | None, typer.Option(
        "--variant", metavar="'KEY=VALUE ...'",
        help="One more column per scenario: it with these overrides, separated by spaces "
        "(repeatable).")] = None,
    csv_path: Annotated[Path | None, typer.Option(
        "--csv", help="Also write the comparison here, one row per column.")] = None,
) -> None:
    """Simulate several scenarios, or variants of one, and show them side by side: step
    time and where it goes, throughput, MFU, memory per device and days to train."""
    from llmsim.compare import compare as table_of
    from llmsim.progress import track
    from llmsim.report import fmt_seconds
    from llmsim.simulation import simulate

    columns = _columns(scenarios, variants or [])
    if len(columns) < 2:
        raise UserError("compare: give two or more scenarios, or one with --variant "
                        "'key=value ...' (e.g. --variant parallelism.micro_batch=2)")
    if csv_path is not None:
        _check_csv(csv_path)
    from llmsim import loader

    specs = {label: loader.load_scenario(scenario, [*(set_ or []), *overrides])
             for label, scenario, overrides in columns}
    results = {label: simulate(spec)
               for label, spec in track(list(specs.items()), "simulating",
                                        label=lambda item: item[0])}
    df = table_of(results)
    out = console()
    grid = Table(title="llmsim compare (critical stage's breakdown; % against the first "
                 "column)", title_justify="left")
    grid.add_column("")
    for label in df["label"]:
        grid.add_column(escape(label), justify="right")
    first = df.iloc[0]

    def add(name: str, cells: list[str]) -> None:
        grid.add_row(name, *cells)

    rows = list(df.itertuples(index=False))
    add("layout", [r.layout for r in rows])
    add("devices", [f"{r.devices:,}" for r in rows])
    add("step time", [fmt_seconds(r.step_time_s) + _relative(r.step_time_s,
                                                             first.step_time_s) for r in rows])
    for key, name in _PARTS:
        add(f"  {name}", [fmt_seconds(getattr(r, f"{key}_s")) for r in rows])
    add("tokens/s", [f"{r.tokens_per_s:,.0f}" for r in rows])
    add("MFU", [f"{r.mfu * 100:.1f} %" for r in rows])
    add("memory per device", [f"{r.memory_gb:.1f} of {r.capacity_gb:.0f} GB"
                              + ("" if r.fits else " (does not fit)") for r in rows])
    add("days to train", ["—" if r.days_to_train is None or r.days_to_train != r.days_to_train
                          else f"{r.days_to_train:,.1f}"
                          + _relative(r.days_to_train, first.days_to_train) for r in rows])
    out.print(grid)
    if csv_path is not None:
        df.to_csv(csv_path, index=False, float_format="%.6g")
        out.print(f"wrote {csv_path}", highlight=False, soft_wrap=True)
