"""The ``llmsim`` command line (typer). User mistakes print one line and exit 2.

The command modules (``cli*.py``) evaluate their annotations when they are defined (no
``from __future__ import annotations``): typer reads every command's parameter types
each time the app is built, at every start, and evaluates each string annotation twice
(``tests/test_cli_startup.py``).
"""

import atexit
import gc
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from llmsim import (
    catalog,
    cli_calibrate,
    cli_compare,
    cli_gpt4,
    cli_search,
    cli_sweep,
    cli_time_gemms,
)
from llmsim.cli_console import console
from llmsim.errors import UserError
from llmsim.out_dir import check_out_dir

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Discrete-event simulator of distributed LLM training on supercomputers.",
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain help: flags without a '<bool>' type, nothing boxed
    context_settings={"help_option_names": ["-h", "--help"]},
)
schedule_app = typer.Typer(help="Pipeline schedules.", no_args_is_help=True)
app.add_typer(schedule_app, name="schedule")
calibrate_app = typer.Typer(
    help="Build a calibration profile from your own GEMM and nccl-tests measurements "
    "(docs/calibration.md).",
    no_args_is_help=True,
)
app.add_typer(calibrate_app, name="calibrate")


out = console()
err = console(stderr=True)

SetOption = Annotated[
    list[str] | None,
    typer.Option("--set", metavar="KEY=VALUE",
                 help="Override a field: --set parallelism.tp=4 (repeatable)."),
]


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        out.print(f"llmsim {version('llmsim')}", highlight=False)
        raise typer.Exit()


@app.callback()
def _common(
    version: Annotated[bool, typer.Option("--version", callback=_print_version,
                                          is_eager=True, help="Print the version and exit.")]
    = False,
) -> None:
    pass


LONG_RUN_PASSES = 200_000
"""Above this many layer passes (``Scenario.sim_passes``, 20–70 µs each on one core of the
test machine), ``llmsim run`` says up front how long the simulation will take."""


def _simulation_progress() -> Callable[[float], None]:
    """A progress line for a long simulation: the share of its pipeline actions begun,
    the time it has run and about how long is left (assuming the rest goes as fast)."""
    import time

    start = time.monotonic()

    def report(share: float) -> None:
        elapsed = time.monotonic() - start
        left = f", about {elapsed / share * (1 - share):,.0f} s left" if share > 0 else ""
        err.print(f"simulating: {share * 100:.0f} % of the pipeline actions begun, "
                  f"{elapsed:,.0f} s elapsed{left}", highlight=False, soft_wrap=True)

    return report


@app.command()
def run(
    scenario: Annotated[str, typer.Argument(help="Scenario file, or a catalog name.")],
    set_: SetOption = None,
    out_dir: Annotated[Path | None, typer.Option("--out", help="Write result.json, "
                                                 "trace.json and timeline.png here.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Simulate one training step of SCENARIO and report where the time goes."""
    from llmsim import error_band, loader
    from llmsim.calendar import summarize
    from llmsim.simulation import simulate

    spec = loader.load_scenario(scenario, set_ or [])
    if out_dir is not None:
        check_out_dir(out_dir)
    if spec.calibration:
        from llmsim.calibration import load_calibration

        cal = load_calibration(spec.calibration)
        source = f"; source: {cal.source}" if cal.source else ""
        (err if as_json else out).print(
            f"calibration profile in use: {spec.calibration} ({len(cal.gemm)} GEMM shapes, "
            f"{len(cal.collectives)} collective sizes{source})", highlight=False,
            soft_wrap=True)
    progress = None
    if spec.sim_passes > LONG_RUN_PASSES:  # say what's coming, then how far it is
        err.print(f"simulating {spec.sim_passes:,} layer passes, about "
                  f"{spec.sim_passes * 20e-6:.0f}–{spec.sim_passes * 70e-6:.0f} s "
                  "(docs/scenarios.md, Limits)", highlight=False, soft_wrap=True)
        progress = _simulation_progress()
    result = simulate(spec, progress=progress)
    calendar = summarize(result)
    spread = None
    if not spec.jitter.is_zero:  # the step's mean and tail over seeded steps
        from llmsim.calendar.stragglers import step_spread

        spread = step_spread(spec)
    band = error_band.scenario_band(spec)
    if as_json:
        data = json.loads(result.to_json())
        data["error_band"] = error_band.to_dict(band, result.step_time_s)
        data["calendar"] = None if calendar is None else calendar.to_dict()
        data["step_time_spread"] = None if spread is None else spread.to_dict()
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
    else:
        from llmsim.report import render, render_calendar, render_step_spread

        render(result, out, error_band.describe(band, result.step_time_s))
        if spread is not None:
            render_step_spread(spread, result.days_to_train, result.step_time_s, out)
        if calendar is not None:
            render_calendar(calendar, out)
    if out_dir is not None:
        from llmsim.export import write_outputs

        paths = write_outputs(result, out_dir)
        if not as_json:
            out.print("wrote " + ", ".join(str(p) for p in paths))


@app.command("catalog")
def catalog_cmd(
    kind: Annotated[str | None, typer.Argument(
        help="accelerators, collectives, systems, models or scenarios (default: all); or "
        "import-hf.")] = None,
    file: Annotated[Path | None, typer.Argument(
        help="With import-hf: a Hugging Face config.json.")] = None,
    name: Annotated[str | None, typer.Option(
        "--name", help="With import-hf: the model's name.")] = None,
    out_path: Annotated[Path | None, typer.Option(
        "--out", help="With import-hf: write the model YAML here instead of printing it.")]
    = None,
) -> None:
    """List the bundled hardware, collective libraries, models and scenarios; or, with
    import-hf FILE, turn a Hugging Face config.json into a model entry."""
    if kind == "import-hf":
        from llmsim.cli_hf import import_hf

        return import_hf(file, name, out_path, out)
    if file is not None or name is not None or out_path is not None:
        raise UserError("catalog: a file, --name and --out go with import-hf only; run "
                        "`llmsim catalog import-hf config.json` or drop them")
    from llmsim import loader

    kinds = list(catalog.KINDS)
    if kind is not None and kind not in kinds:
        raise UserError(f"catalog kind {kind!r} is unknown; use one of {', '.join(kinds)}")
    for k in [kind] if kind else kinds:
        table = Table(title=k, title_justify="left")
        table.add_column("name")
        table.add_column("description")
        for name in catalog.names(k):  # type: ignore[arg-type]
            raw = loader.read_yaml(catalog.path_of(k, name))  # type: ignore[arg-type]
            table.add_row(name, str(raw.get("description", "")))
        out.print(table)


MAX_GRID_CELLS = 16_384
"""Most stages × micro-batches × chunks ``schedule show`` prints (about a second)."""


@schedule_app.command("show")
def schedule_show(
    name: Annotated[str, typer.Argument(help="gpipe, 1f1b, interleaved-1f1b, zb-h1, zb-h2, "
                                             "zb-v (--chunks 2), chimera, dualpipe or pipedream.")],
    stages: Annotated[int, typer.Option(min=1, help="Pipeline stages p.")] = 4,
    microbatches: Annotated[int, typer.Option(min=1, help="Micro-batches m.")] = 8,
    chunks: Annotated[int, typer.Option(min=1, help="Chunks per stage v (interleaved).")] = 1,
) -> None:
    """Print the step × stage grid of a schedule (unit-time F, B and W passes)."""
    from llmsim import schedules

    if stages * microbatches * chunks > MAX_GRID_CELLS:
        raise UserError(f"schedule show: {stages} stages × {microbatches} micro-batches × "
                        f"{chunks} chunks = {stages * microbatches * chunks:,}, more than the "
                        f"{MAX_GRID_CELLS:,} a printed grid shows; use smaller numbers")
    plan = schedules.build(name, stages, microbatches, chunks)
    out.print(schedules.format_grid(plan), highlight=False)
    info = schedules.SCHEDULES[name]
    peaks = " ".join(str(n) for n in schedules.peak_in_flight(plan))
    out.print(f"peak in flight per stage (micro-batch-chunks): {peaks}", highlight=False)
    versions = [info.weight_versions(stages, i, microbatches) * info.pipelines  # Chimera: 2
                for i in range(stages)]
    if any(n != 1 for n in versions):
        out.print("weight copies per stage: " + " ".join(map(str, versions)), highlight=False)


@app.command("validate")
def validate_cmd(
    subset: Annotated[
        str | None,
        typer.Option("--subset", help="Only rows whose id starts with PREFIX (NAR21, ZB24 ...)."),
    ] = None,
    out_dir: Annotated[
        Path | None,
        typer.Option("--out", help="Write validation.csv, validation.md and validation.png here."),
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option("--workers", min=1,
                     help="Processes that simulate the rows (default: every core)."),
    ] = None,
) -> None:
    """Compare llmsim with published, measured training runs (docs/validation.md)."""
    from rich import box

    from llmsim import validation

    if out_dir is not None:
        check_out_dir(out_dir)
    df = validation.validate(validation.load_runs(subset), progress=True,
                             workers=workers or os.cpu_count() or 1)
    table = Table(
        title="llmsim vs published measurements", title_justify="left", box=box.SIMPLE_HEAD
    )
    for name in ("id", "quantity", "measured", "llmsim", "error %"):
        table.add_column(name, justify="left" if name in ("id", "quantity") else "right")
    for r in df.itertuples():
        size = abs(r.error_pct)
        colour = "green" if size <= 10 else "yellow" if size <= 20 else "red"
        error = f"[{colour}]{r.error_pct:+.1f}[/{colour}]"
        table.add_row(r.id, validation.QUANTITY_UNITS[r.metric], f"{r.measured:.4g}",
                      f"{r.predicted:.4g}", error)
    out.print(table)
    stats = Table(
        title="summary per source (MAPE, median |error|, mean error, worst row)",
        title_justify="left",
        box=box.SIMPLE_HEAD,
    )
    for name in ("source", "rows", "MAPE %", "median %", "mean %", "worst row", "worst %"):
        stats.add_column(name, justify="left" if name in ("source", "worst row") else "right")
    for s in validation.summary(df).itertuples():
        stats.add_row(
            s.group,
            str(s.rows),
            f"{s.mape_pct:.1f}",
            f"{s.median_abs_pct:.1f}",
            f"{s.bias_pct:+.1f}",
            s.worst_id,
            f"{s.worst_error_pct:+.1f}",
        )
    out.print(stats)
    ranking = validation.schedule_ranking(df)
    if not ranking.empty:
        orders = Table(
            title=f"ZB24 schedule order (fastest first) reproduced in "
            f"{int(ranking['same'].sum())} of {len(ranking)} configurations",
            title_justify="left",
            box=box.SIMPLE_HEAD,
        )
        for name in ("configuration", "measured", "llmsim", "same"):
            orders.add_column(name)
        for r in ranking.itertuples():
            tie = f" ({r.ties})" if r.ties else ""
            same = "yes" if r.same else "[red]no[/red]"
            orders.add_row(r.config, r.measured_order + tie, r.predicted_order, same)
        out.print(orders)
    from llmsim.validation.sensitivity import goal_ranges

    ranges = goal_ranges(df)
    goal = validation.accuracy_goal(df, ranges)
    if goal is not None:
        scope = "" if subset is None else f" on the {goal.rows} target rows of this subset"
        verdict = "[green]met[/green]" if goal.met else "[red]not met[/red]"
        judged = Table(title=f"accuracy goal{scope}: {verdict}", title_justify="left",
                       box=box.SIMPLE_HEAD)
        for name in ("part of the goal", "result", "met"):
            judged.add_column(name)
        for part, result, met in goal.parts():
            judged.add_row(part, result, "[red]no[/red]" if met == "no" else met)
        out.print(judged)
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        df.to_csv(out_dir / "validation.csv", index=False)
        (out_dir / "validation.md").write_text(validation.markdown_tables(df, ranges),
                                               encoding="utf-8")
        png = validation.plot_validation(df, out_dir / "validation.png")
        out.print(f"wrote {out_dir / 'validation.csv'}, {out_dir / 'validation.md'}, {png}")


app.command("compare")(cli_compare.compare)
app.command("search")(cli_search.search)
app.command("sweep")(cli_sweep.sweep)
app.command("gpt4")(cli_gpt4.gpt4_cmd)
calibrate_app.command("gemm")(cli_calibrate.calibrate_gemm)
calibrate_app.command("shapes")(cli_calibrate.calibrate_shapes)
calibrate_app.command("nccl")(cli_calibrate.calibrate_nccl)
calibrate_app.command("time-gemms")(cli_time_gemms.time_gemms)


GC_FIRST_GENERATION = 100_000
"""Allocations between two passes of Python's cyclic garbage collector over new objects in
the command line (Python's default: 700). A command's start makes some 10⁵ objects that
live to its end (pydantic's validators, the specs, the cost tables) and no garbage; at
700 the collector passed over them about 130 times, one of them over every object, about
a tenth of ``llmsim run``'s CPU time. At 10,000 it still passed over them 6 times in
``llmsim run frontier.yaml``'s command (5 young passes and one over the middle
generation, 25–35 ms of CPU by ``gc.callbacks``, a twentieth of the run); at 100,000
not once: the command makes fewer. The garbage a pass would have freed waits for the
next one: up to 10⁵ container objects, some 10 MB."""

BLAS_THREADS = "1"
"""OpenBLAS threads the command line asks for (``OPENBLAS_NUM_THREADS``; a value the user
set wins). llmsim calls numpy's element-wise operations and never BLAS, but at numpy's
import OpenBLAS starts a worker thread per core that busy-waits for work (its thread
timeout, 2^28 cycles, about 0.1 s) before it sleeps: CPU time a short command pays beside
its own. One thread starts none. Set here, before any command imports numpy, and not when
``llmsim`` is imported: a library leaves its user's threads alone."""


def main() -> None:
    """Entry point: run the app, turning user errors into one line and exit code 2.

    Usage errors (an unknown command or option) are reported by typer itself, with the
    usage line and exit code 2; a :class:`UserError` from inside a command is printed
    here as one line. Before any command runs it sets the process's start-up settings:
    one OpenBLAS thread (:data:`BLAS_THREADS`), the collector's threshold
    (:data:`GC_FIRST_GENERATION`) and the collector frozen at exit: the interpreter's
    finalization would run full collections over every object still alive (some 10⁵ after
    ``llmsim run``) only to free memory the process gives back anyway (``llmsim run
    frontier.yaml``: 50–90 ms of CPU less; ``__del__`` of objects in unreachable cycles
    at exit, which Python does not promise either, is what it gives up).
    """
    os.environ.setdefault("OPENBLAS_NUM_THREADS", BLAS_THREADS)
    gc.set_threshold(GC_FIRST_GENERATION, *gc.get_threshold()[1:])
    atexit.unregister(gc.freeze)  # once, however often main() runs in one process
    atexit.register(gc.freeze)
    try:
        app(prog_name="llmsim")
    except UserError as exc:
        from rich.markup import escape  # a message's own brackets, as "llmsim[dask]", stay

        err.print(f"[red]error:[/red] {escape(exc.message)}", highlight=False, markup=True,
                  soft_wrap=True)
        raise SystemExit(exc.exit_code) from None


if __name__ == "__main__":
    main()
