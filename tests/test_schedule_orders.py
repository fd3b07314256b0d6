"""The greedy list scheduler of ZB-V and ZB-H2 (:func:`llmsim.schedules.orders.greedy_order`)
against a plain time-stepped one, which looks at every stage at every time: the same
per-stage orders, action for action."""

from __future__ import annotations

import heapq
from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmsim.schedules.action import Action
from llmsim.schedules.orders import greedy_order
from llmsim.schedules.route import looping, v_shape


def stepped_order(stages, microbatches, route, may_forward, fused, times):
    """The rule of :func:`greedy_order` (B whose input gradient is in, earliest forward
    first; else the lowest ready F the memory limit allows; else the oldest W), every
    stage looked at in stage order at every time something ends."""
    hops = [route(mb) for mb in range(microbatches)]
    chunks = 1 + max(c for path in hops for _, c in path)
    duration = dict(zip("FBW", times, strict=True))
    rows = [[] for _ in range(stages)]
    held = [[0] * chunks for _ in range(stages)]
    ready_f = [[[] for _ in range(chunks)] for _ in range(stages)]
    ready_b = [[] for _ in range(stages)]
    weights = [deque() for _ in range(stages)]
    order_of, forwards_run, free_at = {}, [0] * stages, [0] * stages
    events, seq = [], 0
    for mb, path in enumerate(hops):
        heapq.heappush(ready_f[path[0][0]][path[0][1]], (mb, 0))
    left, now = 3 * sum(len(path) for path in hops), 0
    while left:
        while events and events[0][0] <= now:
            _, _, kind, mb, k = heapq.heappop(events)
            path = hops[mb]
            if kind == "F" and k + 1 < len(path):
                heapq.heappush(ready_f[path[k + 1][0]][path[k + 1][1]], (mb, k + 1))
            elif kind == "F" or (kind == "B" and k > 0):
                j = k if kind == "F" else k - 1
                heapq.heappush(ready_b[path[j][0]], (order_of[(mb, j)], mb, path[j][1], j))
        for s in range(stages):
            if free_at[s] > now:
                continue
            choice = None
            if ready_b[s]:
                _, mb, c, k = heapq.heappop(ready_b[s])
                choice = Action(s, "B", mb, c)
            else:
                for (mb, k), c in sorted((q[0], c) for c, q in enumerate(ready_f[s]) if q):
                    if may_forward(s, c, held[s]):
                        heapq.heappop(ready_f[s][c])
                        choice = Action(s, "F", mb, c)
                        held[s][c] += 1
                        order_of[(mb, k)] = forwards_run[s]
                        forwards_run[s] += 1
                        break
            if choice is None and weights[s]:
                choice = weights[s].popleft()
                held[s][choice.chunk] -= 1
            if choice is None:
                continue
            rows[s].append(choice)
            left -= 1
            free_at[s] = now + duration[choice.kind]
            if choice.kind == "B":
                weight = Action(s, "W", choice.microbatch, choice.chunk)
                if fused:
                    rows[s].append(weight)
                    left -= 1
                    held[s][choice.chunk] -= 1
                    free_at[s] += duration["W"]
                else:
                    weights[s].append(weight)
            if choice.kind != "W":
                heapq.heappush(events, (now + duration[choice.kind], seq, choice.kind,
                                        choice.microbatch, k))
                seq += 1
        upcoming = [t for t in free_at if t > now] + ([events[0][0]] if events else [])
        if not upcoming:
            raise ValueError("stuck")
        now = min(upcoming)
    return rows


@settings(max_examples=120, deadline=None)
@given(p=st.integers(1, 9), m=st.integers(1, 30), v=st.booleans(), fused=st.booleans(),
       times=st.tuples(st.integers(1, 3), st.integers(1, 3), st.integers(1, 3)),
       extra=st.integers(0, 6))
def test_the_greedy_order_equals_the_time_stepped_one(p, m, v, fused, times, extra) -> None:
    route, low = (v_shape(p), 2) if v else (looping(p, 1), 1)
    limit = low + extra  # down to the fewest forwards held that let a pipeline move

    def may_forward(s, c, held):
        return sum(held) < limit

    try:
        expected = stepped_order(p, m, route, may_forward, fused, times)
    except ValueError:
        with pytest.raises(ValueError, match="no stage can move"):
            greedy_order(p, m, route, limit, fused=fused, times=times)
        return
    assert greedy_order(p, m, route, limit, fused=fused, times=times) == expected


def test_pass_times_below_one_are_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        greedy_order(2, 2, looping(2, 1), 2, times=(1, 0, 1))
