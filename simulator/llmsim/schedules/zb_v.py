"""Zero Bubble ZB-V (Qi et al. 2024, arXiv v2 §6): two chunks per stage in a V."""

from __future__ import annotations

import numpy as np

from llmsim.errors import UserError
from llmsim.schedules.orders import greedy_order, greedy_walked
from llmsim.schedules.registry import register
from llmsim.schedules.route import v_shape


def _require_two_chunks(chunks: int) -> None:
    if chunks != 2:
        raise UserError(
            f"chunks (virtual stages): {chunks} with schedule zb-v, which places exactly two "
            "model chunks on each stage; set parallelism.virtual_stages to 2"
        )


@register("zb-v", split_backward=True,
          route=lambda p, m, v: v_shape(p),
          peak_forwards=lambda p, i, m, v: min(2 * p, 2 * m),
          bubble=lambda p, m, v, f, b, w: (p - 1) * f / v,
          walked=lambda p, m, v: zb_v_walked(p, m, v))
def zb_v(stages: int, microbatches: int, chunks: int) -> list:
    """ZB-V: stage s holds virtual stages s and 2p − 1 − s, so a micro-batch goes down
    the stages and back up (the V), and stage 0 runs both the first forward and the
    last backward.

    The order is the greedy list schedule (:func:`~llmsim.schedules.orders.greedy_order`)
    with the memory limit of 1F1B: 2p chunk-micro-batches of half a stage each, p·M_B
    (Qi et al.: "the same activation memory as 1F1B"). With equal pass times t of a
    chunk the only idle time of a stage is (p − 1)·t — the fill of the V, half of
    ZB-H1's — and it is built for that setting (the paper's handcrafted ZB-V assumes
    T_F = T_B = T_W). Each micro-batch crosses 2(p − 1) stage boundaries per direction,
    twice 1F1B's.
    """
    _require_two_chunks(chunks)
    return greedy_order(stages, microbatches, v_shape(stages), 2 * stages)


def zb_v_walked(stages: int, microbatches: int, chunks: int) -> tuple[list, np.ndarray]:
    """:func:`zb_v`'s order with its wait graph's rows, made as it is scheduled."""
    _require_two_chunks(chunks)
    return greedy_walked(stages, microbatches, v_shape(stages), 2 * stages)
