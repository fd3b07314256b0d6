"""FlashAttention 1.x beside FlashAttention-2 (``training.attention_kernel: flash1``).

flash-attn 1.x is the kernel that Transformer Engine of spring 2023 (v0.8) called for a
causal BF16 attention; FlashAttention-2 replaced it in July 2023. llmsim prices the older
kernel from the newer one's rate on the same board (``flash_attention_measured``,
``flash_attention_tflops`` or ``attention_fraction``): slower by FlashAttention-2's
throughput over FlashAttention 1.x's where both were timed side by side in one benchmark
on the accelerator (``flash1_vs_flash2_tflops``: Dao 2023, the FlashAttention-2 paper,
Figure 7 on the H100, forward + backward, causal). Between the benchmark's sequence
lengths the ratio is interpolated in log₂(length) and held beyond them; between its head
dimensions linearly, held beyond them — as :func:`llmsim.costs.flash_curve.curve_at`
reads a curve. The one ratio of forward + backward is applied to the forward and the
backward alike (the benchmark gives no split).
"""

from __future__ import annotations

from collections.abc import Mapping

from llmsim.costs.flash_curve import curve_at

Flash1Pairs = Mapping[int, Mapping[int, tuple[float, float]]]
"""``{head_dim: {seq_len: (FlashAttention 1.x TFLOP/s, FlashAttention-2 TFLOP/s)}}``."""


def flash1_slowdown(pairs: Flash1Pairs, seq_len: int, head_dim: int) -> float:
    """FlashAttention-2's throughput over FlashAttention 1.x's at a causal shape (≥ 1 where
    the newer kernel is faster): the factor on FlashAttention-2's time (module docstring),
    the ratio at each timed shape read as a curve (:func:`curve_at`)."""
    ratios = {d: {s: fa2 / fa1 for s, (fa1, fa2) in by_seq.items()}
              for d, by_seq in pairs.items()}
    return curve_at(ratios, seq_len, head_dim)
