"""Pipeline schedules: which passes each stage runs, and in which order (design §5).

A schedule is a pure function ``(stages p, micro-batches m, chunks v)`` → per stage the
ordered list of :class:`Action` values that stage runs; it is registered by name in
:data:`SCHEDULES` and built with :func:`build`. Every schedule emits the backward as two
passes, ``B`` (input gradient, on the critical path between stages) and ``W`` (weight
gradient, local), as in Qi et al. 2024 §1. Schedules with a fused backward emit each
``W`` right after its ``B``; the engine runs the two back to back.

Timing is the engine's job. :func:`unit_timeline` is a small reference model (no
communication cost, fixed F/B/W durations) used to print a schedule as a grid and to
check the closed forms of the bubble in the tests.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from llmsim.errors import UserError

if TYPE_CHECKING:
    import pandas as pd

Kind = Literal["F", "B", "W"]


@dataclass(frozen=True, slots=True)
class Action:
    """One pass of one micro-batch through one model chunk on one pipeline stage.

    ``F`` is the forward, ``B`` the backward for the input gradient, ``W`` the backward
    for the weight gradient. Stage ``s`` holds chunks ``0..v-1``; chunk ``c`` on stage
    ``s`` is virtual stage ``c·p + s`` (Narayanan et al. 2021 §2.2).
    """

    stage: int
    kind: Kind
    microbatch: int
    chunk: int = 0

    def __str__(self) -> str:
        """Compact form as in torchtitan: ``2F0`` = stage 2, forward, micro-batch 0.

        A chunk other than 0 is appended (``2F0c1``); :func:`format_grid` also shows
        chunk 0 when the schedule has several chunks.
        """
        suffix = f"c{self.chunk}" if self.chunk else ""
        return f"{self.stage}{self.kind}{self.microbatch}{suffix}"

    def cell(self, show_chunk: bool) -> str:
        """The action without its stage (``F3``, ``B3c1``), for a per-stage grid row."""
        suffix = f"c{self.chunk}" if show_chunk else ""
        return f"{self.kind}{self.microbatch}{suffix}"


Schedule = list[list[Action]]
"""Per stage, the ordered actions that stage runs."""
ScheduleFn = Callable[[int, int, int], Schedule]
"""``(stages, microbatches, chunks) → Schedule``; raises UserError on a bad combination."""
Timeline = list[list[tuple[float, float, Action]]]
"""Per stage, ``(start, end, action)`` in the stage's order."""

SCHEDULES: dict[str, ScheduleFn] = {}
"""Registered schedules by name."""
SPLIT_BACKWARD: set[str] = set()
"""Schedules whose B and W are separate passes: the input gradient is sent to the previous
stage right after B. The others run B and W as one fused backward (PyTorch autograd), so
the gradient leaves the stage only after W."""


def register(name: str, *, split_backward: bool = False) -> Callable[[ScheduleFn], ScheduleFn]:
    """Decorator: ``@register("1f1b")`` adds the function below it to SCHEDULES."""

    def decorator(fn: ScheduleFn) -> ScheduleFn:
        if name in SCHEDULES:
            raise ValueError(f"schedule {name!r} is registered twice")
        SCHEDULES[name] = fn
        if split_backward:
            SPLIT_BACKWARD.add(name)
        return fn

    return decorator


def build(name: str, stages: int, microbatches: int, chunks: int = 1) -> Schedule:
    """The per-stage action lists of schedule ``name``; UserError on invalid input."""
    if name not in SCHEDULES:
        raise UserError(
            f"schedule: unknown name {name!r}; use one of {', '.join(sorted(SCHEDULES))}"
        )
    for field, value in (("stages", stages), ("microbatches", microbatches), ("chunks", chunks)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UserError(f"{field}: {value!r} is not allowed; give a whole number ≥ 1")
    return SCHEDULES[name](stages, microbatches, chunks)


# ---------------------------------------------------------------- schedule helpers


def _require_one_chunk(name: str, chunks: int) -> None:
    if chunks != 1:
        raise UserError(
            f"chunks (virtual stages): {chunks} needs schedule interleaved-1f1b, not {name}; "
            "set chunks to 1 or use interleaved-1f1b"
        )


def _one_f_one_b_order(stages: int, microbatches: int, stage: int) -> list[tuple[Kind, int]]:
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


def _with_weight_passes(stage: int, order: list[tuple[Kind, int]], lag: int) -> list[Action]:
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


# ---------------------------------------------------------------- the schedules


@register("gpipe")
def gpipe(stages: int, microbatches: int, chunks: int) -> Schedule:
    """All forwards, then all backwards in micro-batch order (Huang et al. 2019 §2.2).

    The backward order follows torchtitan's ``ScheduleGPipe``; with equal stage times
    the bubble is (p−1)/(m+p−1) either way.
    """
    _require_one_chunk("gpipe", chunks)
    order: list[tuple[Kind, int]] = [("F", k) for k in range(microbatches)]
    order += [("B", k) for k in range(microbatches)]
    return [_with_weight_passes(s, order, lag=0) for s in range(stages)]


@register("1f1b")
def one_f_one_b(stages: int, microbatches: int, chunks: int) -> Schedule:
    """PipeDream-Flush 1F1B (Narayanan et al. 2021 §2.2), W fused after each B."""
    _require_one_chunk("1f1b", chunks)
    return [
        _with_weight_passes(s, _one_f_one_b_order(stages, microbatches, s), lag=0)
        for s in range(stages)
    ]


@register("zb-h1", split_backward=True)
def zb_h1(stages: int, microbatches: int, chunks: int) -> Schedule:
    """Zero Bubble ZB-H1 (Qi et al. 2024 §2.1, Fig. 3 top; Table 2).

    F and B follow 1F1B; stage ``i`` postpones its W passes by ``i`` micro-batches, so the
    steady state on stage ``i`` is ``F(x) B(x−p+1+i) W(x−p+1)`` and the last ``i`` W passes
    fill the cool-down. Every stage then holds p micro-batches whose W is pending, the
    same peak as stage 0 of 1F1B, and the bubble is (p−1)(T_F+T_B−T_W).
    """
    _require_one_chunk("zb-h1", chunks)
    return [
        _with_weight_passes(s, _one_f_one_b_order(stages, microbatches, s), lag=s)
        for s in range(stages)
    ]


@register("interleaved-1f1b")
def interleaved_1f1b(stages: int, microbatches: int, chunks: int) -> Schedule:
    """Interleaved 1F1B (Narayanan et al. 2021 §2.2, Fig. 4 bottom), Megatron-LM's order.

    Work item ``k`` of a stage (``k < v·m``) is micro-batch ``⌊k/(p·v)⌋·p + k mod p`` in
    forward chunk ``⌊(k mod p·v)/p⌋`` (backwards visit the chunks in reverse). Stage ``s``
    runs ``2(p−s−1) + (v−1)·p`` warm-up forwards (all ``v·m`` when ``m = p``), then one
    forward and one backward alternately, then the outstanding backwards — as in
    ``forward_backward_pipelining_with_interleaving`` of Megatron-LM.
    """
    if chunks < 2:
        raise UserError(
            f"chunks (virtual stages): {chunks} with schedule interleaved-1f1b; "
            "set chunks to 2 or more, or use schedule 1f1b"
        )
    if microbatches % stages:
        raise UserError(
            f"microbatches: {microbatches} is not divisible by stages ({stages}), which "
            "interleaved-1f1b needs (Megatron-LM's rule); change the number of micro-batches"
        )
    total = microbatches * chunks
    group = stages * chunks

    def action(stage: int, kind: Kind, k: int) -> Action:
        chunk = (k % group) // stages
        if kind == "B":
            chunk = chunks - 1 - chunk
        return Action(stage, kind, (k // group) * stages + k % stages, chunk)

    schedule: Schedule = []
    for s in range(stages):
        if microbatches == stages:
            warmup = total
        else:
            warmup = min(2 * (stages - s - 1) + (chunks - 1) * stages, total)
        actions = [action(s, "F", k) for k in range(warmup)]
        for k in range(total):
            if k + warmup < total:
                actions.append(action(s, "F", k + warmup))
            backward = action(s, "B", k)
            actions += [backward, Action(s, "W", backward.microbatch, backward.chunk)]
        schedule.append(actions)
    return schedule


# ---------------------------------------------------------------- gradient reductions


def aligned_grad_syncs(actions: list[Action], stage: int, stages: int, chunks: int,
                       microbatches: int) -> dict[int, list[int]] | None:
    """Where Megatron-Core issues each chunk's whole gradient reduction on a pipeline
    with ``grad_sync_func`` (``--delay-grad-reduce``, on by default from Megatron-LM's
    commit 299d8a5 of September 2023; ``--align-grad-reduce`` from August 2024):
    index of the action of ``stage`` after which it is issued → chunks, in order.
    None: the stage issues each bucket as the backward makes it final (its hooks).

    Interleaved (``forward_backward_pipelining_with_interleaving``): after backward step
    ``k`` of a stage, the chunk whose last micro-batch was backward step ``k − stage``;
    the chunks left when the backward steps run out after the last one, by chunk id, so
    that all stages issue a chunk's reduction about together. 1F1B
    (``forward_backward_pipelining_without_interleaving``): the first stage through its
    hooks in its last backward, the others after their last backward ("during pipeline
    bubble"). A backward step (fused, as in both) ends with its ``W`` pass. Without a
    pipeline the hooks issue every bucket.
    """
    if stages == 1 or (chunks == 1 and stage == 0):
        return None
    ends = [i for i, a in enumerate(actions) if a.kind == "W"]
    if chunks == 1:
        return {ends[-1]: [0]}
    last = {a.chunk: step for step, i in enumerate(ends)
            if (a := actions[i]).microbatch == microbatches - 1}
    out: dict[int, list[int]] = {}
    for chunk in sorted(last, key=lambda c: last[c]):
        if last[chunk] + stage < len(ends):
            out.setdefault(ends[last[chunk] + stage], []).append(chunk)
    issued = {c for chunks_at in out.values() for c in chunks_at}
    out.setdefault(ends[-1], []).extend(c for c in range(chunks) if c not in issued)
    return out


# ---------------------------------------------------------------- reference timing


def _dependencies(action: Action, stages: int, chunks: int) -> list[Action]:
    """The actions on other stages (or same-stage B for W) that must finish first."""
    s, mb, c = action.stage, action.microbatch, action.chunk
    if action.kind == "W":
        return [Action(s, "B", mb, c)]
    if action.kind == "F":
        if s > 0:
            return [Action(s - 1, "F", mb, c)]
        return [Action(stages - 1, "F", mb, c - 1)] if c > 0 else []
    if s < stages - 1:
        return [Action(s + 1, "B", mb, c), Action(s, "F", mb, c)]
    if c < chunks - 1:
        return [Action(0, "B", mb, c + 1), Action(s, "F", mb, c)]
    return [Action(s, "F", mb, c)]


def unit_timeline(schedule: Schedule, f: float = 1.0, b: float = 1.0, w: float = 1.0) -> Timeline:
    """Start and end of every action with fixed pass durations and free communication.

    Each stage runs its actions in order; an action starts when its stage is free and
    its dependencies are done: F needs F of the previous virtual stage, B needs B of the
    next virtual stage (the last virtual stage's B needs its own F), W needs the same
    stage's B. ``f``, ``b``, ``w`` are the durations of one pass of one chunk (any unit).
    Raises ValueError if the schedule cannot finish (a missing action or a deadlock).
    """
    stages = len(schedule)
    chunks = 1 + max((a.chunk for row in schedule for a in row), default=0)
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
                deps = _dependencies(action, stages, chunks)
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


def peak_in_flight(schedule: Schedule) -> list[int]:
    """Per stage, the most micro-batch-chunks whose F has run but whose W has not.

    This is the count of activation sets held (design §8): m for GPipe, min(p − i, m) on
    stage i for 1F1B (Narayanan et al. 2021 §2.2), p on every stage for ZB-H1 (Qi et al.
    2024 §2.3, where the last stages hold W's smaller activations for part of them).
    """
    peaks = []
    for row in schedule:
        held = peak = 0
        for action in row:
            held += {"F": 1, "B": 0, "W": -1}[action.kind]
            peak = max(peak, held)
        peaks.append(peak)
    return peaks


# ---------------------------------------------------------------- printing


def format_grid(schedule: Schedule) -> str:
    """The step × stage grid under unit times (F = B = W = 1): one row per stage.

    Each column is one time slot; a cell is ``F3`` / ``B3`` / ``W3`` (``F3c1`` when the
    schedule has several chunks) or ``.`` for idle. The header numbers the slots.
    """
    timeline = unit_timeline(schedule)
    show_chunk = any(a.chunk for row in schedule for a in row)
    slots = int(max((end for row in timeline for _, end, _ in row), default=0.0))
    grid = [["."] * slots for _ in timeline]
    for s, row in enumerate(timeline):
        for start, _, action in row:
            grid[s][int(start)] = action.cell(show_chunk)
    width = max([len(str(max(slots - 1, 0))), *(len(c) for row in grid for c in row)])
    label = len(f"stage {len(grid) - 1}")
    lines = [" " * label + " " + " ".join(f"{t:>{width}}" for t in range(slots))]
    for s, cells in enumerate(grid):
        lines.append(f"{f'stage {s}':<{label}} " + " ".join(f"{c:>{width}}" for c in cells))
    return "\n".join(line.rstrip() for line in lines)


def to_dataframe(
    schedule: Schedule, f: float = 1.0, b: float = 1.0, w: float = 1.0
) -> pd.DataFrame:
    """One row per action: stage, order (position on its stage), kind, microbatch, chunk,
    start, end — times from :func:`unit_timeline` with the given pass durations."""
    # Imported here so that the engine can use schedules without loading pandas.
    import pandas as pd

    rows = [
        {
            "stage": action.stage,
            "order": order,
            "kind": action.kind,
            "microbatch": action.microbatch,
            "chunk": action.chunk,
            "start": start,
            "end": end,
        }
        for row in unit_timeline(schedule, f=f, b=b, w=w)
        for order, (start, end, action) in enumerate(row)
    ]
    columns = ["stage", "order", "kind", "microbatch", "chunk", "start", "end"]
    return pd.DataFrame(rows, columns=columns)
