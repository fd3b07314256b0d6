"""The dependency walk of a schedule's order: which pass waits for which, then when each
ends with given pass times.

Every timing that replays a schedule's action order without the engine — the reference
timeline (:func:`llmsim.schedules.unit_timeline`), the search's walks of ZB-V
(:mod:`llmsim.search.zb_v_walk`) and of Chimera and DualPipe
(:mod:`llmsim.search.two_pipelines`), and the ZB-H1 layouts the closed form does not
cover (:mod:`llmsim.search.pipeline`) — runs the same rule: each stage runs its actions
in order, and a pass starts when its stage is free and its input is in. F waits for the
F of the previous virtual stage of its micro-batch's route, B for the input gradient of
the next one (the last virtual stage's B for its own F), W for its own B. The input
gradient leaves a stage right after B, or after W where ``gradient_after_weights`` (a
fused backward run as B then W, Chimera's in the search).

Which pass waits for which depends only on the order, so :func:`wait_graph` works it out
once, and :func:`replay` (a loop of O(passes) float operations) times it with a layout's
passes; the layout search replays the same loop compiled
(:func:`llmsim.schedules.walk_kernel.replay_ends`).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from operator import attrgetter

import numpy as np

from llmsim.schedules.action import Action
from llmsim.schedules.route import Hop, Route

KINDS = {"F": 0, "B": 1, "W": 2}
"""A pass kind's number: its column within its chunk's three (F, B, W)."""

Row = tuple[int, int, int, int]
"""(stage, duration column, the 1-based pass it waits for or 0, the hop its input takes)
of one pass, as :func:`replay` reads it."""

Rows = tuple[Row, ...] | np.ndarray
"""A wait graph's rows: :data:`Row` tuples, or the (passes × 4) array of
:func:`rows_table`."""


@dataclass(frozen=True, slots=True)
class WaitGraph:
    """A schedule's passes in an order in which each comes after the one it waits for."""

    p: int
    """Stages."""
    chunks: int
    """Chunks per stage (the largest chunk index + 1)."""
    table: np.ndarray
    """The passes as :data:`Row` s, a (passes × 4) int64 array (what :meth:`rows` gives,
    and what the compiled replay reads: :func:`llmsim.schedules.walk_kernel.replay_ends`)."""
    sender_of: np.ndarray
    """Per pass, the stage of the pass it waits for (its own stage when none)."""
    listed: list[Action]
    """The order's actions, stage after stage."""
    which: np.ndarray
    """Per pass, its action's index in :attr:`listed`."""

    @property
    def actions(self) -> tuple[Action, ...]:
        """The action of each pass (pass ``k`` is ``actions[k − 1]``)."""
        listed = self.listed
        return tuple(listed[i] for i in self.which.tolist())

    @property
    def needs(self) -> tuple[int, ...]:
        """Per pass, the 1-based index of the pass whose end releases it, 0 for none."""
        return tuple(self.table[:, 2].tolist())

    @property
    def senders(self) -> tuple[int, ...]:
        """Per pass, the stage of the pass it waits for (its own stage when none)."""
        return tuple(self.sender_of.tolist())

    def rows(self) -> tuple[Row, ...]:
        """The passes as :data:`Row` with the standard columns and hops: duration column
        ``3·(chunks·s + chunk) + kind``; hop 0 for an input from the same stage (and for
        a W, which follows its own B), ``1 + s`` for stage s's send to s + 1, else
        ``1 + p + s`` (its send to s − 1)."""
        return tuple(map(tuple, self.table.tolist()))


def wait_graph(order: list[list[Action]], route: Route, *,
               gradient_after_weights: bool = False) -> WaitGraph:
    """Walk ``order`` (per stage, its actions) once along the micro-batches' ``route``,
    recording for each pass what it waits for instead of when it runs.

    The stages are swept in turn, each running its actions as far as their inputs are
    in (:func:`llmsim.schedules.walk_kernel.wait_rows`, compiled: the actions and the
    route as integer arrays here).

    Raises ValueError if an action is listed on another stage than its own, or if the
    order cannot finish (a missing action or a deadlock); KeyError (stage, chunk) if a
    micro-batch's route does not pass the action's chunk."""
    from llmsim.schedules.walk_kernel import wait_rows  # numba: loaded where walked

    p = len(order)
    listed = [a for row in order for a in row]
    n = len(listed)
    codes = np.empty((n, 4), dtype=np.int64)  # stage, kind, micro-batch, chunk
    for i, (field, as_code) in enumerate((("stage", None), ("kind", KINDS.__getitem__),
                                           ("microbatch", None), ("chunk", None))):
        values = map(attrgetter(field), listed)
        codes[:, i] = np.fromiter(values if as_code is None else map(as_code, values),
                                  dtype=np.int64, count=n)
    chunks = 1 + int(codes[:, 3].max(initial=0))
    m = 1 + int(codes[:, 2].max(initial=0))
    positions: dict[tuple[Hop, ...], np.ndarray] = {}  # a route → its k by chunks·s + c
    index_of = np.empty((m, p * chunks), dtype=np.int64)
    lasts = np.empty(m, dtype=np.int64)
    for mb in range(m):
        hops = route(mb)
        at = positions.get(hops)
        if at is None:
            at = positions[hops] = np.full(p * chunks, -1, dtype=np.int64)
            for k, (s, c) in enumerate(hops):
                at[chunks * s + c] = k
        index_of[mb] = at
        lasts[mb] = len(hops) - 1
    offsets = np.zeros(p + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(row) for row in order])
    status, where, table, senders, which = wait_rows(p, chunks, offsets, codes, index_of,
                                                     lasts, gradient_after_weights)
    if status == 3:
        stuck = [str(listed[i]) for i in where.tolist()]
        raise ValueError(f"schedule cannot finish: stages wait forever at {', '.join(stuck)}")
    if status:  # 1: listed on another stage; 2: a chunk its route does not pass
        i = int(where[0])
        s = int(np.searchsorted(offsets, i, side="right")) - 1  # the row that lists it
        if status == 1:
            raise ValueError(f"action {listed[i]} is listed on stage {s}")
        raise KeyError((s, int(codes[i, 3])))
    return WaitGraph(p, chunks, table, senders, listed, which)


def rows_table(rows: Rows) -> np.ndarray:
    """The rows of a wait graph (:data:`~llmsim.schedules.walk.Row`: stage, duration
    column, the 1-based pass waited for or 0, hop) as an (passes × 4) int64 array (an
    array given is returned as it is)."""
    if isinstance(rows, np.ndarray):
        return rows
    n = len(rows)
    return np.fromiter(chain.from_iterable(rows), dtype=np.int64, count=4 * n).reshape(n, 4)


def replay(p: int, rows: tuple[Row, ...], durations: list, hops: list) -> tuple[list, list]:
    """(each pass's end, index 0 being time 0; each stage's last end) with
    ``durations[column]`` and ``hops[hop]`` as each :data:`Row` says, in any unit (integer
    zero keeps Fractions exact): a pass starts at the later of its stage's free time and
    the end of the pass it waits for plus its hop."""
    free = [0] * p
    end = [0]
    append = end.append
    for s, column, j, hop in rows:
        t = end[j] + hops[hop]
        f = free[s]
        if f > t:
            t = f
        t += durations[column]
        free[s] = t
        append(t)
    return end, free
