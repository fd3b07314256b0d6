"""The greedy list scheduler of ZB-V and ZB-H2 compiled to machine code (numba).

:func:`llmsim.schedules.orders.greedy_order` turns the route and the memory limit into
integer arrays and calls :func:`greedy_passes`, which runs the scheduler's rule event by
event — whenever a stage is free it starts the B whose input gradient is in (the earliest
forward first), else the lowest ready F the memory limit allows, else its oldest W — and
returns every pass as it starts, with the pass it waits for (its wait graph). The search
builds these orders for every (p, m) of ZB-V and ZB-H2 in its space, up to some 220,000
passes each, where the same loop in Python cost 0.2–0.3 µs a pass.

Imported only where an order is built (``greedy_order``): ``import llmsim`` does not load
numba. The compiled code is cached next to this file (``cache=True``).
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def _push(heap, size, row, key):  # pragma: no cover - compiled by numba
    """Push ``key`` on the binary min-heap ``heap[row, :size[row]]``."""
    i = size[row]
    size[row] = i + 1
    while i:
        parent = (i - 1) >> 1
        if heap[row, parent] <= key:
            break
        heap[row, i] = heap[row, parent]
        i = parent
    heap[row, i] = key


@njit(cache=True, nogil=True)
def _pop(heap, size, row):  # pragma: no cover - compiled by numba
    """Pop the smallest key of the heap ``heap[row, :size[row]]``."""
    top = heap[row, 0]
    n = size[row] - 1
    size[row] = n
    last = heap[row, n]
    i = 0
    while True:
        child = 2 * i + 1
        if child >= n:
            break
        if child + 1 < n and heap[row, child + 1] < heap[row, child]:
            child += 1
        if heap[row, child] >= last:
            break
        heap[row, i] = heap[row, child]
        i = child
    if n:
        heap[row, i] = last
    return top


@njit(cache=True, nogil=True)
def greedy_passes(stages, path_s, path_c, path_len, cap, fused, f_time, b_time,
                  w_time):  # pragma: no cover - compiled by numba
    """Every pass of the greedy order in the order they start: (status, passes) with
    ``passes[n] = (stage, kind 0/1/2 for F/B/W, micro-batch, chunk, duration column,
    the 1-based pass it waits for or 0, hop)``, the last three being its
    :data:`~llmsim.schedules.walk.Row`'s. Status 1: no stage can move (the memory limit
    is too low). ``path_s[mb, k]``, ``path_c[mb, k]``: micro-batch mb's k-th virtual
    stage; ``cap``: the forwards a stage may hold over all its chunks."""
    m, span = path_s.shape
    chunks = 1 + path_c.max() if m else 1
    total_passes = 3 * path_len.sum()
    out = np.zeros((total_passes, 7), dtype=np.int64)
    slots = m * span  # a (mb, k) as mb·span + k
    # ready forwards per (stage, chunk): heaps of mb·span + k (lowest micro-batch, then k)
    ready_f = np.zeros((stages * chunks, max(m, 1)), dtype=np.int64)
    f_size = np.zeros(stages * chunks, dtype=np.int64)
    # ready backwards per stage: heaps of (its F's forward count)·slots + mb·span + k
    ready_b = np.zeros((stages, max(m * chunks, 1)), dtype=np.int64)
    b_size = np.zeros(stages, dtype=np.int64)
    # pending weight passes per stage, first in first out: mb·span + k
    weights = np.zeros((stages, max(m * chunks, 1)), dtype=np.int64)
    w_head = np.zeros(stages, dtype=np.int64)
    w_tail = np.zeros(stages, dtype=np.int64)
    total = np.zeros(stages, dtype=np.int64)  # forwards held over all chunks
    forwards_run = np.zeros(stages, dtype=np.int64)
    order_of = np.zeros(max(slots, 1), dtype=np.int64)
    f_number = np.zeros(max(slots, 1), dtype=np.int64)
    b_number = np.zeros(max(slots, 1), dtype=np.int64)
    free_at = np.zeros(stages, dtype=np.int64)
    ring = 2 * max(f_time, max(b_time, w_time)) + 1
    ending = np.zeros((ring, stages), dtype=np.int64)  # kind·slots + mb·span + k
    n_ending = np.zeros(ring, dtype=np.int64)
    freeing = np.zeros((ring, stages), dtype=np.int64)
    n_freeing = np.zeros(ring, dtype=np.int64)
    ended = np.zeros(stages, dtype=np.int64)
    n_ended = 0
    awake = np.ones(stages, dtype=np.bool_)
    pending = 0
    for mb in range(m):
        _push(ready_f, f_size, path_s[mb, 0] * chunks + path_c[mb, 0], mb * span)
    left = total_passes
    now = 0
    number = 0
    while left:
        for e in range(n_ended):  # what has ended makes its successors ready
            kind, rest = divmod(ended[e], slots)
            mb, k = divmod(rest, span)
            if kind == 0 and k + 1 < path_len[mb]:
                s = path_s[mb, k + 1]
                _push(ready_f, f_size, s * chunks + path_c[mb, k + 1], mb * span + k + 1)
            elif kind == 0 or k > 0:
                j = k if kind == 0 else k - 1
                s = path_s[mb, j]
                _push(ready_b, b_size, s, order_of[mb * span + j] * slots + mb * span + j)
            else:
                continue
            awake[s] = True
        for s in range(stages):
            if not awake[s] or free_at[s] > now:
                continue
            if b_size[s]:
                rest = _pop(ready_b, b_size, s) % slots
                mb, k = divmod(rest, span)
                c = path_c[mb, k]
                kind, end = 1, now + b_time
                own = mb * span + k
                if k + 1 < path_len[mb]:  # after the next one's B, or (last) its own F
                    j, sender = b_number[own + 1], path_s[mb, k + 1]
                else:
                    j, sender = f_number[own], s
                hop = 0 if sender == s else (1 + sender if sender == s - 1
                                             else 1 + stages + sender)
                out[number] = (s, 1, mb, c, 3 * (chunks * s + c) + 1, j, hop)
                number += 1
                b_number[own] = number
                if fused:
                    out[number] = (s, 2, mb, c, 3 * (chunks * s + c) + 2, number, 0)
                    number += 1
                    left -= 1
                    total[s] -= 1
                else:
                    weights[s, w_tail[s]] = own
                    w_tail[s] += 1
            else:
                best, best_c = -1, -1
                if total[s] < cap:
                    for c in range(chunks):
                        row = s * chunks + c
                        if f_size[row] and (best < 0 or ready_f[row, 0] < best):
                            best, best_c = ready_f[row, 0], c
                if best >= 0:
                    c = best_c
                    _pop(ready_f, f_size, s * chunks + c)
                    mb, k = divmod(best, span)
                    own = mb * span + k
                    if k:  # after the previous virtual stage's F
                        j, sender = f_number[own - 1], path_s[mb, k - 1]
                    else:
                        j, sender = 0, s
                    hop = 0 if sender == s else (1 + sender if sender == s - 1
                                                 else 1 + stages + sender)
                    out[number] = (s, 0, mb, c, 3 * (chunks * s + c), j, hop)
                    number += 1
                    f_number[own] = number
                    total[s] += 1
                    order_of[own] = forwards_run[s]
                    forwards_run[s] += 1
                    kind, end = 0, now + f_time
                else:
                    if w_head[s] == w_tail[s]:
                        continue  # idle until a pass fills its queues
                    own = weights[s, w_head[s]]
                    w_head[s] += 1
                    mb, k = divmod(own, span)
                    c = path_c[mb, k]
                    out[number] = (s, 2, mb, c, 3 * (chunks * s + c) + 2, b_number[own], 0)
                    number += 1
                    total[s] -= 1
                    kind, end = 2, now + w_time
            left -= 1
            free = end + w_time if kind == 1 and fused else end
            free_at[s] = free
            if kind != 2:
                slot = end % ring
                ending[slot, n_ending[slot]] = kind * slots + mb * span + k
                n_ending[slot] += 1
                pending += 1
            slot = free % ring
            freeing[slot, n_freeing[slot]] = s
            n_freeing[slot] += 1
            pending += 1
        if not left:
            break
        if not pending:
            return 1, out[:number]
        now += 1
        while not (n_freeing[now % ring] or n_ending[now % ring]):
            now += 1
        slot = now % ring
        n_ended = n_ending[slot]
        ended[:n_ended] = ending[slot, :n_ended]
        awake[:] = False
        for i in range(n_freeing[slot]):
            awake[freeing[slot, i]] = True
        pending -= n_ended + n_freeing[slot]
        n_ending[slot] = 0
        n_freeing[slot] = 0
    return 0, out[:number]
