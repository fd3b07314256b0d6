"""Timing and CSV helpers shared by the GPU microbenchmarks (``time_attention.py``,
``time_grouped_gemms.py``, ``time_fp8_casts.py``). Imports no PyTorch at module level, so
the scripts' shape lists import on a machine without it."""

from __future__ import annotations

import csv
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

BLOCKS = 3
"""Timed blocks per measurement; the median block's time per call is kept."""


def seconds_per_call(torch: Any, fn: Callable[[], object], budget_s: float) -> float:
    """Median time of one call of ``fn``, seconds, over :data:`BLOCKS` blocks of about
    ``budget_s`` in all, after one untimed warm-up call (which builds plans and handles).

    A call longer than a block's share is timed twice more, one call a time, and the
    median of the three kept: long kernels (attention at 128k tokens) need no more."""
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    one_s = max(time.perf_counter() - start, 1e-7)
    calls = int(budget_s / BLOCKS / one_s)
    if calls < 2:
        times = [one_s]
        for _ in range(2):
            start = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        return statistics.median(times)
    per_call = []
    for _ in range(BLOCKS):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        per_call.append((time.perf_counter() - start) / calls)
    return statistics.median(per_call)


class ResultsCsv:
    """A CSV of measurements written row by row (flushed), so that a run cut short keeps
    what it measured; ``columns`` name the fields, a ``#`` line above says where."""

    def __init__(self, path: Path, columns: list[str], comment: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("w", encoding="utf-8", newline="")
        self._file.write(f"# {comment}\n")
        self._writer = csv.DictWriter(self._file, fieldnames=columns)
        self._writer.writeheader()
        self._file.flush()

    def add(self, **row: object) -> None:
        """Write one row now and echo it to stdout."""
        self._writer.writerow(row)
        self._file.flush()
        print(" ".join(f"{k}={v}" for k, v in row.items() if v != ""), flush=True)

    def close(self) -> None:
        self._file.close()


def log_failure(what: str, error: BaseException) -> None:
    """One line on stderr for a measurement that failed, with the error's last line; the
    run goes on with the next one."""
    last = traceback.format_exception_only(type(error), error)[-1].strip()
    print(f"FAILED {what}: {last[:400]}", file=sys.stderr, flush=True)


def environment(torch: Any) -> str:
    """Board, PyTorch, CUDA and cuDNN versions, for the CSVs' comment line."""
    name = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return (f"{name}, PyTorch {torch.__version__}, CUDA {torch.version.cuda}, "
            f"cuDNN {cudnn}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")


def import_torch() -> Any:
    """PyTorch with a CUDA device, or None after one sentence on stderr saying what is
    missing."""
    try:
        import torch
    except ImportError:
        print("this benchmark needs PyTorch with a CUDA GPU: run it on a GPU machine "
              "(pip install torch)", file=sys.stderr)
        return None
    if not torch.cuda.is_available():
        print("this benchmark needs a CUDA GPU: PyTorch sees none here", file=sys.stderr)
        return None
    return torch


def parse_choices(option: str, value: str, allowed: tuple[str, ...]) -> list[str] | None:
    """The comma-separated names of ``value`` (the option ``option``), or None after one
    sentence on stderr naming the unknown ones and the choices."""
    chosen = [name.strip() for name in value.split(",") if name.strip()]
    unknown = sorted(set(chosen) - set(allowed))
    if unknown:
        print(f"{option} {value}: unknown {', '.join(unknown)}; "
              f"choose from {', '.join(allowed)}", file=sys.stderr)
        return None
    return chosen
