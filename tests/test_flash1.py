"""FlashAttention 1.x priced from FlashAttention-2's rate by the two kernels' measured ratio
(``training.attention_kernel: flash1``, ``flash1_vs_flash2_tflops``; llmsim.costs.flash1)."""

from __future__ import annotations

import math

import pytest
from helpers import make_scenario
from hypothesis import given
from hypothesis import strategies as st
from test_cli import run_cli

from llmsim.costs.compute import ComputeModel
from llmsim.costs.flash1 import flash1_slowdown
from llmsim.errors import UserError
from llmsim.loader import load_spec
from llmsim.simulation import simulate
from llmsim.specs import Accelerator
from llmsim.workload import LayerBuilder


@pytest.fixture(scope="module")
def h100() -> Accelerator:
    return load_spec("accelerators", "h100-sxm5-80gb")


def test_the_ratio_is_the_benchmarks_at_its_shapes_and_interpolated_between(h100):
    pairs = h100.flash1_vs_flash2_tflops
    # Dao 2023 Fig. 7 (d), causal, head dim 128, 2k tokens: 108 and 265 TFLOP/s
    assert flash1_slowdown(pairs, 2048, 128) == pytest.approx(265 / 108)
    # halfway in log2(length) between 2k and 4k, halfway in head dim between 64 and 128
    mid = flash1_slowdown(pairs, round(2048 * math.sqrt(2)), 128)
    assert mid == pytest.approx((265 / 108 + 294 / 126) / 2, rel=1e-3)
    assert flash1_slowdown(pairs, 2048, 96) == pytest.approx((265 / 108 + 232 / 136) / 2)
    # held beyond the benchmark's ends
    assert flash1_slowdown(pairs, 256, 128) == pytest.approx(163 / 98)
    assert flash1_slowdown(pairs, 65536, 256) == pytest.approx(328 / 137)


@given(seq=st.integers(min_value=128, max_value=1 << 20),
       head_dim=st.integers(min_value=16, max_value=256))
def test_the_ratio_stays_within_the_measured_ones(seq, head_dim):
    pairs = load_spec("accelerators", "h100-sxm5-80gb").flash1_vs_flash2_tflops
    ratios = [fa2 / fa1 for by_seq in pairs.values() for fa1, fa2 in by_seq.values()]
    assert min(ratios) - 1e-12 <= flash1_slowdown(pairs, seq, head_dim) <= max(ratios) + 1e-12


def _layer(heads: int, seq: int):
    """One GPT block's passes with ``heads`` heads of 128 on one device."""
    sc = make_scenario(**{"model.hidden": heads * 128, "model.heads": heads,
                          "model.max_seq_len": seq, "training.seq_len": seq,
                          "parallelism.tp": 1, "training.global_batch": 16})
    return LayerBuilder(sc.model, sc.parallelism, sc.training).layer()


def _attention_ops(heads: int, seq: int):
    fwd, _, bwd, _ = _layer(heads, seq)
    return (next(op for op in fwd if op.kind == "attention"),
            next(op for op in bwd if op.kind == "attention"))


@pytest.mark.parametrize(("heads", "seq"), [(24, 2048), (16, 4096), (8, 1024)])
def test_flash1_is_flash2s_time_times_the_ratio(h100, heads, seq):
    flash2 = ComputeModel(h100, "bf16", attention_kernel="flash")
    flash1 = ComputeModel(h100, "bf16", attention_kernel="flash1")
    factor = flash1_slowdown(h100.flash1_vs_flash2_tflops, seq, 128)
    for op in _attention_ops(heads, seq):
        assert flash1.math_s(op) == pytest.approx(flash2.math_s(op) * factor, rel=1e-12)
        assert flash1.compute_s(op) > flash2.compute_s(op)
    qkv = next(op for op in _layer(heads, seq)[0] if op.kind == "gemm")
    assert flash1.compute_s(qkv) == flash2.compute_s(qkv)  # only attention changes


def test_an_accelerator_without_the_benchmark_refuses_flash1():
    sc = make_scenario(**{"training.attention_kernel": "flash1"})  # Selene's A100
    assert sc.system.node.accelerator.flash1_vs_flash2_tflops is None
    with pytest.raises(UserError, match=r"flash1 has no measured FlashAttention 1\.x rate on "
                                        "a100"):
        simulate(sc)


def test_cli_refuses_flash1_where_unmeasured_in_one_sentence(capsys):
    code, _, err = run_cli(["run", "selene-gpt3", "--set", "training.attention_kernel=flash1"],
                           capsys)
    assert code == 2 and "Traceback" not in err
    assert "flash1 has no measured FlashAttention 1.x rate" in " ".join(err.split())
