"""Chimera's bidirectional pipelines (Li & Hoefler 2021 §3)."""

from __future__ import annotations

import numpy as np

from llmsim.errors import UserError
from llmsim.schedules.action import Action
from llmsim.schedules.action_table import actions
from llmsim.schedules.orders import one_f_one_b_order, require_one_chunk
from llmsim.schedules.registry import register
from llmsim.schedules.route import bidirectional
from llmsim.schedules.walk import Row


def chimera_peak(p: int, i: int, m: int, v: int) -> int:
    """Micro-batches in flight on worker i: 1F1B's p − i of the down pipeline, whose
    stage i it runs, plus i + 1 of the up pipeline, whose stage p − 1 − i it runs, each
    capped by the m/2 micro-batches a pipeline gets (Li & Hoefler 2021 §3.3 and Table 1:
    between (p/2 + 1)·M_a and p·M_a when m = p; p + 1 on the middle workers from
    m = 2p on)."""
    half = max(m // 2, 1)
    return min(p - i, half) + min(i + 1, half)


def chimera_bubble(p: int, m: int, v: int, f: float, b: float, w: float) -> float:
    """Idle time of a worker in the reference timing: (p − 2)·max(t_F, t_B), whatever
    the number of micro-batches (t_B the whole backward, B and W fused).

    At t_F = t_B this is the paper's Table 1 bubble, (p/2 − 1)(t_F + t_B) — the ratio
    (D − 2)/(2N + D − 2) for every N. When t_B ≠ t_F it is more than (p/2 − 1)(t_F + t_B),
    which no order reaches there: for p = 4, m = 4 and t_B = 2t_F a branch-and-bound
    over all active schedules finds 4·t_F the least (the paper's 3·t_F would need its
    equal slots).
    """
    return (p - 2) * max(f, b)


@register("chimera",
          route=lambda p, m, v: bidirectional(p),
          peak_forwards=chimera_peak,
          bubble=chimera_bubble,
          pipelines=2,
          walked=lambda p, m, v: chimera_walked(p, m, v))
def chimera(stages: int, microbatches: int, chunks: int) -> list:
    """Two 1F1B pipelines in opposite directions on the same p workers (Li & Hoefler
    2021 §3.1, Fig. 3): worker i runs stage i of the down pipeline (chunk 0) and stage
    p − 1 − i of the up pipeline (chunk 1); of each p micro-batches, the first p/2 go
    down and the others up. Each worker holds both stages' weights (2·M_θ).

    Each pipeline runs 1F1B over all its m/2 micro-batches, and the two are merged on
    each worker in the order of their passes' start times in slots of equal length
    (t_F = t_B, the paper's Fig. 3), which puts no two passes of a worker in one slot
    when p is even (§3.1); each W runs right after its B (a fused backward: the input
    gradient leaves after W). Running each pipeline's 1F1B on without a break is the
    paper's direct concatenation of basic units (§3.5): the next unit's forwards fill the
    previous one's drain, so the idle time (:func:`chimera_bubble`) does not grow with m
    (tested for even p ≤ 12, up to five units, several pass times).

    Two earlier choices made the bubble (m/p)(p − 2)·max(t_F, t_B), above the paper's:
    units run one after the other on each worker (each paying its own fill and drain),
    and the merge timed with t_B = 2t_F, which keeps the bubble at one unit but not
    across units.
    """
    return chimera_walked(stages, microbatches, chunks)[0]


def chimera_walked(stages: int, microbatches: int,
                   chunks: int) -> tuple[list[list[Action]], tuple[Row, ...]]:
    """:func:`chimera`'s order and its wait graph's rows (what
    :func:`~llmsim.schedules.walk.wait_graph` finds for it with the input gradient leaving
    after W), made together with numpy from the passes' starts.

    Every pass is numbered by the merge's key, (start, k, chunk), over all workers, the W
    of a fused backward right after its B: each pass's input starts in an earlier slot of
    its pipeline's 1F1B, or is its own B, so it has a lower number, and each worker's
    passes come in its order: a valid order of the passes for
    :func:`~llmsim.schedules.walk.replay`. Its pass waits for: an F for
    the F of the previous stage of its pipeline, a B for the W of the next stage (the
    last stage's B for its own F), a W for its own B; an input from worker s − 1 takes
    hop s, one from s + 1 hop 1 + p + s + 1."""
    require_one_chunk("chimera", chunks)
    if stages % 2 or microbatches % stages:
        raise UserError(
            f"stages, microbatches: {stages}, {microbatches} with schedule chimera, whose "
            "two pipelines need an even number of stages and whole units of p "
            "micro-batches (Li & Hoefler 2021 §3.1, §3.5); use an even pipeline degree "
            "and a multiple of it as the number of micro-batches"
        )
    p, m = stages, microbatches
    half, each = p // 2, m // 2
    routes = ([mb for mb in range(m) if mb % p < half], [mb for mb in range(m) if mb % p >= half])
    # 1F1B's starts by position q: per (q, k) the start of F and of B
    starts = one_f_one_b_starts(p, each)
    keyed = np.array([key for row in starts for key, _ in row], dtype=np.int64)
    backward = np.array([flag for row in starts for _, flag in row], dtype=np.int64)
    start = np.empty((2, p, each), dtype=np.int64)  # [is B, q, k]
    start[backward, np.repeat(np.arange(p), 2 * each), keyed % each] = keyed // each
    # Every pass by id ((kind·2 + chunk)·p + worker)·each + k, kind F 0, B 1, W 2
    kind, c, s, k = (a.ravel() for a in np.indices((3, 2, p, each), dtype=np.int32))
    n = kind.size
    q = np.where(c == 0, s, p - 1 - s)  # its stage in its pipeline
    order = np.argsort(((start[np.minimum(kind, 1), q, k] * each + k) * 2 + c) * 3 + kind)
    number = np.empty(n, dtype=np.int32)  # the merge's keys, W after B
    number[order] = np.arange(1, n + 1, dtype=np.int32)
    # the pass each waits for: its kind and worker (the pipeline's next stage: s + step)
    step = 1 - 2 * c
    first, last = q == 0, q == p - 1
    opening = (kind == 0) & first  # waits for nothing
    sender = s.copy()
    moved = (kind == 0) & ~first  # F: the previous stage's F
    sender[moved] -= step[moved]
    moved = (kind == 1) & ~last  # B: the next stage's W
    sender[moved] += step[moved]
    need_kind = np.select([kind == 0, kind == 2, last], [0, 1, 0], 2)  # the last B: its F
    j = number[((need_kind * 2 + c) * p + sender) * each + k]
    j[opening] = 0
    hop = np.where(sender == s, 0, np.where(sender == s - 1, s, 1 + p + sender))
    columns = [a[order] for a in (s, 6 * s + 3 * c + kind, j, hop)]
    del start, c, k, q, number, step, first, last, opening, sender, moved, need_kind, j, hop
    rows: list[Row] = []  # made a block at a time: fewer Python integers held at once
    for lo in range(0, n, 1 << 16):
        rows += zip(*(a[lo:lo + (1 << 16)].tolist() for a in columns), strict=True)
    # Each worker's actions: the numbered passes grouped by worker, in number order
    flat: list[Action] = []
    for kind_ in ("F", "B", "W"):
        for chunk, route in enumerate(routes):
            for worker in range(p):
                table = actions(worker, kind_, chunk, m)
                flat += [table[mb] for mb in route]
    by_worker = order[np.argsort(columns[0], kind="stable")].reshape(p, n // p)
    return [list(map(flat.__getitem__, ids)) for ids in by_worker.tolist()], tuple(rows)


def one_f_one_b_starts(stages: int, microbatches: int) -> list[list[tuple[int, int]]]:
    """Per stage, its F and B passes of 1F1B (:func:`one_f_one_b_order`) in order, each as
    ``(start·microbatches + micro-batch, 1 for B else 0)``, the start in the reference
    timing (:func:`~llmsim.schedules.unit_timeline`) with t_F = t_B = 1, t_W = 0 and free
    communication: a pass starts when its stage is free and its input is in (F after the
    previous stage's F, B after the next stage's B, the last stage's B after its own F;
    the W of a fused backward takes no time). Integer arithmetic over the stages'
    orders, swept until every pass has run."""
    p, m = stages, microbatches
    orders = [one_f_one_b_order(p, m, s) for s in range(p)]
    f_end = [[-1] * m for _ in range(p)]
    b_end = [[-1] * m for _ in range(p)]
    out: list[list[tuple[int, int]]] = [[] for _ in range(p)]
    position, free = [0] * p, [0] * p
    left = 2 * m * p
    zeros = [0] * m  # stage 0's forwards wait for nothing
    while left:
        moved = left
        for s in range(p):
            row, at, t, record = orders[s], position[s], free[s], out[s].append
            # the ends a forward and a backward wait for, and this stage's own
            inputs = (f_end[s - 1] if s else zeros, b_end[s + 1] if s + 1 < p else f_end[s])
            ends = (f_end[s], b_end[s])
            while at < len(row):
                kind, k = row[at]
                backward = int(kind == "B")
                ready = inputs[backward][k]
                if ready < 0:
                    break
                if ready > t:
                    t = ready
                record((t * m + k, backward))
                t += 1
                ends[backward][k] = t
                at += 1
            left -= at - position[s]
            position[s], free[s] = at, t
        if left == moved:
            raise ValueError("one_f_one_b_starts: 1F1B cannot finish")  # not reached
    return out
