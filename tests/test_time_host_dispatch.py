"""benchmarks/time_host_dispatch.py: the kernel-time union, and a CPU smoke run where
PyTorch is installed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))

import time_host_dispatch


def test_union_of_overlapping_and_disjoint_intervals() -> None:
    assert time_host_dispatch.kernel_union_ms([(0, 10), (5, 20), (30, 40)]) == pytest.approx(0.030)
    assert time_host_dispatch.kernel_union_ms([(0, 50), (10, 20)]) == pytest.approx(0.050)
    assert time_host_dispatch.kernel_union_ms([]) == 0.0


@given(st.lists(st.tuples(st.floats(0, 1e6), st.floats(0, 1e4)), max_size=30))
def test_union_between_longest_and_sum(spans: list[tuple[float, float]]) -> None:
    intervals = [(start, start + length) for start, length in spans]
    union = time_host_dispatch.kernel_union_ms(intervals)
    lengths_ms = [length / 1e3 for _, length in spans]
    assert max(lengths_ms, default=0.0) - 1e-9 <= union <= sum(lengths_ms) + 1e-9


def test_cpu_smoke_run(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    out = tmp_path / "rows.csv"
    assert time_host_dispatch.main(["selene-gpt3", "--device", "cpu", "--shrink", "64",
                                    "--layers", "1", "--seq", "32", "--repeats", "2",
                                    "--out", str(out)]) == 0
    assert out.read_text().count("\n") == 2
