"""ZB-V's walk compiled: the order of one (p, m) as index arrays, replayed per layout.

The search replays ZB-V's action order with a layout's pass times
(:func:`llmsim.search.pipeline.zb_v_walk_s`): each pass starts when its stage is free and
its input has arrived. Which
pass waits for which does not depend on the times, only on (p, m), so :func:`compiled`
works it out once — per pass its stage, its duration's column, the pass it waits for
and the hop that input takes — and :func:`walk_s` replays it with a layout's times in
a compiled loop (:func:`llmsim.schedules.walk_kernel.replay_ends`: O(passes) float
operations, a few nanoseconds a pass).

The wait graph and the loop are the schedules' one dependency walk
(:mod:`llmsim.schedules.walk`), which ``tests/test_walk.py`` checks against a reference
that times the passes by another route.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from llmsim.in_flight import schedule_rows
from llmsim.schedules.walk_kernel import replay_ends
from llmsim.search.memo import BoundedMemo
from llmsim.search.pass_cache import PassBoundedCache

CACHE_PASSES = 3_000_000
"""Most passes of compiled walks one process keeps (least recently used dropped)."""


@dataclass(frozen=True, slots=True)
class CompiledWalk:
    """ZB-V's order of ``p`` stages and ``m`` micro-batches as index arrays, its passes in
    an order in which every pass comes after the one it waits for.

    Pass ``k`` (1-based; index 0 is a pass that ended at time 0, for passes that wait for
    nothing) runs on ``stage[k]`` for ``durations[column[k]]`` seconds, ``column = 6·s +
    3·chunk + kind``, once its stage is free and pass ``need[k]`` has ended and its output
    taken hop ``hop[k]`` (``hops[0] = 0``: the same stage, or a blocking send already in
    the pass times; ``1 + s``: stage s's send to the next stage; ``1 + p + s``: to the
    previous one)."""

    p: int
    passes: int
    rows: np.ndarray
    """(stage, column, need, hop) of each pass, a (passes × 4) array
    (:func:`llmsim.schedules.walk.rows_table`)."""
    schedule: str = "zb-v"
    """Whose order it is: ZB-H1's and ZB-H2's of one (p, m) have as many passes and
    read the same durations, so the walks' memo keys on it too."""


_CACHE: PassBoundedCache[CompiledWalk] = PassBoundedCache(CACHE_PASSES, lambda w: w.passes)


def compiled(p: int, m: int, schedule: str = "zb-v", v: int = 2) -> CompiledWalk:
    """The compiled walk of ZB-V (or of ``schedule`` with ``v`` chunks: ZB-H1's where its
    closed form does not hold, :func:`llmsim.search.pipeline.pipeline_runs_s`) with ``p``
    stages and ``m`` micro-batches (memoised per process up to :data:`CACHE_PASSES`
    passes)."""
    return _CACHE.get((schedule, p, m, v), lambda: _compile(schedule, p, m, v))


def _compile(schedule: str, p: int, m: int, v: int) -> CompiledWalk:
    """The order's wait graph (ZB-V's V: chunk 0 of stage s is virtual stage s, chunk 1
    virtual stage 2p − 1 − s) as an array of rows: as the greedy scheduler makes it with
    the order (ZB-V, ZB-H2: one sweep for both), else by
    :func:`llmsim.schedules.walk.wait_graph`."""
    _, rows = schedule_rows(schedule, p, m, v)  # ZB-V's and ZB-H2's rows as built
    return CompiledWalk(p, len(rows), rows, schedule)


WALK_MEMO = 4096
"""Walks whose results one process keeps, by their exact inputs: layouts that differ only
in what the walk does not read (the ZeRO stage below 3, the parameter-gather overlap, the
nodes) replay the same walk. Only for the order walked last: ZB-H1's and ZB-H2's orders
of the same p and m have as many passes and stages, so their walks' inputs alike."""

_WALKS = BoundedMemo(WALK_MEMO)


def walk_s(walk: CompiledWalk, durations: list[float],
           hops: list[float]) -> tuple[float, list[float]]:
    """(the walk's length, when each stage's last pass ends), seconds, with
    ``durations[6·s + 3·chunk + kind]`` and ``hops`` as :class:`CompiledWalk` says;
    memoised on these exact inputs and the order (:data:`WALK_MEMO`): the memo holds one
    order's walks at a time, and its key names the schedule too."""
    _WALKS.keep_for(walk)
    key = (walk.schedule, walk.p, walk.passes, *durations, *hops)
    hit = _WALKS.get(key)
    if hit is None:
        _, free = replay_ends(walk.p, walk.rows, durations, hops)
        hit = _WALKS.put(key, (max(free), tuple(free)))
    return hit[0], list(hit[1])
