"""A fresh process that imports llmsim starts no BLAS worker threads (``llmsim/__init__``).

OpenBLAS's workers busy-wait for about 0.1 s after numpy's import: CPU time that a short
simulation in a fresh process paid beside its own (issue #37's 1F1B step by CPU time).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = ("import os, llmsim, llmsim.simulation, numpy; "
         "print(os.environ['OPENBLAS_NUM_THREADS'], len(os.listdir('/proc/self/task')))")


def _openblas() -> bool:
    """Whether numpy's BLAS is OpenBLAS (the wheels on PyPI), whose workers the test counts."""
    import numpy

    blas = numpy.show_config(mode="dicts")["Build Dependencies"]["blas"]
    return "openblas" in str(blas.get("name", "")).lower()


def _probe(env_extra: dict[str, str]) -> tuple[str, int]:
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"} | env_extra
    out = subprocess.run([sys.executable, "-c", PROBE], check=True, capture_output=True,
                         text=True, env=env).stdout.split()
    return out[0], int(out[1])


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux's /proc")
def test_importing_llmsim_starts_one_thread() -> None:
    assert _probe({}) == ("1", 1)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir() or (os.cpu_count() or 1) < 2
                    or not _openblas(), reason="needs Linux's /proc, two cores, OpenBLAS")
def test_a_users_setting_wins() -> None:
    setting, threads = _probe({"OPENBLAS_NUM_THREADS": "2"})
    assert setting == "2" and threads == 2
