"""Measured GEMM timings from a CSV (``m,n,k,dtype,tflops``): every malformed row a
:class:`~llmsim.errors.UserError` naming the file and the line."""

from __future__ import annotations

import csv
from pathlib import Path

from llmsim.calibration.points import DTYPES, GemmPoint
from llmsim.errors import UserError
from llmsim.safe_yaml import read_text

GEMM_COLUMNS: tuple[str, ...] = ("m", "n", "k", "dtype", "tflops")


def _content_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of non-blank lines that are not ``#`` comments."""
    text = read_text(path, "GEMM table")
    return [
        (number, line)
        for number, line in enumerate(text.splitlines(), start=1)
        if line.strip() and not line.lstrip().startswith("#")
    ]


def parse_gemm_csv(path: str | Path) -> list[GemmPoint]:
    """Read a GEMM table: a header naming ``m, n, k, dtype, tflops`` (any order, extra
    columns ignored), then one row per measured shape. ``#`` lines are comments."""
    path = Path(path)
    lines = _content_lines(path)
    if not lines:
        raise UserError(f"{path.name}: no header and no rows; write a header `m,n,k,dtype,tflops`")
    header_line, header_text = lines[0]
    header = [c.strip().lower() for c in next(csv.reader([header_text]))]
    missing = [c for c in GEMM_COLUMNS if c not in header]
    if missing:
        raise UserError(
            f"{path.name}:{header_line}: header {header_text.strip()!r} lacks column(s) "
            f"{', '.join(missing)}; the first row must name m, n, k, dtype, tflops"
        )
    index = {c: header.index(c) for c in GEMM_COLUMNS}
    points = []
    for number, text in lines[1:]:
        cells = [c.strip() for c in next(csv.reader([text]))]
        if len(cells) != len(header):
            raise UserError(
                f"{path.name}:{number}: {len(cells)} values for {len(header)} columns; "
                "give one value per header column"
            )
        row = {c: cells[i] for c, i in index.items()}
        try:
            point = GemmPoint(
                m=int(row["m"]),
                n=int(row["n"]),
                k=int(row["k"]),
                dtype=row["dtype"].lower(),  # type: ignore[arg-type]
                tflops=float(row["tflops"]),
            )
        except ValueError as exc:
            raise UserError(
                f"{path.name}:{number}: cannot read {text.strip()!r} "
                f"({_first_problem(exc)}); m, n, k must be positive whole numbers, dtype one "
                f"of {', '.join(DTYPES)} and tflops a positive number"
            ) from None
        points.append(point)
    if not points:
        raise UserError(f"{path.name}: header but no rows; add one row per measured GEMM")
    return points


def _first_problem(exc: ValueError) -> str:
    """A short reason from a pydantic ValidationError or a failed int()/float()."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        first = errors()[0]
        return f"{'.'.join(str(p) for p in first['loc'])}: {first['msg'].lower()}"
    return str(exc)
