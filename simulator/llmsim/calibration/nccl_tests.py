"""Measured collectives from the plain-text output of nccl-tests / rccl-tests
(``all_reduce_perf``, ``all_gather_perf``, ``reduce_scatter_perf``, ``sendrecv_perf``)."""

from __future__ import annotations

import re
from pathlib import Path

from llmsim.calibration.points import CollectivePoint, bus_factor
from llmsim.errors import UserError
from llmsim.ops import Collective
from llmsim.safe_yaml import read_text

# nccl-tests binary → llmsim collective name.
NCCL_TESTS: dict[str, Collective] = {
    "all_reduce_perf": "all_reduce",
    "all_gather_perf": "all_gather",
    "reduce_scatter_perf": "reduce_scatter",
    "sendrecv_perf": "send_recv",
}


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
