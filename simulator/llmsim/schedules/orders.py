"""Building blocks of the schedules' action orders, shared by their modules."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from llmsim.errors import UserError
from llmsim.schedules.action import Action, Kind
from llmsim.schedules.route import Hop, Route


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

    Whenever a stage is free it starts, first, the B whose input gradient is
    in (the earliest forward first); else the F whose input is in (lowest micro-batch,
    then earliest virtual stage) if ``may_forward`` allows it; else its oldest pending W.
    With ``fused`` the W runs right after its B (one backward). This is the greedy rule
    of Qi et al. 2024 §3.2 (B before F before W, F bounded by the memory limit) with
    equal pass times, the setting in which their handcrafted schedules are drawn.
    """
    hops = {mb: route(mb) for mb in range(microbatches)}
    index: dict[tuple[Hop, ...], dict[Hop, int]] = {}
    for path in hops.values():
        index.setdefault(path, {hop: k for k, hop in enumerate(path)})
    chunks = 1 + max(c for path in hops.values() for _, c in path)
    # Per stage and chunk, its forwards in micro-batch order: within a chunk they become
    # ready in that order, so only the first of each can be the next one.
    forwards: list[list[deque[tuple[int, int]]]] = [
        [deque() for _ in range(chunks)] for _ in range(stages)]
    for mb, path in hops.items():
        for k, (s, c) in enumerate(path):
            forwards[s][c].append((mb, k))
    done: dict[Action, int] = {}
    rows: list[list[Action]] = [[] for _ in range(stages)]
    held = [[0] * chunks for _ in range(stages)]
    backwards: list[list[Action]] = [[] for _ in range(stages)]
    weights: list[deque[Action]] = [deque() for _ in range(stages)]
    left = 3 * sum(len(path) for path in hops.values())
    now = 0
    duration = dict(zip("FBW", times, strict=True))

    def ready(action: Action) -> bool:
        path = hops[action.microbatch]
        k = index[path][(action.stage, action.chunk)]
        if action.kind == "F":
            if k == 0:
                return True
            before = Action(path[k - 1][0], "F", action.microbatch, path[k - 1][1])
        elif k < len(path) - 1:
            before = Action(path[k + 1][0], "B", action.microbatch, path[k + 1][1])
        else:
            before = Action(action.stage, "F", action.microbatch, action.chunk)
        return done.get(before, now + 1) <= now

    while left:
        moved = False
        for s in range(stages):
            if rows[s] and done[rows[s][-1]] > now:
                moved = True
                continue
            choice = next((a for a in backwards[s] if ready(a)), None)
            if choice is not None:
                backwards[s].remove(choice)
            else:
                heads = sorted((queue[0], c) for c, queue in enumerate(forwards[s]) if queue)
                for (mb, _), c in heads:
                    action = Action(s, "F", mb, c)
                    if may_forward(s, c, held[s]) and ready(action):
                        forwards[s][c].popleft()
                        choice = action
                        held[s][c] += 1
                        backwards[s].append(Action(s, "B", mb, c))
                        break
            if choice is None and weights[s]:
                choice = weights[s].popleft()
            if choice is None:
                continue
            rows[s].append(choice)
            done[choice] = now + duration[choice.kind]
            left -= 1
            moved = True
            if choice.kind == "B":
                weight = Action(s, "W", choice.microbatch, choice.chunk)
                if fused:
                    rows[s].append(weight)
                    done[weight] = now + duration["B"] + duration["W"]
                    held[s][choice.chunk] -= 1
                    left -= 1
                else:
                    weights[s].append(weight)
            elif choice.kind == "W":
                held[s][choice.chunk] -= 1
        if not moved:
            raise ValueError("greedy_order: no stage can move (the memory limit is too low)")
        now = min((t for t in done.values() if t > now), default=now + 1)
    return rows
