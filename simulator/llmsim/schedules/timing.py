"""The reference timing of a schedule: fixed pass durations, free communication.

:func:`unit_timeline` is a small model used to print a schedule as a grid and to check
the bubble closed forms in the tests; predictions are the engine's job.
"""

from __future__ import annotations

from llmsim.schedules.action import Action
from llmsim.schedules.registry import route_of
from llmsim.schedules.walk import replay, wait_graph

Timeline = list[list[tuple[float, float, Action]]]
"""Per stage, ``(start, end, action)`` in the stage's order."""


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
    graph = wait_graph(schedule, route_of(schedule))
    rows = graph.rows()
    duration = {"F": f, "B": b, "W": w}
    durations = [duration[kind] for _ in range(graph.p * graph.chunks) for kind in "FBW"]
    # Integer zero keeps the arithmetic exact when the durations are Fractions.
    end, _ = replay(graph.p, rows, durations, [0] * (1 + 2 * graph.p))
    timeline: Timeline = [[] for _ in schedule]
    for k, ((s, _, j, _), action) in enumerate(zip(rows, graph.actions, strict=True), start=1):
        previous = timeline[s][-1][1] if timeline[s] else 0
        timeline[s].append((max(previous, end[j]), end[k], action))
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
