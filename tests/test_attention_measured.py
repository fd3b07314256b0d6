"""Fused attention kernels timed on the board by shape (``flash_attention_measured``,
``cudnn_attention_measured`` and their non-causal blocks; :mod:`llmsim.costs.attention_tables`)."""

from __future__ import annotations

import csv
import math
from dataclasses import replace
from pathlib import Path

import pytest
from helpers import make_scenario
from hypothesis import given
from hypothesis import strategies as st

from llmsim.context import apply_context_parallel
from llmsim.costs.attention_tables import AttentionTable
from llmsim.costs.compute import ComputeModel
from llmsim.errors import UserError
from llmsim.loader import load_spec, validate
from llmsim.ops import ComputeOp
from llmsim.specs import Accelerator
from llmsim.workload import LayerBuilder

ATTENTION_CSV = Path(__file__).parent / "data" / "attention_h100_sxm5_2026_11_27.csv"
"""benchmarks/results/h100-2026-11-27/attention.csv, the run the H100's tables come from."""


@pytest.fixture(scope="module")
def h100() -> Accelerator:
    return load_spec("accelerators", "h100-sxm5-80gb")


def _times() -> dict[tuple[str, str, bool, int, int, int, int], float]:
    """Measured seconds by (backend, pass, causal, heads, KV heads, q tokens, kv tokens)."""
    with ATTENTION_CSV.open(encoding="utf-8") as f:
        rows = csv.DictReader(line for line in f if not line.startswith("#"))
        return {(r["backend"], r["pass"], r["causal"] == "1", int(r["heads"]),
                 int(r["kv_heads"]), int(r["q_tokens"]), int(r["kv_tokens"])):
                float(r["time_us"]) * 1e-6 for r in rows}


TIMES = _times()


def _attention_ops(heads: int, seq: int, micro_batch: int = 1, kv_heads: int | None = None,
                   cp: int = 1) -> tuple[ComputeOp, ComputeOp]:
    """The forward and backward attention ops of one GPT block with ``heads`` heads of 128."""
    sc = make_scenario(**{"model.hidden": heads * 128, "model.heads": heads,
                          "model.kv_heads": kv_heads or heads,
                          "model.max_seq_len": seq, "training.seq_len": seq,
                          "parallelism.tp": 1, "parallelism.cp": cp,
                          "parallelism.micro_batch": micro_batch,
                          "training.global_batch": 16 * micro_batch})
    builder = LayerBuilder(sc.model, sc.parallelism, sc.training)
    fwd, _, bwd, _ = apply_context_parallel(builder.layer(), builder)
    return (next(op for op in fwd if op.name == "attn"),
            next(op for op in bwd if op.name == "attn_bwd"))


@pytest.mark.parametrize("backend", ["flash", "cudnn"])
def test_the_catalog_tables_are_the_measured_run(h100: Accelerator, backend: str) -> None:
    """Every row of the four tables is the run's forward rate and its backward rate (2.5
    forward FLOPs over the forward+backward time less the forward's), rounded to 0.1."""
    causal = getattr(h100, f"{backend}_attention_measured")
    blocks = getattr(h100, f"{backend}_attention_blocks_measured")
    assert len(causal) == 39 and len(blocks) == 50
    rows = [(True, q, kv, s, s, d, f, b) for q, kv, s, d, f, b in causal]
    rows += [(False, q, kv, sq, skv, d, f, b) for q, kv, sq, skv, d, f, b in blocks]
    for is_causal, q, kv, sq, skv, d, fwd, bwd in rows:
        flops = 4.0 * q * sq * skv * d / (2 if is_causal else 1) / 1e12
        t_fwd = TIMES[(backend, "fwd", is_causal, q, kv, sq, skv)]
        t_both = TIMES[(backend, "fwd_bwd", is_causal, q, kv, sq, skv)]
        assert fwd == pytest.approx(flops / t_fwd, rel=5e-4, abs=0.051)
        assert bwd == pytest.approx(2.5 * flops / (t_both - t_fwd), rel=5e-4, abs=0.051)


@pytest.mark.parametrize("backend", ["flash", "cudnn"])
def test_a_measured_shape_takes_the_measured_times(h100: Accelerator, backend: str) -> None:
    """32 heads with 8 KV heads at 8,192 tokens: the forward op takes the measured forward
    time, the backward op the forward+backward time less the forward."""
    model = ComputeModel(h100.model_copy(update={"kernel_launch_us": 0.0}), "bf16",
                         attention_kernel=backend)
    fwd, bwd = _attention_ops(32, 8192, kv_heads=8)
    assert fwd.attention_heads == (32, 8) and fwd.attention_shape == (8192, 128)
    forward_s = TIMES[(backend, "fwd", True, 32, 8, 8192, 8192)]
    both_s = TIMES[(backend, "fwd_bwd", True, 32, 8, 8192, 8192)]
    assert model.math_s(fwd) == pytest.approx(forward_s, rel=1e-3)
    assert model.math_s(bwd) == pytest.approx(both_s - forward_s, rel=1e-3)


def test_cudnn_runs_faster_than_flash_attention_2(h100: Accelerator) -> None:
    flash = ComputeModel(h100, "bf16")
    cudnn = ComputeModel(h100, "bf16", attention_kernel="cudnn")
    for seq in (2048, 8192, 32768):
        for op in _attention_ops(32, seq):
            assert cudnn.math_s(op) < 0.8 * flash.math_s(op)


def test_between_measured_heads_the_rate_is_interpolated_in_log_heads(
        h100: Accelerator) -> None:
    """24 heads at 8,192 tokens lies halfway-ish (in log₂) between 16 and 32 heads, whose
    32-head rate is the mean of the MHA and the 8-KV-head rows."""
    table = AttentionTable(h100.flash_attention_measured)
    rows = {(q, kv): (f, b) for q, kv, s, _, f, b in h100.flash_attention_measured if s == 8192}
    at32 = [(rows[(32, 32)][i] + rows[(32, 8)][i]) / 2 for i in (0, 1)]
    weight = (math.log2(24) - 4) / (5 - 4)
    expected = [(rows[(16, 16)][i] + weight * (at32[i] - rows[(16, 16)][i])) * 1e12
                for i in (0, 1)]
    assert table.causal(24, 24, 8192, 128) == pytest.approx(tuple(expected))


def test_between_measured_lengths_the_rate_is_interpolated_in_log_length(
        h100: Accelerator) -> None:
    table = AttentionTable(h100.cudnn_attention_measured)
    low, high = table.causal(8, 8, 8192, 128), table.causal(8, 8, 16384, 128)
    assert low is not None and high is not None
    middle = table.causal(8, 8, round(8192 * math.sqrt(2)), 128)
    assert middle == pytest.approx(tuple((a + b) / 2 for a, b in zip(low, high, strict=True)),
                                   rel=1e-4)


def test_outside_the_table(h100: Accelerator) -> None:
    """Longer than the longest: held at the longest's rate; shorter than the shortest, or
    another head dimension: the catalog's fraction."""
    table = AttentionTable(h100.flash_attention_measured)
    longest = [(f, b) for q, _, s, _, f, b in h100.flash_attention_measured
               if q == 32 and s == 131072]  # 32 heads: MHA and 8 KV heads, averaged
    held = tuple(sum(r[i] for r in longest) / 2 * 1e12 for i in (0, 1))
    assert table.causal(32, 8, 1 << 20, 128) == pytest.approx(held)
    assert table.causal(32, 32, 1 << 18, 128) == pytest.approx(held)
    assert table.causal(32, 32, 1024, 128) is None
    assert table.causal(32, 32, 8192, 64) is None
    model = ComputeModel(h100, "bf16")
    fwd, _ = _attention_ops(32, 1024)
    assert model.math_s(fwd) == pytest.approx(
        fwd.executed_flops / (h100.peak_flops("bf16") * h100.attention_fraction))
    cudnn = ComputeModel(h100, "bf16", attention_kernel="cudnn")
    assert cudnn.math_s(fwd) == pytest.approx(
        fwd.executed_flops / (h100.peak_flops("bf16") * h100.cudnn_attention_fraction))


def test_without_tables_the_catalog_fractions_apply(h100: Accelerator) -> None:
    bare = h100.model_copy(update={"flash_attention_measured": [],
                                   "cudnn_attention_measured": []})
    fwd, _ = _attention_ops(32, 8192)
    assert ComputeModel(bare, "bf16").math_s(fwd) == pytest.approx(
        fwd.executed_flops / (h100.peak_flops("bf16") * h100.attention_fraction))
    assert ComputeModel(bare, "bf16", attention_kernel="cudnn").math_s(fwd) == pytest.approx(
        fwd.executed_flops / (h100.peak_flops("bf16") * h100.cudnn_attention_fraction))


_MONOTONE = AttentionTable(
    [(h, h, s, 128, 10.0 * i + j, 5.0 * i + 2 * j)
     for i, h in enumerate((4, 8, 16, 64)) for j, s in enumerate((2048, 4096, 16384, 65536))])
"""A table whose rates rise with heads and with length."""


@given(st.integers(1, 128), st.integers(1, 128), st.integers(2048, 1 << 18))
def test_interpolation_keeps_a_monotone_table_monotone_in_heads(
        a: int, b: int, seq: int) -> None:
    low, high = sorted((a, b))
    r_low, r_high = _MONOTONE.causal(low, low, seq, 128), _MONOTONE.causal(high, high, seq, 128)
    assert r_low is not None and r_high is not None
    assert r_low[0] <= r_high[0] + 1e-3 and r_low[1] <= r_high[1] + 1e-3


@given(st.integers(4, 64), st.integers(2048, 1 << 18), st.integers(2048, 1 << 18))
def test_interpolation_keeps_a_monotone_table_monotone_in_length(
        heads: int, a: int, b: int) -> None:
    low, high = sorted((a, b))
    r_low = _MONOTONE.causal(heads, heads, low, 128)
    r_high = _MONOTONE.causal(heads, heads, high, 128)
    assert r_low is not None and r_high is not None
    assert r_low[0] <= r_high[0] + 1e-3 and r_low[1] <= r_high[1] + 1e-3
    # and between the measured extremes
    assert 0.0 <= r_low[0] <= 33.0e12


def test_a_context_parallel_ring_runs_its_first_step_causal_and_the_rest_as_blocks(
        h100: Accelerator) -> None:
    """cp = 2 over 32,768 tokens: each rank's 16,384 queries run one causal square of
    16,384 (half its executed FLOPs) and one non-causal step, half 16,384 x 8,192 and half
    8,192 x 16,384, at the blocks' measured rates."""
    for backend in ("flash", "cudnn"):
        model = ComputeModel(h100, "bf16", attention_kernel=backend)
        table = AttentionTable(getattr(h100, f"{backend}_attention_measured"),
                               getattr(h100, f"{backend}_attention_blocks_measured"))
        for op in _attention_ops(32, 32768, cp=2):
            assert op.attention_ring_steps == 2 and op.attention_shape == (16384, 128)
            backward = op.phase == "B"
            square = table.causal(32, 32, 16384, 128)
            halves = table.block(32, 32, 16384, 8192, 128), table.block(32, 32, 8192, 16384, 128)
            assert square is not None and None not in halves
            flops = op.executed_flops
            expected = flops / 2 / square[backward] + sum(
                flops / 2 / 2 / rates[backward] for rates in halves if rates)
            assert model.math_s(op) == pytest.approx(expected)
            single = replace(op, attention_ring_steps=1)
            assert model.math_s(single) == pytest.approx(flops / square[backward])
            no_blocks = ComputeModel(h100.model_copy(
                update={f"{backend}_attention_blocks_measured": []}), "bf16",
                attention_kernel=backend)
            assert no_blocks.math_s(op) == pytest.approx(flops / square[backward])


def test_a_micro_batch_multiplies_the_heads_of_the_grid() -> None:
    fwd, bwd = _attention_ops(12, 2048, micro_batch=2)
    assert fwd.attention_heads == bwd.attention_heads == (24, 24)


@pytest.mark.parametrize("field", ["flash_attention_measured", "cudnn_attention_measured"])
def test_a_rate_of_zero_is_refused_with_its_field(h100: Accelerator, field: str) -> None:
    raw = h100.model_dump()
    raw[field] = [[24, 24, 2048, 128, 0.0, 250.0]]
    with pytest.raises(UserError, match=field):
        validate(Accelerator, raw, "h100.yaml")


def test_a_block_of_zero_tokens_is_refused_with_its_field(h100: Accelerator) -> None:
    raw = h100.model_dump()
    raw["cudnn_attention_blocks_measured"] = [[8, 8, 0, 2048, 128, 500.0, 400.0]]
    with pytest.raises(UserError, match="cudnn_attention_blocks_measured"):
        validate(Accelerator, raw, "h100.yaml")
