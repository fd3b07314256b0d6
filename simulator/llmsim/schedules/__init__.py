"""Pipeline schedules: which passes each stage runs, and in which order (design §5).

A schedule is a pure function ``(stages p, micro-batches m, chunks v)`` → per stage the
ordered list of :class:`Action` values that stage runs, in a module of its own, registered
by name in :data:`SCHEDULES` with its closed forms (:mod:`~llmsim.schedules.registry`) and
built with :func:`build`. Every schedule emits the backward as two passes, ``B`` (input
gradient, on the critical path between stages) and ``W`` (weight gradient, local), as in
Qi et al. 2024 §1. Schedules with a fused backward emit each ``W`` right after its ``B``;
the engine runs the two back to back.

Timing is the engine's job. :func:`unit_timeline` is a small reference model (no
communication cost, fixed F/B/W durations) used to print a schedule as a grid and to
check the closed forms of the bubble in the tests.
"""

from __future__ import annotations

from llmsim.schedules import (  # noqa: F401  (each registers itself)
    chimera,
    dualpipe,
    gpipe,
    interleaved,
    one_f_one_b,
    pipedream,
    zb_h1,
    zb_h2,
    zb_v,
)
from llmsim.schedules.action import Action, Kind
from llmsim.schedules.grad_sync import aligned_grad_syncs
from llmsim.schedules.printing import format_grid, to_dataframe
from llmsim.schedules.registry import (
    SCHEDULES,
    SPLIT_BACKWARD,
    Schedule,
    ScheduleFn,
    ScheduleInfo,
    build,
    placement,
    register,
    route_of,
)
from llmsim.schedules.timing import (
    Timeline,
    chunks_at_peak,
    idle_fractions,
    peak_in_flight,
    unit_timeline,
)

__all__ = [
    "SCHEDULES", "SPLIT_BACKWARD", "Action", "Kind", "Schedule", "ScheduleFn", "ScheduleInfo",
    "Timeline", "aligned_grad_syncs", "build", "chunks_at_peak", "format_grid",
    "idle_fractions", "peak_in_flight", "placement", "register", "route_of", "to_dataframe",
    "unit_timeline",
]
