"""The MI250X GCD's flash-attention rates: a ratio to the A100's, measured on both boards.

One user timed the same attention shapes with the same script on one MI250X GCD and on an
A100 (ROCm/triton issue 507, comments of 2024-02-16; the MI250X table again in
ROCm/flash-attention issue 44): FP16 forward, non-causal, batch x heads 16 x 64, in µs.
The catalog's MI250X curve (``flash_attention_tflops``) is each head dimension's
MI250X/A100 time ratio at 576 tokens, the longest timed, times the A100's FlashAttention-2
curve (hardware/accelerators/mi250x-gcd.yaml cites it all).
"""

from __future__ import annotations

import pytest

from llmsim.costs.compute import ComputeModel, flash_attention_flops
from llmsim.loader import load_spec
from llmsim.ops import ComputeOp

# (tokens, head dim) -> (MI250X CK flash µs, A100 FlashAttention-2 µs), batch x heads = 1024
TIMED_US = {
    (256, 64): (314.6, 121.5),
    (256, 128): (628.1, 233.3),
    (576, 64): (1864.9, 641.5),
    (576, 128): (3715.1, 1272.6),
}
BATCH_HEADS = 16 * 64


def _forward_tflops(tokens: int, head_dim: int, microseconds: float) -> float:
    """Non-causal forward FLOPs 4·b·h·s²·d over the time, TFLOP/s."""
    return 4 * BATCH_HEADS * tokens**2 * head_dim / (microseconds * 1e-6) / 1e12


def _ratio(tokens: int, head_dim: int) -> float:
    mi250x_us, a100_us = TIMED_US[(tokens, head_dim)]
    return a100_us / mi250x_us


def test_the_timings_are_the_rates_the_catalog_cites() -> None:
    """3,715.1 µs at 576 tokens and head dim 128 is 46.8 TFLOP/s on the GCD, 0.24 of its
    191.5 peak; the A100 ran the same shape at 136.7."""
    assert _forward_tflops(576, 128, 3715.1) == pytest.approx(46.8, abs=0.05)
    assert _forward_tflops(576, 128, 1272.6) == pytest.approx(136.7, abs=0.05)
    assert _forward_tflops(576, 64, 1864.9) == pytest.approx(46.6, abs=0.05)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_the_curve_is_the_measured_ratio_times_the_a100_curve(head_dim: int) -> None:
    """Every point of the MI250X curve is the 576-token ratio times the A100's point,
    rounded to 0.1 TFLOP/s."""
    gcd = load_spec("accelerators", "mi250x-gcd")
    a100 = load_spec("accelerators", "a100-sxm4-80gb")
    assert gcd.flash_attention_tflops is not None and a100.flash_attention_tflops is not None
    ratio = _ratio(576, head_dim)
    expected = {s: round(t * ratio, 1) for s, t in a100.flash_attention_tflops[head_dim].items()}
    assert gcd.flash_attention_tflops[head_dim] == expected


def test_the_ratio_falls_with_length_so_the_curve_is_not_pessimistic_by_construction() -> None:
    """The MI250X fell further behind from 256 to 576 tokens (0.371 → 0.343 at head dim
    128): holding the 576-token ratio at training lengths is the smaller assumption."""
    for head_dim in (64, 128):
        assert _ratio(576, head_dim) < _ratio(256, head_dim)
    assert _ratio(576, 128) == pytest.approx(0.3425, abs=5e-4)


def test_the_fraction_without_a_shape_is_the_ratio_times_the_a100_fraction() -> None:
    """attention_fraction = 0.6 · 312 · 0.3425 / 191.5 = 0.335."""
    gcd = load_spec("accelerators", "mi250x-gcd")
    a100 = load_spec("accelerators", "a100-sxm4-80gb")
    expected = a100.attention_fraction * a100.peak_flops("bf16") * _ratio(576, 128)
    assert gcd.attention_fraction == pytest.approx(expected / gcd.peak_flops("bf16"), abs=5e-4)


def test_an_attention_op_at_8192_tokens_runs_at_the_curve_s_rate() -> None:
    """FRONTIER25-01's shape (8,192 tokens, head dim 128): the cost model prices the flash
    kernel at the curve's 62.3 TFLOP/s, 0.325 of the GCD's peak (was 0.49)."""
    gcd = load_spec("accelerators", "mi250x-gcd")
    model = ComputeModel(gcd, "bf16", attention_kernel="flash")
    flops = 4 * 32 * 8192**2 * 128.0  # forward, 32 heads; causal: half executed
    op = ComputeOp(name="attn", kind="attention", phase="F", flops=flops, bytes=0.0,
                   executed_fraction=0.5, attention_shape=(8192, 128))
    assert model.math_s(op) == pytest.approx(0.5 * flops / 62.3e12, rel=1e-9)
    assert flash_attention_flops(gcd.flash_attention_tflops, 8192, 128) / gcd.peak_flops(
        "bf16") == pytest.approx(0.325, abs=1e-3)
