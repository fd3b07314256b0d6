"""ZB-V's walk compiled: the order of one (p, m) as index arrays, replayed per layout.

The search replays ZB-V's action order with a layout's pass times
(:func:`llmsim.search.pipeline.zb_v_walk_s`): each pass starts when its stage is free and
its input has arrived. Which
pass waits for which does not depend on the times, only on (p, m), so :func:`compiled`
works it out once — per pass its stage, its duration's column, the pass it waits for
and the hop that input takes — and :func:`walk_s` replays it with a layout's times in
a tight loop (O(passes) float operations, no dictionaries or tuples), or, on deep
pipelines, level by level with numpy: passes whose inputs are all in (one per stage at
most) are computed together, about 6·m levels instead of 6·p·m passes.

The replay does the same float operations in the same order as a straightforward walk
of the order, pass by pass (an arrival is ``end + hop``, a start the larger of it and the
stage's free time, an end ``start + duration``), so the two are equal
(``tests/test_search_fast.py`` keeps that walk as its reference and checks it).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from llmsim.in_flight import schedule_order

KINDS = {"F": 0, "B": 1, "W": 2}
"""A pass kind's column within its chunk's three (F, B, W)."""

NUMPY_FROM_STAGES = 24
"""Pipelines of this many stages or more are replayed level by level with numpy (a level
costs a few numpy calls, a pass of the loop 0.1-0.3 µs). Measured, 384 micro-batches, on
a quiet 2-core machine: 16 stages 3.8 ms by the loop against 4.9 by levels, 24 stages
6.0 against 5.1; 48 stages and 768 micro-batches 25.5 against 12.2."""

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
    loop: tuple[tuple[int, int, int, int], ...] | None
    """(stage, column, need, hop) of each pass, for the loop (shallow pipelines)."""
    levels: tuple[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray], ...] \
        | None
    """Per level (pass indices, stages, columns, needs, hops), for numpy (deep ones)."""


_CACHE: OrderedDict[tuple[int, int], CompiledWalk] = OrderedDict()
_CACHED_PASSES = [0]


def compiled(p: int, m: int) -> CompiledWalk:
    """The compiled walk of ZB-V with ``p`` stages and ``m`` micro-batches (memoised per
    process up to :data:`CACHE_PASSES` passes)."""
    key = (p, m)
    hit = _CACHE.get(key)
    if hit is not None:
        _CACHE.move_to_end(key)
        return hit
    hit = _compile(p, m)
    _CACHE[key] = hit
    _CACHED_PASSES[0] += hit.passes
    while _CACHED_PASSES[0] > CACHE_PASSES and len(_CACHE) > 1:
        _, old = _CACHE.popitem(last=False)
        _CACHED_PASSES[0] -= old.passes
    return hit


def _compile(p: int, m: int) -> CompiledWalk:
    """Walk ZB-V's order once, recording for each pass what it waits for instead of when
    it runs."""
    order = schedule_order("zb-v", p, m, 2)
    hops = [(s, 0) for s in range(p)] + [(s, 1) for s in reversed(range(p))]
    index = {hop: k for k, hop in enumerate(hops)}
    last = 2 * p - 1
    produced: dict[tuple[str, int, int], tuple[int, int]] = {}  # → (pass, its stage)
    rows: list[tuple[int, int, int, int]] = []
    position = [0] * p
    progress = True
    while progress:
        progress = False
        for s, row in enumerate(order):
            while position[s] < len(row):
                a = row[position[s]]
                k = index[(s, a.chunk)]
                if a.kind == "F":
                    need = ("F", a.microbatch, k - 1) if k > 0 else None
                elif a.kind == "B":
                    need = ("B", a.microbatch, k + 1) if k < last else ("F", a.microbatch, k)
                else:
                    need = ("W", a.microbatch, k)
                if need is not None and need not in produced:
                    break
                if need is None:
                    j, hop = 0, 0
                else:
                    j, sender = produced[need]
                    # The sender's hop toward this stage (none within the stage, and none
                    # for a weight pass, which follows its own backward).
                    hop = 0 if sender == s or a.kind == "W" else (
                        1 + sender if s == sender + 1 else 1 + p + sender)
                rows.append((s, 6 * s + 3 * a.chunk + KINDS[a.kind], j, hop))
                number = len(rows)
                if a.kind != "W":  # a backward's weight pass follows it on its stage
                    produced[(a.kind, a.microbatch, k)] = (number, s)
                if a.kind == "B":
                    produced[("W", a.microbatch, k)] = (number, s)
                position[s] += 1
                progress = True
    if p < NUMPY_FROM_STAGES:
        return CompiledWalk(p, len(rows), tuple(rows), None)
    return CompiledWalk(p, len(rows), None, _levels(p, rows))


def _levels(p: int, rows: list[tuple[int, int, int, int]]) -> tuple:
    """Group the passes by their depth in the wait graph (after the previous pass of
    their stage and the pass they wait for): the passes of one level are independent."""
    depth = [0] * (len(rows) + 1)
    stage_depth = [0] * p
    for k, (s, _, j, _) in enumerate(rows, start=1):
        d = max(stage_depth[s], depth[j]) + 1
        depth[k] = stage_depth[s] = d
    table = np.array([(k, *row) for k, row in enumerate(rows, start=1)], dtype=np.int64)
    order = np.argsort(np.asarray(depth[1:]), kind="stable")
    table = table[order]
    bounds = np.flatnonzero(np.diff(np.asarray(depth[1:])[order])) + 1
    return tuple((part[:, 0].copy(), part[:, 1].copy(), part[:, 2].copy(), part[:, 3].copy(),
                  part[:, 4].copy())
                 for part in np.split(table, bounds))


def walk_s(walk: CompiledWalk, durations: list[float],
           hops: list[float]) -> tuple[float, list[float]]:
    """(the walk's length, when each stage's last pass ends), seconds, with
    ``durations[6·s + 3·chunk + kind]`` and ``hops`` as :class:`CompiledWalk` says."""
    if walk.loop is not None:
        free = [0.0] * walk.p
        end = [0.0]
        append = end.append
        for s, column, j, hop in walk.loop:
            t = end[j] + hops[hop]
            f = free[s]
            if f > t:
                t = f
            t += durations[column]
            free[s] = t
            append(t)
        return max(free), free
    d, h = np.asarray(durations), np.asarray(hops)
    ends = np.zeros(walk.passes + 1)
    free_at = np.zeros(walk.p)
    for k, s, column, j, hop in walk.levels:
        t = np.maximum(free_at[s], ends[j] + h[hop]) + d[column]
        ends[k] = t
        free_at[s] = t
    stage_ends = free_at.tolist()
    return max(stage_ends), stage_ends
