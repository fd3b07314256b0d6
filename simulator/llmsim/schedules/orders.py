"""Building blocks of the schedules' action orders, shared by their modules."""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable

from llmsim.errors import UserError
from llmsim.schedules.action import Action, Kind
from llmsim.schedules.action_table import actions
from llmsim.schedules.route import Route
from llmsim.schedules.walk import Row


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
    run after the last action, in micro-batch order. The actions are the shared ones of
    :func:`~llmsim.schedules.action_table.actions` (equal values, made once).
    """
    m = 1 + max((mb for _, mb in order), default=-1)
    made = {kind: actions(stage, kind, 0, m) for kind in ("F", "B", "W")}  # shared, by mb
    weights = made["W"]
    out: list[Action] = []
    backwards: list[int] = []
    for kind, mb in order:
        out.append(made[kind][mb])
        if kind == "B":
            backwards.append(mb)
            if len(backwards) > lag:
                out.append(weights[backwards[len(backwards) - 1 - lag]])
    out += [weights[mb] for mb in backwards[max(len(backwards) - lag, 0) :]]
    return out


Limit = Callable[[int, int, list[int]], bool]
"""``(stage, chunk, held per chunk)`` → whether the stage may start one more forward of
that chunk (its activation memory)."""


def greedy_order(stages: int, microbatches: int, route: Route, may_forward: Limit | int, *,
                 fused: bool = False,
                 times: tuple[int, int, int] = (1, 1, 1),
                 graph: list[Row] | None = None) -> list[list[Action]]:
    """The per-stage orders a list scheduler makes with fixed pass times ``times``
    (F, B, W; unit times by default, each at least 1) and free communication.

    Whenever a stage is free it starts, first, the B whose input gradient is in (the
    earliest forward first); else the F whose input is in (lowest micro-batch, then
    earliest virtual stage) if ``may_forward`` allows it (an integer: while the stage
    holds fewer forwards than that, over all its chunks); else its oldest pending W.
    With ``fused`` the W runs right after its B (one backward). This is the greedy rule
    of Qi et al. 2024 §3.2 (B before F before W, F bounded by the memory limit) with
    equal pass times, the setting in which their handcrafted schedules are drawn.

    Event-driven: at each time only the stages that have just become free, or whose
    queues a finished pass has just filled, are looked at (a free stage that found
    nothing to run stays idle until a pass fills its queues: its memory limit changes
    only with its own passes), so a build is O(passes · log passes), not O(time · p).
    Within one time the stages decide independently (a choice changes only the stage's
    own queues; what it starts is seen at the pass's end), so in any order.

    ``graph``, a list, receives the order's wait graph as it is scheduled: one
    :data:`~llmsim.schedules.walk.Row` a pass, what
    :func:`~llmsim.schedules.walk.wait_graph` finds for the same order and route (the
    same passes, each waiting for the same pass), numbered as they start here. A pass's
    input ends before it starts (every pass takes at least a unit), so its pass has a
    lower number; a stage's passes come in its order: a valid order for
    :func:`~llmsim.schedules.walk.replay` and the levels, whose floats do not depend on
    which valid order (``tests/test_walked_orders.py``).
    """
    if min(times) < 1:
        raise ValueError(f"greedy_order: pass times {times} must be at least 1 each")
    hops = [route(mb) for mb in range(microbatches)]
    chunks = 1 + max(c for path in hops for _, c in path)
    span = max(len(path) for path in hops)
    f_time, b_time, w_time = times
    cap = may_forward if isinstance(may_forward, int) else None
    rows: list[list[Action]] = [[] for _ in range(stages)]
    held = [[0] * chunks for _ in range(stages)]
    total = [0] * stages  # forwards held over all chunks
    # Per stage and chunk, its actions by micro-batch (F, B, W).
    table = [[(actions(s, "F", c, microbatches), actions(s, "B", c, microbatches),
               actions(s, "W", c, microbatches)) for c in range(chunks)]
             for s in range(stages)]
    # Per stage: ready forwards per chunk (heap of (mb, k)), ready backwards (heap of
    # (the stage's forward count when its F ran, mb, chunk, k)), pending weight passes.
    ready_f: list[list[list[tuple[int, int]]]] = [[[] for _ in range(chunks)]
                                                   for _ in range(stages)]
    ready_b: list[list[tuple[int, int, int, int]]] = [[] for _ in range(stages)]
    weights: list[deque[tuple[Action, int]]] = [deque() for _ in range(stages)]  # (W, mb·span + k)
    order_of = [0] * (microbatches * span)  # mb·span + k → its stage's forward count
    # for ``graph``: mb·span + k → the 1-based number of its F, of its B
    f_number = [0] * (microbatches * span)
    b_number = [0] * (microbatches * span)
    rows_of = graph.append if graph is not None else None
    number = 0
    forwards_run = [0] * stages
    # By time, modulo ``ring`` (no pass ends further ahead): the passes ending then
    # (kind, mb, k) and the stages free again then; the order within a time does not
    # matter (each fills a queue; the queues are heaps).
    ring = 2 * max(times) + 1
    ending: list[list[tuple[str, int, int]]] = [[] for _ in range(ring)]
    freeing: list[list[int]] = [[] for _ in range(ring)]
    pending = 0  # entries in ``ending`` and ``freeing``
    free_at = [0] * stages
    push, pop = heapq.heappush, heapq.heappop
    for mb, path in enumerate(hops):
        push(ready_f[path[0][0]][path[0][1]], (mb, 0))
    left = 3 * sum(len(path) for path in hops)
    now = 0
    awake = set(range(stages))  # the free stages that may start a pass now
    ended: list[tuple[str, int, int]] = []
    while left:
        for kind, mb, k in ended:  # what has ended makes its successors ready
            path = hops[mb]
            if kind == "F" and k + 1 < len(path):
                s, c = path[k + 1]
                push(ready_f[s][c], (mb, k + 1))
            elif kind == "F" or k > 0:
                j = k if kind == "F" else k - 1
                s, c = path[j]
                push(ready_b[s], (order_of[mb * span + j], mb, c, j))
            else:
                continue
            awake.add(s)
        for s in awake:
            if free_at[s] > now:
                continue
            row = rows[s]
            if ready_b[s]:
                _, mb, c, k = pop(ready_b[s])
                kind, end = "B", now + b_time
                _, backward, weight = table[s][c]
                row.append(backward[mb])
                own = mb * span + k
                if rows_of is not None:  # after the next one's B, or (last) its own F
                    path = hops[mb]
                    if k + 1 < len(path):
                        j, sender = b_number[own + 1], path[k + 1][0]
                    else:
                        j, sender = f_number[own], s
                    number += 1
                    b_number[own] = number
                    rows_of((s, 3 * (chunks * s + c) + 1, j,
                             0 if sender == s else 1 + sender if sender == s - 1
                             else 1 + stages + sender))
                if fused:
                    row.append(weight[mb])
                    left -= 1
                    held[s][c] -= 1
                    total[s] -= 1
                    if rows_of is not None:
                        number += 1
                        rows_of((s, 3 * (chunks * s + c) + 2, number - 1, 0))
                else:
                    weights[s].append((weight[mb], own))
            else:
                kind = ""
                queues = ready_f[s]
                if cap is None:
                    head = next((h for h in sorted((queue[0], c) for c, queue in
                                                   enumerate(queues) if queue)
                                 if may_forward(s, h[1], held[s])), None)
                elif total[s] >= cap:
                    head = None
                elif chunks == 1:
                    head = (queues[0][0], 0) if queues[0] else None
                elif chunks == 2:  # ZB-V: the min below, without a generator
                    first, second = queues
                    if first and second:
                        head = (first[0], 0) if first[0] <= second[0] else (second[0], 1)
                    else:
                        head = (first[0], 0) if first else (second[0], 1) if second else None
                else:
                    head = min(((queue[0], c) for c, queue in enumerate(queues) if queue),
                               default=None)
                if head is not None:
                    (mb, k), c = head
                    pop(queues[c])
                    row.append(table[s][c][0][mb])
                    if rows_of is not None:  # after the previous virtual stage's F
                        own = mb * span + k
                        if k:
                            j, sender = f_number[own - 1], hops[mb][k - 1][0]
                        else:
                            j, sender = 0, s
                        number += 1
                        f_number[own] = number
                        rows_of((s, 3 * (chunks * s + c), j,
                                 0 if sender == s else 1 + sender if sender == s - 1
                                 else 1 + stages + sender))
                    held[s][c] += 1
                    total[s] += 1
                    order_of[mb * span + k] = forwards_run[s]
                    forwards_run[s] += 1
                    kind, end = "F", now + f_time
                else:
                    if not weights[s]:
                        continue  # idle until a pass fills its queues
                    weight, own = weights[s].popleft()
                    row.append(weight)
                    held[s][weight.chunk] -= 1
                    if rows_of is not None:  # after its own B
                        number += 1
                        rows_of((s, 3 * (chunks * s + weight.chunk) + 2, b_number[own], 0))
                    total[s] -= 1
                    kind, end = "W", now + w_time
            left -= 1
            free_at[s] = free = end + w_time if kind == "B" and fused else end
            if kind != "W":
                ending[end % ring].append((kind, mb, k))
                pending += 1
            freeing[free % ring].append(s)
            pending += 1
        if not pending:
            raise ValueError("greedy_order: no stage can move (the memory limit is too low)")
        now += 1
        while not (freeing[now % ring] or ending[now % ring]):
            now += 1
        slot = now % ring
        ended, freed = ending[slot], freeing[slot]
        ending[slot], freeing[slot] = [], []
        pending -= len(ended) + len(freed)
        awake = set(freed)
    return rows


def greedy_walked(stages: int, microbatches: int, route: Route,
                  limit: int) -> tuple[list[list[Action]], tuple[Row, ...]]:
    """:func:`greedy_order`'s order (unit pass times, an integer memory limit) with its
    wait graph's rows, made as it is scheduled (its ``graph``)."""
    graph: list[Row] = []
    return greedy_order(stages, microbatches, route, limit, graph=graph), tuple(graph)
