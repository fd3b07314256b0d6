"""Micro-batches in flight: how many forward passes' activations each pipeline stage holds
at its peak under a schedule (the activation term of :mod:`llmsim.memory`).

Sources: Huang et al. 2019 (GPipe), Narayanan et al. 2021 §2.2 (1F1B and interleaved),
Korthikanti et al. 2022 §4.2.3, Qi et al. 2024 §2.1 (ZB-H1).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from itertools import islice

from llmsim.errors import UserError


def _interleaved_peak(stages: int, stage: int, microbatches: int, chunks: int) -> int:
    """Warm-up forwards plus the first steady-state forward, Megatron-LM's interleaved
    ``forward_backward_pipelining_with_interleaving``: 2(p−i−1) + (v−1)·p warm-up passes
    (every pass in warm-up when m = p), capped at v·m."""
    total = microbatches * chunks
    if microbatches == stages:
        return total
    return min(2 * (stages - stage - 1) + (chunks - 1) * stages + 1, total)


_PEAK_FORWARDS: dict[str, Callable[[int, int, int, int], int]] = {
    "gpipe": lambda p, i, m, v: m,
    "1f1b": lambda p, i, m, v: min(p - i, m),
    "zb-h1": lambda p, i, m, v: min(p - i, m),
    "interleaved-1f1b": _interleaved_peak,
}
"""Per schedule, forward passes (chunk-micro-batches) held on stage ``i`` at its peak:
GPipe all m (Huang et al. 2019); 1F1B p − i (Narayanan et al. 2021 §2.2); ZB-H1 the same
as 1F1B (Qi et al. 2024 §2.1: its peak equals 1F1B's)."""


def _forward_chunks(stages: int, microbatches: int, chunks: int) -> Iterator[int]:
    """Chunk of each forward pass in Megatron's order: groups of p micro-batches run
    through chunk 0, then chunk 1, ... (Narayanan et al. 2021 §2.2.2, Fig. 4)."""
    for start in range(0, microbatches, stages):
        group = min(stages, microbatches - start)
        for chunk in range(chunks):
            yield from [chunk] * group


@functools.lru_cache(maxsize=4096)
def _in_flight_chunks(schedule: str, stages: int, microbatches: int,
                      chunks: int) -> tuple[tuple[int, ...], ...]:
    out = []
    for i in range(stages):
        peak = _PEAK_FORWARDS[schedule](stages, i, microbatches, chunks)
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
    if schedule not in _PEAK_FORWARDS:
        raise UserError(
            f"parallelism.schedule: {schedule!r} has no memory model; use one of "
            f"{', '.join(_PEAK_FORWARDS)}"
        )
    return [list(counts) for counts in _in_flight_chunks(schedule, stages, microbatches, chunks)]


def in_flight_microbatches(
    schedule: str, stages: int, microbatches: int, chunks: int = 1
) -> list[float]:
    """Per stage, micro-batches' worth of the stage's activations held at the peak:
    GPipe m; 1F1B and ZB-H1 min(p − i, m); interleaved (chunk-micro-batches)/v."""
    return [sum(c) / chunks for c in in_flight_chunks(schedule, stages, microbatches, chunks)]
