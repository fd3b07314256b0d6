"""A schedule printed: the step × stage grid and a table of its actions."""

from __future__ import annotations

from typing import TYPE_CHECKING

from llmsim.schedules.action import Action
from llmsim.schedules.timing import unit_timeline

if TYPE_CHECKING:
    import pandas as pd


def format_grid(schedule: list[list[Action]]) -> str:
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
    schedule: list[list[Action]], f: float = 1.0, b: float = 1.0, w: float = 1.0
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
