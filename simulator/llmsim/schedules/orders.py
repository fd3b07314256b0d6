"""Building blocks of the schedules' action orders, shared by their modules."""

from __future__ import annotations

import numpy as np

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


def greedy_order(stages: int, microbatches: int, route: Route, may_forward: int, *,
                 fused: bool = False,
                 times: tuple[int, int, int] = (1, 1, 1),
                 graph: list[Row] | None = None) -> list[list[Action]]:
    """The per-stage orders a list scheduler makes with fixed pass times ``times``
    (F, B, W; unit times by default, each at least 1) and free communication.

    Whenever a stage is free it starts, first, the B whose input gradient is in (the
    earliest forward first); else the F whose input is in (lowest micro-batch, then
    earliest virtual stage) while the stage holds fewer forwards than ``may_forward``
    over all its chunks; else its oldest pending W. With ``fused`` the W runs right
    after its B (one backward). This is the greedy rule of Qi et al. 2024 §3.2 (B before
    F before W, F bounded by the memory limit) with equal pass times, the setting in
    which their handcrafted schedules are drawn.

    Event-driven: at each time only the stages that have just become free, or whose
    queues a finished pass has just filled, are looked at (a free stage that found
    nothing to run stays idle until a pass fills its queues: its memory limit changes
    only with its own passes), so a build is O(passes · log passes), not O(time · p).
    Within one time the stages decide independently (a choice changes only the stage's
    own queues; what it starts is seen at the pass's end), so in any order. The loop is
    compiled (:func:`llmsim.schedules.greedy_kernel.greedy_passes`).

    ``graph``, a list, receives the order's wait graph as it is scheduled: one
    :data:`~llmsim.schedules.walk.Row` a pass, what
    :func:`~llmsim.schedules.walk.wait_graph` finds for the same order and route (the
    same passes, each waiting for the same pass), numbered as they start here. A pass's
    input ends before it starts (every pass takes at least a unit), so its pass has a
    lower number; a stage's passes come in its order: a valid order for
    :func:`~llmsim.schedules.walk.replay`, whose floats do not depend on which valid
    order (``tests/test_walked_orders.py``).
    """
    order, passes = _greedy(stages, microbatches, route, may_forward, fused, times)
    if graph is not None:
        graph.extend(map(tuple, passes[:, ROW_FIELDS].tolist()))
    return order


ROW_FIELDS = [0, 4, 5, 6]
""":func:`~llmsim.schedules.greedy_kernel.greedy_passes`' columns that make a pass's
:data:`~llmsim.schedules.walk.Row` (stage, duration column, the pass waited for, hop)."""


def _greedy(stages: int, microbatches: int, route: Route, limit: int, fused: bool,
            times: tuple[int, int, int]) -> tuple[list[list[Action]], np.ndarray]:
    """:func:`greedy_order`'s per-stage orders and its passes as they start
    (:func:`~llmsim.schedules.greedy_kernel.greedy_passes`' array)."""
    from llmsim.schedules.greedy_kernel import greedy_passes  # numba: where orders are built

    if min(times) < 1:
        raise ValueError(f"greedy_order: pass times {times} must be at least 1 each")
    hops = [route(mb) for mb in range(microbatches)]
    span = max(len(path) for path in hops)
    path_s = np.zeros((microbatches, span), dtype=np.int64)
    path_c = np.zeros((microbatches, span), dtype=np.int64)
    for mb, path in enumerate(hops):
        if len(set(path)) != len(path):
            raise ValueError(f"greedy_order: micro-batch {mb}'s route {path} passes a "
                             "virtual stage twice")
        path_s[mb, :len(path)] = [s for s, _ in path]
        path_c[mb, :len(path)] = [c for _, c in path]
    path_len = np.array([len(path) for path in hops], dtype=np.int64)
    status, passes = greedy_passes(stages, path_s, path_c, path_len, limit, fused, *times)
    if status:
        raise ValueError("greedy_order: no stage can move (the memory limit is too low)")
    chunks = 1 + int(path_c.max())
    # Per stage and chunk, its actions by micro-batch (F, B, W), shared (.action_table)
    table = [[(actions(s, "F", c, microbatches), actions(s, "B", c, microbatches),
               actions(s, "W", c, microbatches)) for c in range(chunks)]
             for s in range(stages)]
    order: list[list[Action]] = [[] for _ in range(stages)]
    for s, kind, mb, c in passes[:, :4].tolist():
        order[s].append(table[s][c][kind][mb])
    return order, passes


def greedy_walked(stages: int, microbatches: int, route: Route,
                  limit: int) -> tuple[list[list[Action]], np.ndarray]:
    """:func:`greedy_order`'s order (unit pass times, an integer memory limit) with its
    wait graph's rows, made as it is scheduled (its ``graph``), as a (passes × 4) array
    (:func:`~llmsim.schedules.walk.rows_table`'s)."""
    order, passes = _greedy(stages, microbatches, route, limit, False, (1, 1, 1))
    return order, passes[:, ROW_FIELDS]
