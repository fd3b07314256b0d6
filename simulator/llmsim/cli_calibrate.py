"""``llmsim calibrate gemm | shapes | nccl``: measurements into a calibration profile, and
the GEMM shapes a scenario runs (cli.py registers them; ``time-gemms`` is cli_time_gemms)."""

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from llmsim.cli_console import console
from llmsim.errors import UserError

out = console()

ProfileOption = Annotated[
    Path,
    typer.Option("--out", help="Profile to write; an existing one keeps its other table."),
]
SourceOption = Annotated[
    str | None,
    typer.Option("--source", help="Where the measurements come from: machine, software, date."),
]


def _si_bytes(n: object) -> str:
    """8 B, 1.05 MB, 8.59 GB: a message size in SI units."""
    size = float(n)  # type: ignore[arg-type]
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size >= scale:
            return f"{size / scale:.3g} {unit}"
    return f"{size:.0f} B"


def _wrote_profile(path: Path) -> None:
    out.print(f"wrote {path}; use it with 'calibration: {path}' in a scenario or "
              f"--set calibration={path}", highlight=False, soft_wrap=True)


def calibrate_gemm(
    files: Annotated[list[Path], typer.Argument(
        help="CSV files with columns m, n, k, dtype, tflops.")],
    out_path: ProfileOption = Path("calibration.yaml"),
    source: SourceOption = None,
) -> None:
    """Measured GEMM throughputs → the profile's GEMM table (replaces the efficiency model)."""
    from llmsim import calibration

    points = [p for f in files for p in calibration.parse_gemm_csv(f)]
    table = Table(title=f"GEMM shapes measured ({len(points)})", title_justify="left")
    for name in ("dtype", "shapes", "min TFLOP/s", "max TFLOP/s"):
        table.add_column(name, justify="left" if name == "dtype" else "right")
    for row in calibration.gemm_summary(points):
        table.add_row(str(row["dtype"]), str(row["shapes"]), f"{row['min_tflops']:.1f}",
                      f"{row['max_tflops']:.1f}")
    out.print(table)
    calibration.update_profile(out_path, gemm=points, source=source)
    _wrote_profile(out_path)


def calibrate_shapes(
    scenarios: Annotated[list[str] | None, typer.Argument(
        help="Scenario files or catalog names.")] = None,
    set_: Annotated[list[str] | None, typer.Option(
        "--set", metavar="KEY=VALUE",
        help="Override a field: --set parallelism.tp=4 (repeatable).")] = None,
    validation_prefix: Annotated[str | None, typer.Option(
        "--validation", help="Also the validation rows whose id starts with PREFIX "
        "(ZB24, NAR21 ...).")] = None,
    out_path: Annotated[Path, typer.Option("--out", help="CSV of shapes to write.")] = Path(
        "gemm_shapes.csv"),
) -> None:
    """The GEMM shapes the scenarios run, as a CSV to time for `llmsim calibrate gemm`."""
    from llmsim import calibration, loader, validation
    from llmsim.workload import build_workload

    specs = [loader.load_scenario(name, set_ or []) for name in scenarios or []]
    if validation_prefix is not None:
        runs = validation.load_runs(validation_prefix, option="--validation")
        specs += [validation.scenario_for(r) for r in runs]
    if not specs:
        raise UserError("calibrate shapes: give a scenario, or --validation PREFIX for "
                        "validation rows")
    shapes = calibration.gemm_shapes(
        (build_workload(s.model, s.parallelism, s.training, s.dp), s.training.precision)
        for s in specs
    )
    table = Table(title=f"GEMM shapes ({len(shapes)}), largest share of the GEMM FLOPs first",
                  title_justify="left")
    for name in ("M", "N", "K", "dtype", "batch", "calls/step", "GFLOP/call", "share %"):
        table.add_column(name, justify="left" if name == "dtype" else "right")
    for r in shapes.head(20).itertuples():
        table.add_row(str(r.m), str(r.n), str(r.k), r.dtype, str(r.batch),
                      str(r.calls_per_step), f"{r.gflop_per_call:.1f}",
                      f"{r.flop_share_pct:.1f}")
    out.print(table)
    header = ("# GEMM shapes from llmsim calibrate shapes: C[MxN] = A[MxK]·B[KxN]; time them "
              "with benchmarks/time_gemms.py, then llmsim calibrate gemm\n")
    try:
        out_path.write_text(header + shapes.to_csv(index=False, float_format="%.6g"),
                            encoding="utf-8")
    except OSError as exc:
        raise UserError(f"cannot write {out_path}: {exc.strerror}; check the --out path") from None
    out.print(f"wrote {out_path}; time it with 'llmsim calibrate time-gemms {out_path} "
              f"--out gemm.csv' (benchmarks/time_gemms.py, needs PyTorch), then run "
              "'llmsim calibrate gemm gemm.csv'", highlight=False, soft_wrap=True)


def calibrate_nccl(
    files: Annotated[list[Path], typer.Argument(
        help="Unmodified stdout of all_reduce_perf, all_gather_perf, reduce_scatter_perf "
        "or sendrecv_perf (nccl-tests / rccl-tests).")],
    out_path: ProfileOption = Path("calibration.yaml"),
    source: SourceOption = None,
) -> None:
    """Measured collective bus bandwidths → the profile's collective table."""
    from llmsim import calibration

    points = [p for f in files for p in calibration.parse_nccl_tests(f)]
    table = Table(title=f"collective sizes measured ({len(points)})", title_justify="left")
    for name in ("collective", "ranks", "nodes", "sizes", "bytes", "best busbw GB/s"):
        table.add_column(name, justify="left" if name == "collective" else "right")
    for row in calibration.collective_summary(points):
        table.add_row(str(row["collective"]), str(row["ranks"]), str(row["nodes"]),
                      str(row["sizes"]), f"{_si_bytes(row['min_bytes'])} – "
                      f"{_si_bytes(row['max_bytes'])}",
                      f"{row['max_busbw_gbps']:.1f}")
    out.print(table)
    calibration.update_profile(out_path, collectives=points, source=source)
    _wrote_profile(out_path)
