"""MoE expert GEMMs timed on the board as one grouped kernel (``gemm.grouped_tflops``;
:mod:`llmsim.costs.grouped_gemms`)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmsim.costs.compute import ComputeModel
from llmsim.costs.grouped_gemms import GroupedGemmRates
from llmsim.loader import load_spec
from llmsim.ops import ComputeOp

H100 = load_spec("accelerators", "h100-sxm5-80gb")
RESULTS = (Path(__file__).parents[1] / "benchmarks" / "results" / "h100-2026-11-27"
           / "grouped_gemms.csv")


def _grouped_rows() -> list[dict[str, str]]:
    """The grouped kernel's rows of 2 experts or more (one expert is a plain GEMM)."""
    with RESULTS.open(encoding="utf-8") as f:
        return [r for r in csv.DictReader(line for line in f if not line.startswith("#"))
                if r["method"] == "grouped" and r["experts"] != "1"]


def _op(experts: int, tokens: int, n: int, k: int, dtype: str | None = None) -> ComputeOp:
    """E experts' [T × K]·[K × N] as llmsim.moe builds it: one batched GEMM op."""
    return ComputeOp("expert_up", "gemm", "F", 2.0 * experts * tokens * n * k,
                     2.0 * experts * (tokens * k + k * n + tokens * n), (tokens, n, k),
                     experts, dtype=dtype)


def test_the_catalog_table_is_the_measured_run() -> None:
    rows = _grouped_rows()
    assert H100.gemm.grouped_tflops["bf16"] == [
        (int(r["experts"]), int(r["tokens_per_expert"]), int(r["n"]), int(r["k"]),
         float(r["tflops"])) for r in rows]


@pytest.mark.parametrize("row", _grouped_rows()[::17], ids=lambda r: "-".join(
    r[c] for c in ("model", "gemm", "experts", "tokens_per_expert")))
def test_a_timed_shape_takes_its_measured_time(row: dict[str, str]) -> None:
    """At the board's own power limit the clock model slows the stored rate back to the
    measured one: the op's math time is the measured time."""
    model = ComputeModel(H100, "bf16")
    op = _op(int(row["experts"]), int(row["tokens_per_expert"]), int(row["n"]), int(row["k"]))
    assert model.math_s(op) == pytest.approx(float(row["time_us"]) * 1e-6, rel=4e-3)


def test_between_timed_rows_the_rate_is_interpolated_and_outside_the_model_prices() -> None:
    rates = GroupedGemmRates(H100)
    n, k = 1536, 2048  # Qwen3-30B-A3B's up/gate GEMM
    low, high = rates.flops("bf16", 8, 2048, n, k), rates.flops("bf16", 8, 4096, n, k)
    middle = rates.flops("bf16", 8, 2896, n, k)  # ≈ 2^11.5
    assert low is not None and high is not None and middle is not None
    assert min(low, high) <= middle <= max(low, high)
    assert rates.flops("bf16", 8, 64, n, k) is None  # fewer rows than timed
    assert rates.flops("bf16", 8, 2048, 1536, 4096) is None  # an (N, K) not timed
    assert rates.flops("fp8", 8, 2048, n, k) is None  # a dtype not timed
    bare = ComputeModel(H100.model_copy(update={"gemm": H100.gemm.model_copy(
        update={"grouped_tflops": {}})}), "bf16")
    model = ComputeModel(H100, "bf16")
    for op in (_op(8, 64, n, k), _op(8, 2048, 1536, 4096), _op(8, 2048, n, k, dtype="fp8")):
        assert model.math_s(op) == bare.math_s(op)
    assert model.math_s(_op(8, 128, n, k)) > 1.5 * bare.math_s(_op(8, 128, n, k))


_MONOTONE = H100.model_copy(update={"gemm": H100.gemm.model_copy(update={"grouped_tflops": {
    "bf16": [(e, t, 1024, 1024, 10.0 * i + 3.0 * j)
             for i, e in enumerate((1, 4, 32)) for j, t in enumerate((128, 1024, 8192))]}})})
"""A table whose rates rise with experts and with rows per expert."""


@given(st.integers(1, 64), st.integers(1, 64), st.integers(128, 1 << 15),
       st.integers(128, 1 << 15))
def test_interpolation_keeps_a_monotone_table_monotone(e1: int, e2: int, t1: int,
                                                       t2: int) -> None:
    rates = GroupedGemmRates(_MONOTONE)
    (ea, eb), (ta, tb) = sorted((e1, e2)), sorted((t1, t2))
    low, high = rates.flops("bf16", ea, ta, 1024, 1024), rates.flops("bf16", eb, tb, 1024, 1024)
    assert low is not None and high is not None
    assert low <= high * (1 + 1e-12)
