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

from dataclasses import dataclass

import numpy as np

from llmsim.in_flight import schedule_order
from llmsim.search.pass_cache import PassBoundedCache

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


_CACHE: PassBoundedCache[CompiledWalk] = PassBoundedCache(CACHE_PASSES, lambda w: w.passes)


def compiled(p: int, m: int) -> CompiledWalk:
    """The compiled walk of ZB-V with ``p`` stages and ``m`` micro-batches (memoised per
    process up to :data:`CACHE_PASSES` passes)."""
    return _CACHE.get((p, m), lambda: _compile(p, m))


def _compile(p: int, m: int) -> CompiledWalk:
    """Walk ZB-V's order once, recording for each pass what it waits for instead of when
    it runs."""
    order = schedule_order("zb-v", p, m, 2)
    # Virtual stage k of a stage's chunk: the V (chunk 0 of stage s is s, chunk 1 is
    # 2p − 1 − s). A pass (kind, micro-batch, virtual stage) is the slot
    # (kind·m + mb)·2p + k of the flat tables below.
    last, width = 2 * p - 1, 2 * p
    plain = [[(KINDS[a.kind], a.microbatch, a.chunk, s if a.chunk == 0 else last - s)
              for a in row] for s, row in enumerate(order)]
    produced = [0] * (3 * m * width)  # the pass's number (1-based), 0 while not run
    sender_of = [0] * (3 * m * width)  # its stage
    rows: list[tuple[int, int, int, int]] = []
    position = [0] * p
    progress = True
    while progress:
        progress = False
        for s in range(p):
            row, at = plain[s], position[s]
            while at < len(row):
                kind, mb, chunk, k = row[at]
                if kind == 0:  # F after the F of the previous virtual stage
                    need = mb * width + k - 1 if k > 0 else -1
                elif kind == 1:  # B after the next one's B (the last one's after its F)
                    need = (m + mb) * width + k + 1 if k < last else mb * width + k
                else:  # W after its own B
                    need = (2 * m + mb) * width + k
                if need < 0:
                    j, hop = 0, 0
                else:
                    j = produced[need]
                    if not j:
                        break
                    sender = sender_of[need]
                    # The sender's hop toward this stage (none within the stage, and none
                    # for a weight pass, which follows its own backward).
                    hop = 0 if sender == s or kind == 2 else (
                        1 + sender if s == sender + 1 else 1 + p + sender)
                rows.append((s, 6 * s + 3 * chunk + kind, j, hop))
                number = len(rows)
                if kind != 2:  # a backward's weight pass follows it on its stage
                    slot = (kind * m + mb) * width + k
                    produced[slot], sender_of[slot] = number, s
                if kind == 1:
                    slot = (2 * m + mb) * width + k
                    produced[slot], sender_of[slot] = number, s
                at += 1
                progress = True
            position[s] = at
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
    table = np.empty((len(rows), 5), dtype=np.int64)
    table[:, 0] = np.arange(1, len(rows) + 1)
    table[:, 1:] = np.array(rows, dtype=np.int64)
    order = np.argsort(np.asarray(depth[1:]), kind="stable")
    table = table[order]
    bounds = np.flatnonzero(np.diff(np.asarray(depth[1:])[order])) + 1
    return tuple((part[:, 0].copy(), part[:, 1].copy(), part[:, 2].copy(), part[:, 3].copy(),
                  part[:, 4].copy())
                 for part in np.split(table, bounds))


WALK_MEMO = 4096
"""Walks whose results one process keeps, by their exact inputs: layouts that differ only
in what the walk does not read (the ZeRO stage below 3, the parameter-gather overlap, the
nodes) replay the same walk."""

_WALKS: dict[tuple, tuple[float, tuple[float, ...]]] = {}


def walk_s(walk: CompiledWalk, durations: list[float],
           hops: list[float]) -> tuple[float, list[float]]:
    """(the walk's length, when each stage's last pass ends), seconds, with
    ``durations[6·s + 3·chunk + kind]`` and ``hops`` as :class:`CompiledWalk` says;
    memoised on these exact inputs (:data:`WALK_MEMO`)."""
    key = (walk.p, walk.passes, *durations, *hops)
    hit = _WALKS.get(key)
    if hit is None:
        total, ends = _replay(walk, durations, hops)
        if len(_WALKS) >= WALK_MEMO:
            _WALKS.clear()
        hit = _WALKS[key] = (total, tuple(ends))
    return hit[0], list(hit[1])


def _replay(walk: CompiledWalk, durations: list[float],
            hops: list[float]) -> tuple[float, list[float]]:
    """:func:`walk_s` without the memo."""
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
