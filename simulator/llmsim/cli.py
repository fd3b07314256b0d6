"""The ``llmsim`` command line (typer). User mistakes print one line and exit 2."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from llmsim import catalog, loader
from llmsim.errors import UserError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Discrete-event simulator of distributed LLM training on supercomputers.",
    pretty_exceptions_enable=False,
)
schedule_app = typer.Typer(help="Pipeline schedules.", no_args_is_help=True)
app.add_typer(schedule_app, name="schedule")

out = Console()
err = Console(stderr=True)

SetOption = Annotated[
    list[str] | None,
    typer.Option("--set", help="Override a field: --set parallelism.tp=4 (repeatable)."),
]


@app.command()
def run(
    scenario: Annotated[str, typer.Argument(help="Scenario file, or a catalog name.")],
    set_: SetOption = None,
    out_dir: Annotated[Path | None, typer.Option("--out", help="Write result.json, "
                                                 "trace.json and timeline.png here.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Simulate one training step of SCENARIO and report where the time goes."""
    from llmsim.simulation import simulate

    spec = loader.load_scenario(scenario, set_ or [])
    result = simulate(spec)
    if as_json:
        sys.stdout.write(result.to_json() + "\n")
    else:
        from llmsim.report import render

        render(result, out)
    if out_dir is not None:
        from llmsim.export import write_outputs

        paths = write_outputs(result, out_dir)
        if not as_json:
            out.print("wrote " + ", ".join(str(p) for p in paths))


@app.command("catalog")
def catalog_cmd(
    kind: Annotated[str | None, typer.Argument(
        help="accelerators, systems, models or scenarios (default: all).")] = None,
) -> None:
    """List the bundled hardware, models and scenarios."""
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


@schedule_app.command("show")
def schedule_show(
    name: Annotated[str, typer.Argument(help="gpipe, 1f1b, interleaved-1f1b or zb-h1.")],
    stages: Annotated[int, typer.Option(min=1, help="Pipeline stages p.")] = 4,
    microbatches: Annotated[int, typer.Option(min=1, help="Micro-batches m.")] = 8,
    chunks: Annotated[int, typer.Option(min=1, help="Chunks per stage v (interleaved).")] = 1,
) -> None:
    """Print the step × stage grid of a schedule (unit-time F, B and W passes)."""
    from llmsim import schedules

    plan = schedules.build(name, stages, microbatches, chunks)
    out.print(schedules.format_grid(plan), highlight=False)


def main() -> None:
    """Entry point: run the app, turning user errors into one line and exit code 2."""
    try:
        app(standalone_mode=False)
    except UserError as exc:
        err.print(f"[red]error:[/red] {exc.message}", highlight=False)
        raise SystemExit(exc.exit_code) from None
    except typer.Abort:
        raise SystemExit(1) from None
    except Exception as exc:  # click usage errors carry their own exit code
        import click

        if isinstance(exc, click.ClickException):
            exc.show()
            raise SystemExit(exc.exit_code) from None
        raise


if __name__ == "__main__":
    main()
