"""Calibration profiles: measured GEMM throughput and collective bandwidth tables.

A profile replaces parts of the analytical cost models (see ``docs/calibration.md``):

* ``gemm`` points (M, N, K, dtype, achieved TFLOP/s) replace the GEMM efficiency model;
* ``collectives`` points (collective, ranks, nodes, message bytes, bus bandwidth) replace
  the α–β model of that collective.

Measurements come in as a CSV of GEMM timings and as the plain-text output of
nccl-tests / rccl-tests (``all_reduce_perf``, ``all_gather_perf``, ``reduce_scatter_perf``,
``sendrecv_perf``); a profile is stored as YAML. Every malformed input raises a
:class:`~llmsim.errors.UserError` naming the file and the line. :func:`gemm_shapes` lists
the GEMMs a scenario runs, the shapes worth timing for its GEMM table.
"""

from __future__ import annotations

import csv
import math
import re
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import yaml
from pydantic import Field, PositiveFloat, PositiveInt

from llmsim.errors import UserError
from llmsim.loader import read_yaml, validate
from llmsim.ops import Collective, ComputeOp
from llmsim.safe_yaml import read_text
from llmsim.specs._base import Spec
from llmsim.specs.accelerator import Dtype

if TYPE_CHECKING:
    import pandas as pd

    from llmsim.workload import Workload

DTYPES: tuple[str, ...] = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8")
GEMM_COLUMNS: tuple[str, ...] = ("m", "n", "k", "dtype", "tflops")
SHAPE_COLUMNS: tuple[str, ...] = (
    "m", "n", "k", "dtype", "batch", "calls_per_step", "gflop_per_call", "flop_share_pct",
)

# nccl-tests binary → llmsim collective name.
NCCL_TESTS: dict[str, Collective] = {
    "all_reduce_perf": "all_reduce",
    "all_gather_perf": "all_gather",
    "reduce_scatter_perf": "reduce_scatter",
    "sendrecv_perf": "send_recv",
}


def bus_factor(collective: Collective, ranks: int) -> float:
    """nccl-tests' bus-bandwidth factor: busbw = algbw × factor.

    all_reduce 2(n−1)/n; all_gather and reduce_scatter (n−1)/n; sendrecv 1
    (nccl-tests ``doc/PERFORMANCE.md``, "Summary"). ``algbw = S / t`` with ``S`` the full
    buffer of an all-reduce, the gathered output of an all-gather, the input of a
    reduce-scatter.
    """
    n = max(ranks, 1)
    if collective == "all_reduce":
        return 2.0 * (n - 1) / n
    if collective in ("all_gather", "reduce_scatter"):
        return (n - 1) / n
    return 1.0


class GemmPoint(Spec):
    """One measured GEMM: C[M×N] = A[M×K]·B[K×N] at ``tflops`` achieved."""

    m: PositiveInt
    """Rows of the output."""
    n: PositiveInt
    """Columns of the output."""
    k: PositiveInt
    """Reduction dimension."""
    dtype: Dtype
    """Data type of the inputs."""
    tflops: PositiveFloat
    """Achieved throughput, 2·M·N·K / time, TFLOP/s."""


class CollectivePoint(Spec):
    """One nccl-tests row: a collective of ``bytes`` on ``ranks`` devices over ``nodes``."""

    collective: Collective
    """all_reduce, all_gather, reduce_scatter or send_recv."""
    ranks: PositiveInt
    """Devices in the communicator."""
    nodes: PositiveInt
    """Distinct hosts holding them."""
    bytes: PositiveInt
    """Message size in nccl-tests' convention (``size`` column), bytes."""
    busbw_gbps: PositiveFloat
    """Out-of-place bus bandwidth, GB/s (10^9 bytes/s)."""


class Calibration(Spec):
    """A calibration profile: measured tables that replace parts of the cost models."""

    source: str = ""
    """Where the measurements come from: machine, software versions, date."""
    gemm: list[GemmPoint] = Field(default_factory=list)
    """Measured GEMM throughputs."""
    collectives: list[CollectivePoint] = Field(default_factory=list)
    """Measured collective bus bandwidths."""


# -- GEMM CSV -----------------------------------------------------------------------------


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


# -- nccl-tests / rccl-tests output ---------------------------------------------------------

_START = re.compile(r"^#\s*Collective test starting:\s*(\S+)")
_BINARY = re.compile(  # the nccl-tests / rccl-tests binaries
    r"\b((?:all_reduce|all_gather|reduce_scatter|sendrecv|alltoallv?|broadcast|reduce|gather"
    r"|scatter|hypercube)_perf)(?:_mpi)?\b"
)
_RANK = re.compile(r"^#\s+Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device")
_NEW_RUN = re.compile(r"^#\s*nThread\s+\d+")
_SRUN_LABEL = re.compile(r"^\s*\d+:\s")  # `srun --label` prefixes every line with "rank: "


class _NcclRun:
    """Parsing state of one nccl-tests run inside a file."""

    def __init__(self) -> None:
        self.collective: Collective | None = None
        self.binary: str | None = None
        self.hosts: dict[int, str] = {}
        self.busbw_col: int | None = None
        self.time_col: int | None = None
        self.columns = 0


def _set_collective(run: _NcclRun, binary: str, where: str) -> None:
    if binary not in NCCL_TESTS:
        raise UserError(
            f"{where}: {binary} is not supported; calibrate with one of {', '.join(NCCL_TESTS)}"
        )
    run.binary, run.collective = binary, NCCL_TESTS[binary]


def _read_header(run: _NcclRun, tokens: list[str], where: str) -> None:
    """Locate the out-of-place ``time`` and ``busbw`` columns in the column-name line."""
    if "busbw" not in tokens or "size" not in tokens:
        raise UserError(f"{where}: table header lacks size/busbw columns; keep nccl-tests' header")
    run.busbw_col = tokens.index("busbw")
    time_cols = [i for i, t in enumerate(tokens) if t == "time"]
    run.time_col = time_cols[0] if time_cols else None
    run.columns = len(tokens)


def _parse_row(run: _NcclRun, tokens: list[str], where: str) -> CollectivePoint | None:
    if run.busbw_col is None:
        raise UserError(f"{where}: data row before the column header; keep nccl-tests' header")
    if run.collective is None:
        raise UserError(
            f"{where}: cannot tell which collective was measured; keep the "
            "'# Collective test starting: <binary>' line or the command line naming the binary"
        )
    if not run.hosts:
        raise UserError(
            f"{where}: no '#  Rank  N Group  G Pid ... device' lines before the results; "
            "keep nccl-tests' device list so that ranks and nodes are known"
        )
    if len(tokens) < run.busbw_col + 1:
        raise UserError(
            f"{where}: row has {len(tokens)} fields, expected {run.columns}; "
            "the row is truncated, re-run or delete it"
        )
    try:
        size = int(tokens[0])
        busbw = float(tokens[run.busbw_col])
        time_us = float(tokens[run.time_col]) if run.time_col is not None else 0.0
    except ValueError:
        raise UserError(
            f"{where}: cannot read size {tokens[0]!r} / busbw {tokens[run.busbw_col]!r} as "
            "numbers; fix or delete the row"
        ) from None
    if size <= 0:
        return None  # nccl-tests prints 0-byte rows with -b 0: no information
    ranks = max(run.hosts) + 1
    if busbw <= 0.0 and time_us > 0.0:
        # Below the column's 0.01 GB/s print resolution: recover it from the time column.
        busbw = size / (time_us * 1e-6) * bus_factor(run.collective, ranks) / 1e9
    if busbw <= 0.0:
        raise UserError(f"{where}: busbw {busbw} is not positive; fix or delete the row")
    return CollectivePoint(
        collective=run.collective,
        ranks=ranks,
        nodes=len(set(run.hosts.values())),
        bytes=size,
        busbw_gbps=busbw,
    )


def parse_nccl_tests(path: str | Path) -> list[CollectivePoint]:
    """Read the stdout of nccl-tests/rccl-tests: one point per result row (out-of-place busbw).

    The collective comes from ``# Collective test starting: all_reduce_perf`` or, in older
    versions, from the binary name on a line before the table; ranks and nodes from the
    ``#  Rank  N Group G Pid P on HOST device D`` lines. Several runs may follow each other
    in one file. Other lines (NCCL INFO, MPI warnings) are ignored.
    """
    path = Path(path)
    text = read_text(path, "nccl-tests output")
    run, points = _NcclRun(), []
    pending: tuple[str, str] | None = None  # a binary named after a table, for the next run
    for number, line in enumerate(text.splitlines(), start=1):
        where = f"{path.name}:{number}"
        stripped = _SRUN_LABEL.sub("", line, count=1).strip()
        if not stripped:
            continue
        if stripped.startswith("#"):
            if start := _START.match(stripped):
                run, pending = _NcclRun(), None
                _set_collective(run, start.group(1), where)
            elif _NEW_RUN.match(stripped) and run.busbw_col is not None:
                run = _NcclRun()  # a second run without a 'starting' line
                if pending is not None:
                    _set_collective(run, pending[0], pending[1])
                    pending = None
            elif rank := _RANK.match(stripped):
                run.hosts[int(rank.group(1))] = rank.group(2)
            else:
                tokens = stripped.lstrip("#").split()
                if tokens[:2] == ["size", "count"]:
                    _read_header(run, tokens, where)
            continue
        tokens = stripped.split()
        if tokens[0].isdigit() and run.busbw_col is not None:
            point = _parse_row(run, tokens, where)
            if point is not None:
                points.append(point)
        elif binary := _BINARY.search(stripped):
            if run.collective is None and run.busbw_col is None:
                _set_collective(run, binary.group(1), where)
            else:
                pending = (binary.group(1), where)
    if not points:
        raise UserError(
            f"{path.name}: no result rows found; give the unmodified stdout of an nccl-tests "
            f"binary ({', '.join(NCCL_TESTS)})"
        )
    return points


# -- profiles -------------------------------------------------------------------------------


def build_calibration(
    gemm_csvs: Iterable[str | Path] = (),
    nccl_outputs: Iterable[str | Path] = (),
    source: str = "",
) -> Calibration:
    """A profile from measurement files: GEMM CSVs and nccl-tests outputs."""
    gemm = [p for f in gemm_csvs for p in parse_gemm_csv(f)]
    collectives = [p for f in nccl_outputs for p in parse_nccl_tests(f)]
    return Calibration(source=source, gemm=gemm, collectives=collectives)


def update_profile(
    path: str | Path,
    gemm: list[GemmPoint] | None = None,
    collectives: list[CollectivePoint] | None = None,
    source: str | None = None,
) -> Calibration:
    """Write the profile at ``path``, replacing the parts given and keeping the others.

    ``llmsim calibrate gemm`` and ``llmsim calibrate nccl`` build one profile this way: each
    rewrites its own table of an existing profile (or starts a new one), so re-running a
    command does not duplicate points.
    """
    path = Path(path)
    cal = load_calibration(path) if path.exists() else Calibration()
    update: dict[str, object] = {}
    if gemm is not None:
        update["gemm"] = gemm
    if collectives is not None:
        update["collectives"] = collectives
    if source is not None:
        update["source"] = source
    cal = cal.model_copy(update=update)
    try:
        save_calibration(cal, path)
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror}; check the --out path") from None
    return cal


def gemm_summary(points: Iterable[GemmPoint]) -> list[dict[str, object]]:
    """Per dtype: how many shapes were measured and their achieved TFLOP/s range."""
    by_dtype: dict[str, list[float]] = {}
    for p in points:
        by_dtype.setdefault(p.dtype, []).append(p.tflops)
    return [{"dtype": dtype, "shapes": len(values), "min_tflops": min(values),
             "max_tflops": max(values)} for dtype, values in by_dtype.items()]


def collective_summary(points: Iterable[CollectivePoint]) -> list[dict[str, object]]:
    """Per (collective, ranks, nodes): the sizes measured and the best bus bandwidth."""
    groups: dict[tuple[str, int, int], list[CollectivePoint]] = {}
    for p in points:
        groups.setdefault((p.collective, p.ranks, p.nodes), []).append(p)
    return [{"collective": c, "ranks": r, "nodes": n, "sizes": len(g),
             "min_bytes": min(p.bytes for p in g), "max_bytes": max(p.bytes for p in g),
             "max_busbw_gbps": max(p.busbw_gbps for p in g)} for (c, r, n), g in groups.items()]


def load_calibration(path: str | Path) -> Calibration:
    """Load a YAML calibration profile (as written by :func:`save_calibration`)."""
    path = Path(path)
    return validate(Calibration, read_yaml(path), path.name)


def save_calibration(cal: Calibration, path: str | Path) -> None:
    """Write a profile as YAML, one flow-style mapping per point."""
    data = cal.model_dump(mode="json")
    Path(path).write_text(
        yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=120),
        encoding="utf-8",
    )


def gemm_shapes(workloads: Iterable[tuple[Workload, str]]) -> pd.DataFrame:
    """The distinct GEMMs the workloads run: the shapes to time for a GEMM table.

    Each item is a workload and its training precision (the dtype of a GEMM that names
    none). A GEMM split into chunks (Transformer Engine's overlapped GEMMs) is listed as
    the chunk's shape, the one its price is looked up by. ``calls_per_step`` counts one
    pipeline replica's calls in a step (all its stages and micro-batches, recompute
    included, summed over the workloads); ``flop_share_pct`` is the shape's share of
    those GEMM FLOPs. Sorted by share, largest first, in :data:`SHAPE_COLUMNS`.
    """
    import pandas as pd

    calls: dict[tuple[int, int, int, str, int], int] = defaultdict(int)
    for workload, precision in workloads:
        for chunk in workload.chunks.values():
            for op in chunk.ops:
                if not isinstance(op, ComputeOp) or op.kind != "gemm" or op.mnk is None:
                    continue
                m, n, k = op.mnk
                key = (math.ceil(m / op.splits), n, k, op.dtype or precision, op.batch)
                calls[key] += op.splits * workload.microbatches
    rows = [{"m": m, "n": n, "k": k, "dtype": dtype, "batch": batch,
             "calls_per_step": count,
             "gflop_per_call": 2 * batch * m * n * k / 1e9}
            for (m, n, k, dtype, batch), count in calls.items()]
    df = pd.DataFrame(rows, columns=list(SHAPE_COLUMNS[:-1]))
    flop = df["calls_per_step"] * df["gflop_per_call"]
    df["flop_share_pct"] = 100 * flop / flop.sum()
    return df.sort_values("flop_share_pct", ascending=False, ignore_index=True)
