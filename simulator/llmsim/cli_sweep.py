"""``llmsim sweep``: one scenario over a grid of field values (cli.py registers it)."""

import math
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from llmsim.cli_console import console
from llmsim.errors import UserError


def sweep(
    scenario: Annotated[str, typer.Argument(help="Scenario file, or a catalog name.")],
    vary: Annotated[list[str], typer.Option(
        "--vary", metavar="KEY=V1,V2,…", help="A field and its values: --vary "
        "parallelism.micro_batch=1,2,4 (repeatable; the grid is every combination).")],
    set_: Annotated[list[str] | None, typer.Option(
        "--set", metavar="KEY=VALUE", help="Override a field first (repeatable).")] = None,
    workers: Annotated[int | None, typer.Option(
        help="Local processes (default: every core).")] = None,
    out_dir: Annotated[Path | None, typer.Option(
        "--out", help="Write sweep.csv (or .parquet) and sweep.png here.")] = None,
    fmt: Annotated[str, typer.Option("--format", help="Table format: csv or parquet.")] = "csv",
) -> None:
    """Simulate SCENARIO at every point of a grid of field values."""
    from llmsim.sweeps import parse_vary, plot
    from llmsim.sweeps import sweep as run_sweep

    if fmt not in ("csv", "parquet"):
        raise UserError(f"--format: {fmt!r} is not one of csv, parquet")
    if workers is not None and workers < 1:
        raise UserError(f"--workers: {workers} must be 1 or more")
    grid = parse_vary(vary)
    source: object = scenario
    if set_:
        import copy

        from llmsim import loader

        raw = loader.load_scenario(scenario, set_)  # validated once, with the overrides
        source = copy.deepcopy(raw.model_dump(mode="json"))
    if out_dir is not None:
        from llmsim.out_dir import check_out_dir

        check_out_dir(out_dir)
    out, err = console(), console(stderr=True)
    start, last = time.monotonic(), [0.0]

    def progress(done: int, total: int) -> None:
        now = time.monotonic()
        if now - last[0] >= 5 or done == total:
            left = (now - start) / done * (total - done)
            err.print(f"sweep: {done}/{total} points, about {left:,.0f} s left",
                      highlight=False)
            last[0] = now

    table = run_sweep(source, grid, workers=workers, progress=progress)
    grid_table = Table(title=f"{Path(scenario).name}: {len(table)} points")
    keys = list(grid)
    for header in (*keys, "step s", "MFU %", "mem GB", "fits", "days", "error"):
        grid_table.add_column(header, justify="left" if header == "error" else "right")
    for _, row in table.iterrows():
        ok = row.get("error") is None or (isinstance(row.get("error"), float)
                                          and math.isnan(row["error"]))

        def num(name: str, spec: str, scale: float = 1.0, ok: bool = ok,
                row: object = row) -> str:
            value = row.get(name) if ok else None  # type: ignore[attr-defined]
            if value is None or (isinstance(value, float) and not math.isfinite(value)):
                return "—"
            return format(value * scale, spec)

        grid_table.add_row(*(str(row[k]) for k in keys), num("step_time_s", ".3f"),
                           num("mfu", ".1f", 100), num("memory_gb", ".1f"),
                           ("yes" if row["fits"] else "no") if ok else "—",
                           num("days", ",.1f"), "" if ok else str(row["error"]))
    out.print(grid_table)
    if out_dir is not None:
        path = out_dir / f"sweep.{fmt}"
        if fmt == "parquet":
            try:
                table.to_parquet(path, index=False)
            except ImportError:
                raise UserError("--format parquet needs pyarrow (pip install 'llmsim[parquet]'); "
                                "or use --format csv") from None
        else:
            table.to_csv(path, index=False)
        written = [path]
        if "step_time_s" in table:
            png = out_dir / "sweep.png"
            plot(table, keys).savefig(png, dpi=120, bbox_inches="tight")
            written.append(png)
        out.print("wrote " + ", ".join(str(p) for p in written), highlight=False)
