"""Attention kernels priced from FlashAttention-2's rate by a side-by-side ratio
(llmsim.costs.attention_relative): ``triton_fwd``, DistFlashAttn's Triton forward with
FlashAttention-2's backward (``triton_fwd_vs_flash2_ms``). ``flash1`` has its own tests
(tests/test_flash1.py)."""

from __future__ import annotations

import pytest
from helpers import make_scenario
from hypothesis import given
from hypothesis import strategies as st
from test_cli import run_cli

from llmsim.costs.attention_relative import (
    RELATIVE_KERNELS,
    RelativePricing,
    missing_measurement,
    triton_forward_slowdown,
)
from llmsim.costs.compute import ComputeModel
from llmsim.errors import UserError
from llmsim.loader import load_spec
from llmsim.simulation import simulate
from llmsim.specs import Accelerator
from llmsim.workload import LayerBuilder

A100: Accelerator = load_spec("accelerators", "a100-sxm4-80gb")
"""The board whose catalog entry holds the side-by-side forward timing."""


def test_the_ratio_is_the_benchmarks_at_its_shapes():
    pairs = A100.triton_fwd_vs_flash2_ms
    # triton-lang/triton #1934 (2024-09-27), causal forward, batch 4, 32 heads, d 128, 8k:
    # Triton 12.040288 ms, FlashAttention-2 10.662884 ms
    assert triton_forward_slowdown(pairs, 8192, 128) == pytest.approx(12.040288 / 10.662884)
    # held beyond the benchmark's lengths: DistFlashAttn's 32k blocks take the 16k ratio
    assert triton_forward_slowdown(pairs, 32768, 128) == pytest.approx(46.750145 / 41.799503)
    # at head dimension 64 the tutorial kernel is as fast as FlashAttention-2 (0.97-1.01)
    assert triton_forward_slowdown(pairs, 4096, 64) == pytest.approx(1.598519 / 1.628497)


@given(seq=st.integers(min_value=128, max_value=1 << 20),
       head_dim=st.integers(min_value=16, max_value=256))
def test_the_ratio_stays_within_the_measured_ones(seq, head_dim):
    pairs = A100.triton_fwd_vs_flash2_ms
    ratios = [t / f for by_seq in pairs.values() for t, f in by_seq.values()]
    assert min(ratios) - 1e-12 <= triton_forward_slowdown(pairs, seq, head_dim) \
        <= max(ratios) + 1e-12


def _layer(heads: int, seq: int, recompute: str = "full"):
    """One GPT block's passes with ``heads`` heads of 128 on one device."""
    sc = make_scenario(**{"model.hidden": heads * 128, "model.heads": heads,
                          "model.max_seq_len": seq, "training.seq_len": seq,
                          "parallelism.tp": 1, "training.global_batch": 16,
                          "parallelism.recompute": recompute})
    return LayerBuilder(sc.model, sc.parallelism, sc.training).layer()


@pytest.mark.parametrize(("heads", "seq"), [(32, 2048), (16, 8192), (8, 32768)])
def test_the_forward_is_slowed_and_the_backward_is_flash2s(heads, seq):
    """Forward and recompute ops: FlashAttention-2's time times the ratio; the backward:
    FlashAttention-2's time exactly (DistFlashAttn calls flash-attn 2's backward)."""
    flash2 = ComputeModel(A100, "fp16", attention_kernel="flash")
    triton = ComputeModel(A100, "fp16", attention_kernel="triton_fwd")
    factor = triton_forward_slowdown(A100.triton_fwd_vs_flash2_ms, seq, 128)
    assert factor > 1
    fwd, rec, bwd, _ = _layer(heads, seq)
    for op in (o for o in [*fwd, *rec] if o.kind == "attention"):
        assert triton.math_s(op) == pytest.approx(flash2.math_s(op) * factor, rel=1e-12)
    b = next(o for o in bwd if o.kind == "attention")
    assert triton.compute_s(b) == flash2.compute_s(b)
    for op in (o for o in [*fwd, *bwd] if o.kind != "attention"):
        assert triton.compute_s(op) == flash2.compute_s(op)  # only attention changes


def test_a_kernel_priced_by_its_own_rates_has_no_relative_pricing():
    for kernel in ("flash", "cudnn", "unfused"):
        assert RelativePricing.of(A100, kernel) is None
        assert missing_measurement(A100, kernel) is None
    assert set(RELATIVE_KERNELS) == {"flash1", "triton_fwd"}


def test_an_accelerator_without_the_benchmark_refuses_triton_fwd():
    h100 = load_spec("accelerators", "h100-sxm5-80gb")
    assert h100.triton_fwd_vs_flash2_ms is None
    assert missing_measurement(h100, "triton_fwd") == (
        "training.attention_kernel: triton_fwd has no measured Triton forward time on "
        "h100-sxm5-80gb; use flash, or give the accelerator triton_fwd_vs_flash2_ms")
    sc = make_scenario(**{"system": "eos", "training.attention_kernel": "triton_fwd"})
    with pytest.raises(UserError, match="triton_fwd has no measured Triton forward time"):
        simulate(sc)


def test_cli_refuses_triton_fwd_where_unmeasured_in_one_sentence(capsys):
    code, _, err = run_cli(["run", "frontier", "--set",
                            "training.attention_kernel=triton_fwd"], capsys)
    assert code == 2 and "Traceback" not in err
    assert "triton_fwd has no measured Triton forward time" in " ".join(err.split())
