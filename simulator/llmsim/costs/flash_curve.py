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


def flash_pass_flops(
    combined: Mapping[int, Mapping[int, float]],
    per_pass: Mapping[int, Mapping[int, float]] | None,
    seq_len: int,
    head_dim: int,
) -> float:
    """FLOP/s of one pass of FlashAttention-2 (forward, or backward) at one shape: the
    pass's own measured curve ``{head_dim: {seq_len: TFLOP/s}}`` where the shape lies
    inside the lengths and head dimensions it timed, and outside them the combined forward
    + backward curve (:func:`flash_attention_flops`) times the pass's ratio to it at the
    nearest timed shape (the pass curve's benchmark may time fewer shapes than the
    combined one). Without a pass curve, the combined curve prices both passes."""
    if not per_pass:
        return flash_attention_flops(combined, seq_len, head_dim)
    dims = sorted(per_pass)
    seqs = sorted({s for by_seq in per_pass.values() for s in by_seq})
    near_dim = min(max(head_dim, dims[0]), dims[-1])
    near_seq = min(max(seq_len, seqs[0]), seqs[-1])
    ratio = curve_at(per_pass, near_seq, near_dim) / curve_at(combined, near_seq, near_dim)
    return curve_at(combined, seq_len, head_dim) * ratio * 1e12
