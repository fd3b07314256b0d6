"""The dependency walk's two loops compiled to machine code (numba), for the layout search.

:func:`llmsim.schedules.walk.replay` is a loop of a few float operations a pass; the search
replays deep orders (up to some 440,000 passes: DualPipe on 96 stages with 1,536
micro-batches) tens of thousands of times, where Python's interpreter costs 0.1–0.3 µs a
pass. :func:`replay_ends` is the same loop over the order's rows as an integer array
(:func:`llmsim.schedules.walk.rows_table`) compiled by numba's ``njit`` (no ``fastmath``:
the same IEEE double operations in the same order, so the same numbers bit for bit;
``tests/test_walk_kernel.py``), a few nanoseconds a pass. :func:`wait_rows` is the sweep
of :func:`llmsim.schedules.walk.wait_graph` over integer arrays.

The compiled code is cached next to this file (``cache=True``): the first call after an
install compiles it (a second or two), later processes load it. This module is imported
only where a walk or a wait graph is first made (the search, ``wait_graph``):
``import llmsim`` does not load numba.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numba import njit


def replay_ends(p: int, rows: np.ndarray, durations: Sequence[float], hops: Sequence[float],
                picks: np.ndarray | None = None) -> tuple[list[float], list[float]]:
    """(the ends of the passes ``picks`` (1-based indices; none by default), each stage's
    last end), seconds: :func:`llmsim.schedules.walk.replay` of the order whose
    :func:`~llmsim.schedules.walk.rows_table` is ``rows``, with ``durations[column]`` and
    ``hops[hop]`` (a stage without passes ends at 0.0)."""
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


@njit(cache=True, nogil=True)
def wait_rows(p, chunks, offsets, codes, index_of, lasts,
              gradient_after_weights):  # pragma: no cover - compiled by numba
    """:func:`llmsim.schedules.walk.wait_graph`'s sweep over integer arrays: the order's
    actions stage after stage (``offsets``: each stage's first; ``codes``: stage, kind
    0/1/2 for F/B/W, micro-batch, chunk), each micro-batch's route (``index_of[mb,
    chunks·s + c]``: the virtual stage k of (s, c), −1 off the route; ``lasts[mb]``: its
    last k). A produced output (kind F 0, B 1, input gradient 2; micro-batch; virtual
    stage) is the slot ``(kind·m + mb)·width + k`` of flat tables.

    Returns (status, where, rows, senders, which): status 0 with each pass's
    :data:`~llmsim.schedules.walk.Row`, its sender's stage and its action's index;
    1 (an action listed on another stage) or 2 (a chunk off its micro-batch's route)
    with that action's index in ``where``; 3 (the order cannot finish) with each stuck
    stage's next action's index."""
    m = index_of.shape[0]
    width = 1 + lasts.max() if m else 1
    n = codes.shape[0]
    grads = 2 * m * width  # the input gradients' first slot
    produced = np.zeros(3 * m * width, dtype=np.int64)  # the pass's number, 0: not run
    sender_of = np.zeros(3 * m * width, dtype=np.int64)
    rows = np.zeros((n, 4), dtype=np.int64)
    senders = np.zeros(n, dtype=np.int64)
    which = np.zeros(n, dtype=np.int64)
    position = offsets[:p].copy()
    count = 0
    progress = True
    while progress:
        progress = False
        for s in range(p):
            at = position[s]
            start = at
            end = offsets[s + 1]
            first = chunks * s
            while at < end:
                if codes[at, 0] != s:
                    return 1, np.array([at]), rows, senders, which
                kind = codes[at, 1]
                mb = codes[at, 2]
                c = codes[at, 3]
                k = index_of[mb, first + c]
                if k < 0:
                    return 2, np.array([at]), rows, senders, which
                own_f = mb * width + k
                column = 3 * (first + c)
                if kind == 0:  # after the F of the previous virtual stage
                    if k:
                        j = produced[own_f - 1]
                        if not j:
                            break
                        sender = sender_of[own_f - 1]
                        hop = 0 if sender == s else (s if sender == s - 1 else 1 + p + sender)
                    else:
                        j, sender, hop = 0, s, 0
                    produced[own_f] = count + 1
                    sender_of[own_f] = s
                elif kind == 1:  # after the next one's input gradient, and its own F
                    column += 1
                    if k < lasts[mb]:
                        if not produced[own_f]:
                            break
                        j = produced[grads + own_f + 1]
                        if not j:
                            break
                        sender = sender_of[grads + own_f + 1]
                        hop = 0 if sender == s else (s if sender == s - 1 else 1 + p + sender)
                    else:
                        j, sender, hop = produced[own_f], sender_of[own_f], 0
                        if not j:
                            break
                    slot = m * width + own_f  # its W waits for it
                    produced[slot] = count + 1
                    sender_of[slot] = s
                    if not gradient_after_weights:  # the input gradient may leave
                        produced[grads + own_f] = count + 1
                        sender_of[grads + own_f] = s
                else:  # W after its own B
                    column += 2
                    j = produced[m * width + own_f]
                    if not j:
                        break
                    sender, hop = sender_of[m * width + own_f], 0
                    if gradient_after_weights:
                        produced[grads + own_f] = count + 1
                        sender_of[grads + own_f] = s
                rows[count, 0] = s
                rows[count, 1] = column
                rows[count, 2] = j
                rows[count, 3] = hop
                senders[count] = sender
                which[count] = at
                count += 1
                at += 1
            if at != start:
                position[s] = at
                progress = True
    stuck = [position[s] for s in range(p) if position[s] < offsets[s + 1]]
    if stuck:
        return 3, np.array(stuck, dtype=np.int64), rows, senders, which
    return 0, np.zeros(0, dtype=np.int64), rows, senders, which
