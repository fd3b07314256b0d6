"""Zero Bubble ZB-H2 (Qi et al. 2024 §2.2, Fig. 3 bottom; Table 2)."""

from __future__ import annotations

import numpy as np

from llmsim.schedules.orders import greedy_order, greedy_walked, require_one_chunk
from llmsim.schedules.registry import register
from llmsim.schedules.route import looping


def zb_h2_bubble(p: int, m: int, v: int, f: float, b: float, w: float) -> float:
    """Idle time of a stage in a step that ends with the optimizer's synchronisation:
    (p−1)·max(t_F, t_F + t_B − 2t_W), for m ≥ 2p − 1 and t_W ≤ t_F, t_B.

    Every stage runs without a gap from its first forward (stage i starts i·t_F late) to
    its last pass, except stage 0, which waits (p−1)(t_F + t_B − 2t_W) in all — Table 2's
    bubble of ZB-H2, which is the whole per-step bubble once the optimizer's
    synchronisation is replaced by post-validation (§4). The step ends when the later of
    stage 0 and stage p−1 ends.
    """
    return (p - 1) * max(f, f + b - 2 * w)


@register("zb-h2", split_backward=True,
          peak_forwards=lambda p, i, m, v: min(2 * p - 1, m),
          bubble=zb_h2_bubble,
          walked=lambda p, m, v: zb_h2_walked(p, m, v))
def zb_h2(stages: int, microbatches: int, chunks: int) -> list:
    """ZB-H2: up to 2p − 1 micro-batches in flight on every stage (Qi et al. 2024 §2.2).

    More forwards in the warm-up fill the bubble before the first B, and the W passes
    are moved to the tail, so that the trapezoid of 1F1B becomes a parallelogram. The
    order is the greedy list schedule of :func:`~llmsim.schedules.orders.greedy_order`
    with the memory limit 2p − 1 (Table 2: (2p−1)·M_B): B first, then F, then W.
    """
    require_one_chunk("zb-h2", chunks)
    return greedy_order(stages, microbatches, looping(stages, 1), 2 * stages - 1)


def zb_h2_walked(stages: int, microbatches: int, chunks: int) -> tuple[list, np.ndarray]:
    """:func:`zb_h2`'s order with its wait graph's rows, made as it is scheduled."""
    require_one_chunk("zb-h2", chunks)
    return greedy_walked(stages, microbatches, looping(stages, 1), 2 * stages - 1)
