"""Zero Bubble ZB-H1 (Qi et al. 2024 §2.1)."""

from __future__ import annotations

from llmsim.schedules.orders import one_f_one_b_order, require_one_chunk, with_weight_passes
from llmsim.schedules.registry import register


@register("zb-h1", split_backward=True,
          peak_forwards=lambda p, i, m, v: min(p - i, m),
          bubble=lambda p, m, v, f, b, w: (p - 1) * (f + b - w))
def zb_h1(stages: int, microbatches: int, chunks: int) -> list:
    """Zero Bubble ZB-H1 (Qi et al. 2024 §2.1, Fig. 3 top; Table 2).

    F and B follow 1F1B; stage ``i`` postpones its W passes by ``i`` micro-batches, so the
    steady state on stage ``i`` is ``F(x) B(x−p+1+i) W(x−p+1)`` and the last ``i`` W passes
    fill the cool-down. Every stage then holds p micro-batches whose W is pending, the
    same peak as stage 0 of 1F1B (Table 2: p·M_B; the memory model counts the p − i
    waiting for B, as W keeps less), and the bubble is (p−1)(T_F+T_B−T_W).
    """
    require_one_chunk("zb-h1", chunks)
    return [
        with_weight_passes(s, one_f_one_b_order(stages, microbatches, s), lag=s)
        for s in range(stages)
    ]
