"""Building blocks of the schedules' action orders, shared by their modules."""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable

from llmsim.errors import UserError
from llmsim.schedules.action import Action, Kind
from llmsim.schedules.route import Route


def require_one_chunk(name: str, chunks: int) -> None:
    """UserError unless ``chunks`` is 1 (a schedule without virtual stages)."""
    if chunks != 1:
        raise UserError(
            f"chunks (virtual stages): {chunks} needs schedule interleaved-1f1b, not {name}; "
            "set chunks to 1 or use interleaved-1f1b"
        )


def one_f_one_b_order(stages: int, microbatches: int, stage: int) -> list[tuple[Kind, int]]:
    """F/B order of PipeDream-Flush (Narayanan et al. 2021 §2.2, Fig. 4 top).

    ``p − stage − 1`` warm-up forwards, then alternate one forward and one backward,
    then the outstanding backwards.
    """
    warmup = min(stages - stage - 1, microbatches)
    order: list[tuple[Kind, int]] = [("F", k) for k in range(warmup)]
    for k in range(microbatches - warmup):
        order += [("F", k + warmup), ("B", k)]
    order += [("B", k) for k in range(microbatches - warmup, microbatches)]
    return order


def with_weight_passes(stage: int, order: list[tuple[Kind, int]], lag: int) -> list[Action]:
    """Insert ``W`` of micro-batch ``j`` right after ``B`` of micro-batch ``j + lag``.

    ``lag = 0`` is the fused backward; the ``W`` passes whose ``B`` partner does not exist
    run after the last action, in micro-batch order.
    """
    actions: list[Action] = []
    backwards: list[int] = []
    for kind, mb in order:
        actions.append(Action(stage, kind, mb))
        if kind == "B":
            backwards.append(mb)
            if len(backwards) > lag:
                actions.append(Action(stage, "W", backwards[len(backwards) - 1 - lag]))
    actions += [Action(stage, "W", mb) for mb in backwards[max(len(backwards) - lag, 0) :]]
    return actions


Limit = Callable[[int, int, list[int]], bool]
"""``(stage, chunk, held per chunk)`` → whether the stage may start one more forward of
that chunk (its activation memory)."""


def greedy_order(stages: int, microbatches: int, route: Route, may_forward: Limit, *,
                 fused: bool = False,
                 times: tuple[int, int, int] = (1, 1, 1)) -> list[list[Action]]:
    """The per-stage orders a list scheduler makes with fixed pass times ``times``
    (F, B, W; unit times by default) and free communication.

    Whenever a stage is free it starts, first, the B whose input gradient is in (the
    earliest forward first); else the F whose input is in (lowest micro-batch, then
    earliest virtual stage) if ``may_forward`` allows it; else its oldest pending W.
    With ``fused`` the W runs right after its B (one backward). This is the greedy rule
    of Qi et al. 2024 §3.2 (B before F before W, F bounded by the memory limit) with
    equal pass times, the setting in which their handcrafted schedules are drawn.
    Event-driven: O(passes · (p + log passes)).
    """
    hops = [route(mb) for mb in range(microbatches)]
    chunks = 1 + max(c for path in hops for _, c in path)
    duration = dict(zip("FBW", times, strict=True))
    rows: list[list[Action]] = [[] for _ in range(stages)]
    held = [[0] * chunks for _ in range(stages)]
    # Per stage: ready forwards per chunk (heap of (mb, k)), ready backwards (heap of
    # (the stage's forward count when its F ran, mb, chunk, k)), pending weight passes.
    ready_f: list[list[list[tuple[int, int]]]] = [[[] for _ in range(chunks)]
                                                   for _ in range(stages)]
    ready_b: list[list[tuple[int, int, int, int]]] = [[] for _ in range(stages)]
    weights: list[deque[Action]] = [deque() for _ in range(stages)]
    order_of: dict[tuple[int, int], int] = {}  # (mb, k) → its stage's forward count
    forwards_run = [0] * stages
    free_at = [0] * stages
    events: list[tuple[int, int, str, int, int]] = []  # (end, seq, kind, mb, k)
    seq = 0
    for mb, path in enumerate(hops):
        heapq.heappush(ready_f[path[0][0]][path[0][1]], (mb, 0))
    left = 3 * sum(len(path) for path in hops)
    now = 0
    while left:
        while events and events[0][0] <= now:  # what has ended makes its successors ready
            _, _, kind, mb, k = heapq.heappop(events)
            path = hops[mb]
            if kind == "F" and k + 1 < len(path):
                heapq.heappush(ready_f[path[k + 1][0]][path[k + 1][1]], (mb, k + 1))
            elif kind == "F" or (kind == "B" and k > 0):
                j = k if kind == "F" else k - 1
                s, c = path[j]
                heapq.heappush(ready_b[s], (order_of[(mb, j)], mb, c, j))
        for s in range(stages):
            if free_at[s] > now:
                continue
            choice: Action | None = None
            if ready_b[s]:
                _, mb, c, k = heapq.heappop(ready_b[s])
                choice = Action(s, "B", mb, c)
            else:
                heads = sorted((queue[0], c) for c, queue in enumerate(ready_f[s]) if queue)
                for (mb, k), c in heads:
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
        upcoming = [t for t in free_at if t > now]
        if events:
            upcoming.append(events[0][0])
        if not upcoming:
            raise ValueError("greedy_order: no stage can move (the memory limit is too low)")
        now = min(upcoming)
    return rows
