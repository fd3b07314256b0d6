"""The reference timing of a schedule: fixed pass durations, free communication.

:func:`unit_timeline` is a small model used to print a schedule as a grid and to check
the bubble closed forms in the tests; predictions are the engine's job.
"""

from __future__ import annotations

from llmsim.schedules.action import Action
from llmsim.schedules.registry import route_of
from llmsim.schedules.route import Hop, Route

Timeline = list[list[tuple[float, float, Action]]]
"""Per stage, ``(start, end, action)`` in the stage's order."""


class _Positions:
    """Virtual stage of (micro-batch, stage, chunk) along a route, memoised per route."""

    def __init__(self, route: Route) -> None:
        self.route = route
        self.cache: dict[tuple[Hop, ...], dict[Hop, int]] = {}

    def hops(self, mb: int) -> tuple[tuple[Hop, ...], dict[Hop, int]]:
        hops = self.route(mb)
        index = self.cache.get(hops)
        if index is None:
            index = self.cache[hops] = {hop: k for k, hop in enumerate(hops)}
        return hops, index


def _dependencies(action: Action, positions: _Positions) -> list[Action]:
    """The actions on other stages (or same-stage B for W) that must finish first."""
    s, mb, c = action.stage, action.microbatch, action.chunk
    if action.kind == "W":
        return [Action(s, "B", mb, c)]
    hops, index = positions.hops(mb)
    k = index[(s, c)]
    if action.kind == "F":
        return [Action(hops[k - 1][0], "F", mb, hops[k - 1][1])] if k > 0 else []
    if k < len(hops) - 1:
        return [Action(hops[k + 1][0], "B", mb, hops[k + 1][1]), Action(s, "F", mb, c)]
    return [Action(s, "F", mb, c)]


def unit_timeline(schedule: list[list[Action]], f: float = 1.0, b: float = 1.0,
                  w: float = 1.0) -> Timeline:
    """Start and end of every action with fixed pass durations and free communication.

    Each stage runs its actions in order; an action starts when its stage is free and
    its dependencies are done: F needs F of the previous virtual stage on its
    micro-batch's route, B needs B of the next virtual stage (the last virtual stage's B
    needs its own F), W needs the same stage's B. ``f``, ``b``, ``w`` are the durations
    of one pass of one chunk (any unit). Raises ValueError if the schedule cannot finish
    (a missing action or a deadlock).
    """
    stages = len(schedule)
    positions = _Positions(route_of(schedule))
    duration = {"F": f, "B": b, "W": w}
    end: dict[Action, float] = {}
    timeline: Timeline = [[] for _ in schedule]
    # Integer zero keeps the arithmetic exact when the durations are Fractions.
    free: list[float] = [0] * stages
    position = [0] * stages
    progress = True
    while progress:
        progress = False
        for s, row in enumerate(schedule):
            while position[s] < len(row):
                action = row[position[s]]
                if action.stage != s:
                    raise ValueError(f"action {action} is listed on stage {s}")
                deps = _dependencies(action, positions)
                if any(d not in end for d in deps):
                    break
                start = max([free[s], *(end[d] for d in deps)])
                free[s] = end[action] = start + duration[action.kind]
                timeline[s].append((start, free[s], action))
                position[s] += 1
                progress = True
    stuck = [str(row[position[s]]) for s, row in enumerate(schedule) if position[s] < len(row)]
    if stuck:
        raise ValueError(f"schedule cannot finish: stages wait forever at {', '.join(stuck)}")
    return timeline


def idle_fractions(timeline: Timeline) -> list[float]:
    """Per stage, (step time − busy time) / step time; step time = last end of any stage.

    With equal stages and the backward timed as one block (``b = 2f, w = 0``) this is the
    bubble fraction of Narayanan et al. 2021 §2.2: (p−1)/(m+p−1) for GPipe and 1F1B,
    (p−1)/(v·m+p−1) for interleaved 1F1B.
    """
    step = max((end for row in timeline for _, end, _ in row), default=0.0)
    if step == 0:
        return [0.0 for _ in timeline]
    return [(step - sum(end - start for start, end, _ in row)) / step for row in timeline]


def peak_in_flight(schedule: list[list[Action]]) -> list[int]:
    """Per stage, the most micro-batch-chunks whose F has run but whose W has not.

    This is the count of activation sets held (design §8): m for GPipe, min(p − i, m) on
    stage i for 1F1B (Narayanan et al. 2021 §2.2), p on every stage for ZB-H1 (Qi et al.
    2024 §2.3, where the last stages hold W's smaller activations for part of them).
    """
    return [sum(chunks_at_peak(row)) for row in schedule]


def chunks_at_peak(row: list[Action]) -> list[int]:
    """Per chunk, the micro-batches a stage holds at its first peak (:func:`peak_in_flight`):
    ``max(held_per_chunk(row), key=sum)``, counted in one pass."""
    chunks = 1 + max((a.chunk for a in row), default=0)
    held, total = [0] * chunks, 0
    peak, peak_total = list(held), 0
    for action in row:
        if action.kind == "F":
            held[action.chunk] += 1
            total += 1
            if total > peak_total:  # the first of equal peaks, as max() keeps
                peak, peak_total = list(held), total
        elif action.kind == "W":
            held[action.chunk] -= 1
            total -= 1
    return peak


def held_per_chunk(row: list[Action]) -> list[list[int]]:
    """After each action of a stage, per chunk, the micro-batches whose F has run and
    whose W has not."""
    chunks = 1 + max((a.chunk for a in row), default=0)
    held = [0] * chunks
    out = [list(held)]
    for action in row:
        held[action.chunk] += {"F": 1, "B": 0, "W": -1}[action.kind]
        out.append(list(held))
    return out
