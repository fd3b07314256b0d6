"""``llmsim search``: the best layouts of a scenario's model on its machine (cli.py
registers it)."""

import math
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from llmsim.cli_console import console
from llmsim.errors import UserError

if TYPE_CHECKING:
    import pandas as pd

LINE_EVERY_S = 5.0


class _Progress:
    """Batches done, layouts priced, layouts/s and the time left: a bar on a terminal,
    a line every few seconds otherwise."""

    def __init__(self, console: Console) -> None:
        self.console, self.start, self.last = console, time.monotonic(), 0.0
        self.bar = None
        if console.is_terminal:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
            )

            self.bar = Progress(TextColumn("pricing layouts"), BarColumn(), MofNCompleteColumn(),
                                TextColumn("batches · {task.fields[layouts]:,} layouts · "
                                           "{task.fields[rate]:,.0f} layouts/s"),
                                TimeRemainingColumn(), console=console, transient=True)
            self.task = self.bar.add_task("search", total=None, layouts=0, rate=0.0)
            self.bar.start()

    def __call__(self, done: int, total: int, layouts: int) -> None:
        now = time.monotonic()
        rate = layouts / (now - self.start) if now > self.start else 0.0
        if self.bar is not None:
            self.bar.update(self.task, completed=done, total=total, layouts=layouts, rate=rate)
            return
        if now - self.last >= LINE_EVERY_S or done == total:
            left = (now - self.start) / done * (total - done) if done else math.inf
            self.console.print(f"pricing layouts: {done}/{total} batches, {layouts:,} layouts, "
                               f"{rate:,.0f} layouts/s, about {left:,.0f} s left",
                               highlight=False, soft_wrap=True)
            self.last = now

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def _batch_range(text: str | None) -> tuple[int, ...] | None:
    """``LOW..HIGH`` → (low, high); ``LOW..HIGH:STEP`` → (low, high, step)."""
    if text is None:
        return None
    low, sep, rest = text.partition("..")
    high, colon, step = rest.partition(":")
    try:
        if not sep:
            raise ValueError
        return (int(low), int(high), int(step)) if colon else (int(low), int(high))
    except ValueError:
        raise UserError(f"--batch-range: {text!r} is not LOW..HIGH or LOW..HIGH:STEP in "
                        "sequences, e.g. 1024..2048:128") from None


def search(
    scenario: Annotated[str, typer.Argument(help="Scenario file, or a catalog name.")],
    set_: Annotated[list[str] | None, typer.Option(
        "--set", metavar="KEY=VALUE", help="Override a field of the scenario first "
        "(repeatable).")] = None,
    fix: Annotated[list[str] | None, typer.Option(
        "--fix", metavar="FIELD=VALUE", help="Search only layouts with this value: "
        "--fix parallelism.tp=8, --fix nodes=64 (repeatable).")] = None,
    objective: Annotated[str, typer.Option(
        help="What to optimise: days, step_time, mfu or tokens_per_device.")] = "days",
    top: Annotated[int, typer.Option(help="Best layouts re-run by the SimPy engine.")] = 20,
    memory_headroom: Annotated[float | None, typer.Option(
        help="Share of device memory a layout must leave free (default 0.1 = 10 %; a "
        "heterogeneous job's layer balance leaves it on every stage).")] = None,
    batch_range: Annotated[str | None, typer.Option(
        metavar="LOW..HIGH[:STEP]", help="Let the global batch vary over this range of "
        "sequences, every STEP-th from LOW with a step (default: the scenario's); a space "
        "of more than 5,000,000 core layouts needs --max-layouts.")] = None,
    max_layouts: Annotated[int | None, typer.Option(
        help="Price at most this many layouts before the overlap switches (a seeded random "
        "sample when the space is larger).")] = None,
    max_tp: Annotated[int | None, typer.Option(
        help="Largest tensor-parallel degree (default: 8 or a node's devices).")] = None,
    max_micro_batch: Annotated[int, typer.Option(help="Largest micro-batch tried.")] = 16,
    max_cp: Annotated[int, typer.Option(
        help="Largest context-parallel degree tried (1: none).")] = 1,
    max_parameter_servers: Annotated[int, typer.Option(
        help="Also try parameter servers in place of the gradient all-reduce, up to this "
        "many (0: none).")] = 0,
    asynchronous: Annotated[bool, typer.Option(
        help="Also try PipeDream (asynchronous 1F1B, no flush): its weight updates are "
        "stale, so it is not the same training; its rows say 'async'.")] = False,
    workers: Annotated[int | None, typer.Option(
        help="Local processes pricing layouts (default: every core).")] = None,
    scheduler: Annotated[str | None, typer.Option(
        metavar="ADDRESS", help="Price on a Dask cluster instead: tcp://host:8786.")] = None,
    out_dir: Annotated[Path | None, typer.Option(
        "--out", help="Write layouts.csv, best.yaml and search.png here (and keep the "
        "search there as it runs).")] = None,
    resume_dir: Annotated[Path | None, typer.Option(
        "--resume", metavar="DIR", help="Continue the search kept in DIR (an earlier "
        "--out) without pricing a layout twice, and write its outputs there.")] = None,
    fmt: Annotated[str, typer.Option("--format", help="Table format: csv or parquet.")] = "csv",
    show: Annotated[int, typer.Option(help="Layouts shown in the table.")] = 10,
    confirm_timeout: Annotated[float | None, typer.Option(
        metavar="SECONDS", help="Give up an engine run of a candidate after this long and "
        "confirm the next one instead (default: no limit).")] = None,
) -> None:
    """Find the best parallel layouts of SCENARIO's model on its machine."""
    from llmsim.search import search as run_search
    from llmsim.search.output import FORMATS, write_outputs

    if resume_dir is not None and out_dir is not None and out_dir != resume_dir:
        raise UserError(f"--resume: {resume_dir} is not --out's {out_dir}; give the folder "
                        "of the search to continue once, as --resume DIR")
    resume = resume_dir is not None
    out_dir = resume_dir if resume_dir is not None else out_dir
    if fmt not in FORMATS:
        raise UserError(f"--format: {fmt!r} is not one of {', '.join(FORMATS)}")
    if workers is not None and workers < 1:
        raise UserError(f"--workers: {workers} must be 1 or more")
    if max_cp < 1:
        raise UserError(f"--max-cp: {max_cp} must be 1 or more")
    if max_layouts is not None and max_layouts < 1:
        raise UserError(f"--max-layouts: {max_layouts} must be 1 or more")
    if show < 0:
        raise UserError(f"--show: {show} must be 0 or more (layouts shown in the table)")
    from llmsim import loader

    spec = loader.load_scenario(scenario, set_ or [])
    if out_dir is not None:
        from llmsim.out_dir import check_out_dir

        check_out_dir(out_dir)
    client = None
    if scheduler is not None:
        import importlib.util

        if importlib.util.find_spec("distributed") is None:
            raise UserError(f"--scheduler: {scheduler!r} needs dask.distributed, which is not "
                            "installed; pip install 'llmsim[dask]', or drop --scheduler")
        from llmsim.search.runner import connect

        client = connect(scheduler)
    out, err = console(), console(stderr=True)
    progress = _Progress(err)
    try:
        table = run_search(spec, objective=objective, fix=list(fix or []),
                           batch_range=_batch_range(batch_range), max_layouts=max_layouts,
                           memory_headroom=memory_headroom, top=top, workers=workers,
                           client=client, out=out_dir, resume=resume, max_tp=max_tp,
                           max_micro_batch=max_micro_batch, max_cp=max_cp,
                           progress=progress, confirm_timeout_s=confirm_timeout,
                           max_parameter_servers=max_parameter_servers,
                           asynchronous=asynchronous)
    finally:
        progress.close()
        if client is not None:
            client.close()
    render(table, out, show)
    if out_dir is not None:
        paths = write_outputs(table, out_dir, fmt)
        out.print("wrote " + ", ".join(str(p) for p in paths), highlight=False)
    sys.stdout.flush()


def _num(value: object, spec: str) -> str:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return "—"
    return "—" if not math.isfinite(number) else format(number, spec)


def render(table: "pd.DataFrame", console: Console, show: int = 10) -> None:
    """The summary and the best ``show`` layouts, units in the headers."""
    s = table.attrs.get("summary")
    if s is not None:
        sampled = " (a random sample)" if s.sampled else ""
        if s.sampled and s.space_layouts:  # a layout search: the space was counted
            sampled = (f" (a random sample of {s.core_layouts:,} of the space's "
                       f"{s.space_layouts:,} core layouts)")
        console.print(
            f"{s.scenario}: {s.priced:,} layouts priced{sampled}, {s.out_of_memory:,} over "
            f"{(1 - s.memory_headroom) * 100:.0f} % of device memory, {s.invalid:,} invalid; "
            f"best {s.confirmed} re-run by the engine; {s.wall_s:,.1f} s "
            f"({s.layouts_per_s:,.0f} layouts/s priced)"
            + (f"; {s.timed_out} engine runs over the --confirm-timeout, the next tried"
               if s.timed_out else ""), highlight=False, soft_wrap=True)
    if table.empty or "est_step_time_s" not in table:
        if s is not None and s.invalid and not s.out_of_memory:  # none reached the memory check
            console.print(f"no layout is valid: each of the {s.invalid:,} breaks a rule of the "
                          "scenario (a head, layer or batch count a --fix value does not "
                          "divide?); loosen the --fix values", highlight=False)
            return
        console.print("no layout fits: lower --memory-headroom's share, or allow more nodes, "
                      "a higher ZeRO stage or recompute", highlight=False)
        return
    best = table.iloc[0]
    if s is not None and best["idle_devices"]:
        console.print(f"the best layout leaves {int(best['idle_devices']):,} of "
                      f"{s.machine_devices:,} devices idle", highlight=False)
    grid = Table(title=f"best layouts by {s.objective if s else 'days'}")
    for header in ("#", "layout", "devices", "mem GB", "est step s", "step s", "est/eng",
                   "MFU %", "days"):
        grid.add_column(header, justify="left" if header == "layout" else "right")
    for i, (_, row) in enumerate(table.head(show).iterrows()):
        grid.add_row(str(i + 1), describe(row), f"{int(row['devices']):,}",
                     _num(row["memory_gb"], ".1f"), _num(row["est_step_time_s"], ".3f"),
                     _num(row.get("step_time_s"), ".3f"), _num(row.get("est_over_engine"), ".3f"),
                     _num(100 * float(row.get("mfu", math.nan)), ".1f"),
                     _num(row.get("days", row.get("est_days")), ",.1f"))
    console.print(grid)


RECOMPUTE_LABELS = {"none": "", "selective": "rc-sel", "full": "rc-full",
                    "full_keep_attention": "rc-full-keep-attn"}
"""A layout's recompute mode in :func:`describe`, one for each mode the spec accepts."""


def describe(row: object) -> str:
    """A layout in a few words: ``tp8 pp8 dp16 1f1b mb1 z1 sp sel``."""
    from llmsim.search.space import ASYNCHRONOUS

    r = row  # a pandas row or a mapping
    parts = [f"tp{r['tp']}", f"pp{r['pp']}", f"dp{r['dp']}"]
    parts += [f"{axis}{r[axis]}" for axis in ("ep", "cp") if r.get(axis, 1) > 1]
    if isinstance(r.get("placement"), str):  # a heterogeneous job's (placement_search)
        parts.append(r["placement"])
    schedule = r["schedule"] if r["pp"] > 1 else ""
    if schedule == "interleaved-1f1b":
        schedule = f"int-v{r['virtual_stages']}"
    elif schedule in ASYNCHRONOUS:  # stale weights: not the same training
        schedule = f"{schedule} (async)"
    parts += [p for p in (schedule, f"mb{r['micro_batch']}", f"z{r['zero']}") if p]
    if r["sequence_parallel"]:
        parts.append("sp")
    parts.append(RECOMPUTE_LABELS[r["recompute"]])
    flags = [name for name, on in (("tp-ovl", r["overlap_tp_comm"]),
                                   ("pp-ovl", r["overlap_pp_comm"]),
                                   ("ag-ovl", r["overlap_param_gather"]),
                                   ("no-dp-ovl", not r["overlap_dp_comm"])) if on]
    return " ".join(p for p in parts + flags if p)
