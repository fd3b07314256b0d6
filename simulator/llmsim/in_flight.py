"""Micro-batches in flight: how many forward passes' activations each pipeline stage holds
at its peak under a schedule (the activation term of :mod:`llmsim.memory`).

Each schedule's peak is its registry entry's ``peak_forwards`` (the closed form in the
schedule's module, :mod:`llmsim.schedules`); sources there: Huang et al. 2019 (GPipe),
Narayanan et al. 2021 §2.2 (1F1B and interleaved), Qi et al. 2024 §2 (ZB-H1, ZB-H2).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from itertools import islice

import numpy as np

from llmsim.errors import UserError
from llmsim.schedules import SCHEDULES, chunks_at_peak
from llmsim.schedules.action import Action
from llmsim.schedules.registry import walked
from llmsim.schedules.walk import Rows, rows_table, wait_graph


def _forward_chunks(stages: int, microbatches: int, chunks: int) -> Iterator[int]:
    """Chunk of each forward pass in Megatron's order: groups of p micro-batches run
    through chunk 0, then chunk 1, ... (Narayanan et al. 2021 §2.2.2, Fig. 4)."""
    for start in range(0, microbatches, stages):
        group = min(stages, microbatches - start)
        for chunk in range(chunks):
            yield from [chunk] * group


def schedule_order(schedule: str, stages: int, microbatches: int,
                   chunks: int) -> tuple[tuple[Action, ...], ...]:
    """:func:`~llmsim.schedules.build`'s per-stage order, memoised for the last two shapes
    (:func:`schedule_walked`)."""
    return _walked(schedule, stages, microbatches, chunks)[0]


def schedule_walked(schedule: str, stages: int, microbatches: int, chunks: int
                    ) -> tuple[tuple[tuple[Action, ...], ...], Rows | None]:
    """(the per-stage order, its wait graph's rows where the schedule makes them as it
    builds the order, else None: :func:`~llmsim.schedules.registry.walked`). The order is
    memoised for the last two shapes: the layout search reads the same order twice in a
    row (its memory here, then its walk, :mod:`llmsim.search.zb_v_walk`). The rows are
    handed out once, to the walk's compile, which keeps them as an array (the memo would
    otherwise hold a deep order's rows as tuples, some 50 MB, after the compile);
    a second call gets None (the caller then finds them with
    :func:`~llmsim.schedules.walk.wait_graph`)."""
    order, held = _walked(schedule, stages, microbatches, chunks)
    return order, held.pop() if held else None


def schedule_rows(schedule: str, stages: int, microbatches: int, chunks: int, *,
                  gradient_after_weights: bool = False
                  ) -> tuple[tuple[tuple[Action, ...], ...], np.ndarray]:
    """(the per-stage order, its wait graph's rows as a (passes × 4) array) for a
    search's walk: the rows as the schedule made them with its order
    (:func:`schedule_walked`), else found from the order by
    :func:`~llmsim.schedules.walk.wait_graph` (``gradient_after_weights`` as there)."""
    order, rows = schedule_walked(schedule, stages, microbatches, chunks)
    if rows is not None:
        return order, rows_table(rows)
    return order, wait_graph(order, SCHEDULES[schedule].route_of(stages, microbatches, chunks),
                             gradient_after_weights=gradient_after_weights).table


@functools.lru_cache(maxsize=2)
def _walked(schedule: str, stages: int, microbatches: int,
            chunks: int) -> tuple[tuple[tuple[Action, ...], ...], list[Rows]]:
    order, rows = walked(schedule, stages, microbatches, chunks)
    return tuple(tuple(row) for row in order), [] if rows is None else [rows]


@functools.lru_cache(maxsize=4096)
def _in_flight_chunks(schedule: str, stages: int, microbatches: int,
                      chunks: int) -> tuple[tuple[int, ...], ...]:
    info = SCHEDULES[schedule]
    if info.route is not None:  # chunks placed otherwise than c·p + s: count the order's
        return tuple(tuple(chunks_at_peak(row))
                     for row in schedule_order(schedule, stages, microbatches, chunks))
    out = []
    for i in range(stages):
        peak = info.peak_forwards(stages, i, microbatches, chunks)
        counts = [0] * chunks
        for chunk in islice(_forward_chunks(stages, microbatches, chunks), peak):
            counts[chunk] += 1
        out.append(tuple(counts))
    return tuple(out)


def in_flight_chunks(
    schedule: str, stages: int, microbatches: int, chunks: int = 1
) -> list[list[int]]:
    """Per stage and per chunk, the micro-batches whose activations are held at the
    stage's peak (the moment before its first backward).

    Non-interleaved schedules have one chunk. For interleaved 1F1B the first stage holds
    v·p + p − 1 chunk-micro-batches, i.e. p·(1 + (p−1)/(p·v)) micro-batches' worth of the
    stage (Korthikanti et al. 2022 §4.2.3; Narayanan et al. 2021 §2.2.2).
    """
    if schedule not in SCHEDULES:
        raise UserError(
            f"parallelism.schedule: {schedule!r} has no memory model; use one of "
            f"{', '.join(SCHEDULES)}"
        )
    return [list(counts) for counts in _in_flight_chunks(schedule, stages, microbatches, chunks)]


def in_flight_microbatches(
    schedule: str, stages: int, microbatches: int, chunks: int = 1
) -> list[float]:
    """Per stage, micro-batches' worth of the stage's activations held at the peak:
    GPipe m; 1F1B and ZB-H1 min(p − i, m); ZB-H2 min(2p − 1, m); interleaved
    (chunk-micro-batches)/v."""
    return [sum(c) / chunks for c in in_flight_chunks(schedule, stages, microbatches, chunks)]
