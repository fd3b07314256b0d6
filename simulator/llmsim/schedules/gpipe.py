"""GPipe: all forwards, then all backwards (Huang et al. 2019 §2.2)."""

from __future__ import annotations

from llmsim.schedules.action import Kind
from llmsim.schedules.orders import require_one_chunk, with_weight_passes
from llmsim.schedules.registry import register


@register("gpipe",
          peak_forwards=lambda p, i, m, v: m,
          bubble=lambda p, m, v, f, b, w: (p - 1) * (f + b + w))
def gpipe(stages: int, microbatches: int, chunks: int) -> list:
    """All forwards, then all backwards in micro-batch order (Huang et al. 2019 §2.2).

    The backward order follows torchtitan's ``ScheduleGPipe``; with equal stage times
    the bubble is (p−1)/(m+p−1) either way. Every stage holds all m micro-batches; the
    bubble (p−1)(t_F + t_B + t_W) treats the backward as one block.
    """
    require_one_chunk("gpipe", chunks)
    order: list[tuple[Kind, int]] = [("F", k) for k in range(microbatches)]
    order += [("B", k) for k in range(microbatches)]
    return [with_weight_passes(s, order, lag=0) for s in range(stages)]
