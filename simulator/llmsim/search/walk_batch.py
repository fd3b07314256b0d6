"""The walks of one batch replayed together, with numpy, instead of one by one.

A batch holds the layouts of one walk key (:mod:`.batching`): its ZB-V, ZB-H1/H2,
Chimera and DualPipe layouts all walk the same compiled order (:mod:`.zb_v_walk`,
:mod:`.two_pipelines`) with different pass times. A walk is the same float operations
whatever the times — per pass ``t = max(free[s], end[j] + hop) + duration`` — so the
``K`` distinct walks of a batch can run as one walk over a (passes × K) array, level by
level of the wait graph (:func:`llmsim.schedules.walk.levels`): a few numpy calls a
level for all of them, where the loop costs 0.1–0.3 µs a pass for each. The numbers are
the loop's, bit for bit (the same operations on the same doubles).

:func:`llmsim.search.price.price_batch` prices a batch in two passes: with
:func:`collecting` on, a walk that is not memoised yet is recorded (:func:`defer`) and
its layout set aside (:class:`Deferred`); :func:`flush` then replays every recorded walk
of each order together and puts the results in the walk memos, and the set-aside
layouts are priced again, finding their walks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from llmsim.schedules.walk import Levels

TOGETHER_FROM = 96
"""Walks of one order are replayed together once ``walks × stages`` reaches this, else
one by one with the loop (a level's numpy calls cost about as much as the loop's p
passes of some ``96 / p`` walks; measured below in ``docs/search.md``)."""


class Deferred(Exception):
    """A walk was recorded to be replayed with its batch's others (:func:`defer`)."""


Finish = Callable[[Callable[[int], float], list[float]], Any]
"""``finish(end, free)``: a walk's memo value from ``end(k)``, pass k's end (0 being time
0), and each stage's last end (a column of :func:`replay_together`'s arrays)."""


@dataclass
class _Order:
    """The walks recorded for one compiled order."""

    p: int
    passes: int
    by_level: Callable[[], Levels]
    one: Callable[[list[float], list[float]], Any]
    memo: Any
    finish: Finish
    walks: dict[tuple, tuple[list[float], list[float]]] = field(default_factory=dict)
    """Memo key → (durations, hops)."""


_ORDERS: dict[int, tuple[object, _Order]] = {}
_ACTIVE: list[bool] = [False]
_LEVELS: dict[int, tuple[object, Levels]] = {}
"""The levels of the last compiled order replayed together, by id (kept with it)."""


@contextmanager
def collecting() -> Iterator[None]:
    """Record walks not yet memoised instead of replaying them (:func:`defer`)."""
    _ACTIVE[0] = True
    try:
        yield
    finally:
        _ACTIVE[0] = False


def defer(order: object, p: int, passes: int, by_level: Callable[[], Levels],
          one: Callable[[list[float], list[float]], Any], memo: Any, key: tuple,
          durations: list[float], hops: list[float], finish: Finish) -> None:
    """While :func:`collecting`, record the walk of ``order`` (``p`` stages, ``passes``
    passes, its levels ``by_level()``) with ``durations`` and ``hops`` under ``key`` of
    ``memo`` and raise :class:`Deferred`; otherwise do nothing (the caller walks it at
    once). ``one(durations, hops)`` is the memo value of one walk by the loop."""
    if not _ACTIVE[0]:
        return
    held = _ORDERS.get(id(order))
    if held is None or held[0] is not order:
        held = _ORDERS[id(order)] = (order, _Order(p, passes, by_level, one, memo, finish))
    held[1].walks.setdefault(key, (durations, hops))
    raise Deferred


def flush() -> None:
    """Replay every recorded walk, those of one order together, into their memos."""
    orders = list(_ORDERS.values())
    _ORDERS.clear()
    for order, rec in orders:
        keys = list(rec.walks)
        if len(keys) * rec.p < TOGETHER_FROM:
            for key in keys:
                rec.memo.put(key, rec.one(*rec.walks[key]))
            continue
        ends, free = replay_together(rec.p, rec.passes, _levels_of(order, rec.by_level),
                                     [rec.walks[k][0] for k in keys],
                                     [rec.walks[k][1] for k in keys])
        free_t = free.T.tolist()
        for i, key in enumerate(keys):
            column = ends[:, i]
            rec.memo.put(key, rec.finish(lambda k, c=column: float(c[k]), free_t[i]))


def _levels_of(order: object, by_level: Callable[[], Levels]) -> Levels:
    hit = _LEVELS.get(id(order))
    if hit is None or hit[0] is not order:
        _LEVELS.clear()  # one order a batch: keep the last only
        hit = _LEVELS[id(order)] = (order, by_level())
    return hit[1]


def replay_together(p: int, passes: int, by_level: Levels, durations: list[list[float]],
                    hops: list[list[float]]) -> tuple[np.ndarray, np.ndarray]:
    """:func:`llmsim.schedules.walk.replay` of ``K`` walks of one order at once: (each
    pass's end, index 0 being time 0, as a (passes + 1) × K array; each stage's last end,
    p × K), walk ``i`` with ``durations[i]`` and ``hops[i]``. Level by level, the loop's
    float operations per pass, so the loop's numbers; a stage's free time is read as its
    previous pass's end (:data:`~llmsim.schedules.walk.Levels`) rather than kept."""
    d = np.asarray(durations, dtype=float).T.copy()
    h = np.asarray(hops, dtype=float).T.copy()
    k_walks = d.shape[1]
    ends = np.zeros((passes + 1, k_walks))
    # Blocking sends (every hop +0.0) add nothing: an end is never −0.0 (a sum from
    # +0.0 of durations), and x + 0.0 is x for any other x
    hopped = bool(h.any())
    last = np.zeros(p, dtype=np.int64)  # each stage's last pass
    for k, s, column, j, hop, previous in by_level:
        t = ends[j]
        if hopped:
            t += h[hop]
        np.maximum(ends[previous], t, out=t)  # the stage is free at its previous pass's end
        t += d[column]
        ends[k] = t
        last[s] = k
    return ends, ends[last]
