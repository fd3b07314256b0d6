"""FlashAttention-2's measured throughput curve: its rate at one shape, interpolated
between the shapes a benchmark timed (``Accelerator.flash_attention_tflops``)."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np


def flash_attention_flops(
    curve: Mapping[int, Mapping[int, float]], seq_len: int, head_dim: int
) -> float:
    """FLOP/s of FlashAttention-2 (forward + backward, causal) at one shape, from a
    measured curve ``{head_dim: {seq_len: TFLOP/s}}``.

    Along the sequence the throughput is interpolated in log₂(seq_len), the axis its
    benchmark doubles (512 … 16k), and held at the ends; between two measured head
    dimensions it is interpolated linearly, and held beyond them. The kernel is slower on
    short sequences (fewer tiles of work per softmax rescaling, more launch and tail) and
    on small heads (less math per byte of Q, K and V).
    """
    def along_seq(by_seq: Mapping[int, float]) -> float:
        points = sorted(by_seq.items())
        xs = [math.log2(s) for s, _ in points]
        ys = [t for _, t in points]
        return float(np.interp(math.log2(seq_len), xs, ys))

    dims = sorted(curve)
    tflops = float(np.interp(head_dim, dims, [along_seq(curve[d]) for d in dims]))
    return tflops * 1e12
