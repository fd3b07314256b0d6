"""1F1B (PipeDream-Flush, Narayanan et al. 2021 §2.2)."""

from __future__ import annotations

from llmsim.schedules.orders import one_f_one_b_order, require_one_chunk, with_weight_passes
from llmsim.schedules.registry import register


@register("1f1b",
          peak_forwards=lambda p, i, m, v: min(p - i, m),
          bubble=lambda p, m, v, f, b, w: (p - 1) * (f + b + w))
def one_f_one_b(stages: int, microbatches: int, chunks: int) -> list:
    """PipeDream-Flush 1F1B (Narayanan et al. 2021 §2.2), W fused after each B.

    Stage i holds min(p − i, m) micro-batches at its peak; the bubble is
    (p−1)(t_F + t_B + t_W) with the backward as one block (§2.2, Qi et al. 2024 Table 2).
    """
    require_one_chunk("1f1b", chunks)
    return [
        with_weight_passes(s, one_f_one_b_order(stages, microbatches, s), lag=0)
        for s in range(stages)
    ]
