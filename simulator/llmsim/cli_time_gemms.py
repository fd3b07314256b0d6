"""``llmsim calibrate time-gemms``: run ``benchmarks/time_gemms.py`` from an installed llmsim.

The script is copied into the wheel (``llmsim/_benchmarks``, see pyproject.toml); in a
source checkout the one under ``benchmarks/`` runs. It needs PyTorch, which llmsim does
not depend on, and a GPU (or ``--device cpu`` to try it).
"""

import runpy
import sys
from pathlib import Path
from typing import Annotated

import typer

from llmsim.errors import UserError
from llmsim.safe_yaml import read_text


def script_path() -> Path:
    """The bundled ``time_gemms.py``, or the source checkout's."""
    here = Path(__file__).resolve().parent
    bundled = here / "_benchmarks" / "time_gemms.py"
    return bundled if bundled.is_file() else here.parents[1] / "benchmarks" / "time_gemms.py"


def time_gemms(
    shapes: Annotated[Path, typer.Argument(help="CSV from `llmsim calibrate shapes`.")],
    out_path: Annotated[Path, typer.Option("--out", help="GEMM table to write.")] = Path(
        "gemm.csv"),
    device: Annotated[str, typer.Option(help="cuda (default) or cpu.")] = "cuda",
    seconds: Annotated[float, typer.Option(min=0.001, help="Timed run per shape, seconds.")]
    = 1.0,
    max_shapes: Annotated[int | None, typer.Option(
        min=1, help="Only the first N rows (the largest FLOP shares come first).")] = None,
) -> None:
    """Time the GEMM shapes on this machine with PyTorch: the table `llmsim calibrate gemm`
    reads (benchmarks/time_gemms.py)."""
    read_text(shapes, "shapes CSV")  # a missing or unreadable file: one line, exit 2
    script = script_path()
    if not script.is_file():
        raise UserError(f"calibrate time-gemms: {script} is missing from this installation; "
                        "reinstall llmsim")
    argv = [str(script), str(shapes), "--out", str(out_path), "--device", device,
            "--seconds", str(seconds)] + ([] if max_shapes is None else
                                          ["--max-shapes", str(max_shapes)])
    old, sys.argv = sys.argv, argv
    try:
        runpy.run_path(str(script), run_name="__main__")
        code: object = 0
    except SystemExit as exc:
        code = exc.code
    finally:
        sys.argv = old
    if isinstance(code, str):  # the script's own one-line complaint about the CSV
        raise UserError(code)
    if code:
        raise typer.Exit(int(code))  # type: ignore[call-overload]
