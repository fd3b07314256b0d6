"""FlashAttention's measured throughput curves read at one shape: interpolated between the
shapes a benchmark timed (``Accelerator.flash_attention_tflops``, and the side-by-side
FlashAttention 1.x / 2 timings of ``flash1_vs_flash2_tflops``)."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np


def curve_at(curve: Mapping[int, Mapping[int, float]], seq_len: int, head_dim: int) -> float:
    """A curve ``{head_dim: {seq_len: value}}`` at one shape: along the sequence
    interpolated in log₂(seq_len), the axis its benchmarks double, and held at the ends;
    between two timed head dimensions linearly, and held beyond them."""

    def along_seq(by_seq: Mapping[int, float]) -> float:
        points = sorted(by_seq.items())
        xs = [math.log2(s) for s, _ in points]
        ys = [value for _, value in points]
        return float(np.interp(math.log2(seq_len), xs, ys))

    dims = sorted(curve)
    return float(np.interp(head_dim, dims, [along_seq(curve[d]) for d in dims]))


def flash_attention_flops(
    curve: Mapping[int, Mapping[int, float]], seq_len: int, head_dim: int
) -> float:
    """FLOP/s of FlashAttention-2 (forward + backward, causal) at one shape, from a
    measured curve ``{head_dim: {seq_len: TFLOP/s}}`` read by :func:`curve_at` (its
    benchmark doubles the length from 512 to 16k). The kernel is slower on short
    sequences (fewer tiles of work per softmax rescaling, more launch and tail) and on
    small heads (less math per byte of Q, K and V)."""
    return curve_at(curve, seq_len, head_dim) * 1e12
