"""The dependency walk's replay compiled to machine code (numba), for the layout search.

:func:`llmsim.schedules.walk.replay` is a loop of a few float operations a pass; the search
replays deep orders (up to some 440,000 passes: DualPipe on 96 stages with 1,536
micro-batches) tens of thousands of times, where Python's interpreter costs 0.1–0.3 µs a
pass. :func:`replay_ends` is the same loop over the order's :func:`table` compiled by
numba's ``njit`` (no ``fastmath``: the same IEEE double operations in the same order, so
the same numbers bit for bit; ``tests/test_walk_kernel.py``), a few nanoseconds a pass.
The compiled code is cached next to this file (``cache=True``): the first call after an
install compiles it (about half a second), later processes load it.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain

import numpy as np
from numba import njit

from llmsim.schedules.walk import Row


def table(rows: Sequence[Row]) -> np.ndarray:
    """The rows of a wait graph (:data:`~llmsim.schedules.walk.Row`: stage, duration
    column, the 1-based pass waited for or 0, hop) as an (passes × 4) int64 array."""
    n = len(rows)
    return np.fromiter(chain.from_iterable(rows), dtype=np.int64, count=4 * n).reshape(n, 4)


def replay_ends(p: int, rows: np.ndarray, durations: Sequence[float], hops: Sequence[float],
                picks: np.ndarray | None = None) -> tuple[list[float], list[float]]:
    """(the ends of the passes ``picks`` (1-based indices; none by default), each stage's
    last end), seconds: :func:`llmsim.schedules.walk.replay` of the order whose
    :func:`table` is ``rows``, with ``durations[column]`` and ``hops[hop]`` (a stage
    without passes ends at 0.0)."""
    picked, free = _replay(p, rows, np.asarray(durations, dtype=np.float64),
                           np.asarray(hops, dtype=np.float64),
                           _NO_PICKS if picks is None else picks)
    return picked.tolist(), free.tolist()


_NO_PICKS = np.zeros(0, dtype=np.int64)


@njit(cache=True, nogil=True)
def _replay(p, rows, durations, hops, picks):  # pragma: no cover - compiled by numba
    n = rows.shape[0]
    end = np.empty(n + 1)
    end[0] = 0.0
    free = np.zeros(p)
    for i in range(n):
        s = rows[i, 0]
        t = end[rows[i, 2]] + hops[rows[i, 3]]
        f = free[s]
        if f > t:
            t = f
        t += durations[rows[i, 1]]
        free[s] = t
        end[i + 1] = t
    picked = np.empty(picks.shape[0])
    for w in range(picks.shape[0]):
        picked[w] = end[picks[w]]
    return picked, free
