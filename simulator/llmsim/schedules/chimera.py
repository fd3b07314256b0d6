"""Chimera's bidirectional pipelines (Li & Hoefler 2021 §3)."""

from __future__ import annotations

from llmsim.errors import UserError
from llmsim.schedules.action import Action
from llmsim.schedules.orders import one_f_one_b_order, require_one_chunk, with_weight_passes
from llmsim.schedules.registry import register
from llmsim.schedules.route import bidirectional
from llmsim.schedules.timing import unit_timeline


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
          pipelines=2)
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
    require_one_chunk("chimera", chunks)
    if stages % 2 or microbatches % stages:
        raise UserError(
            f"stages, microbatches: {stages}, {microbatches} with schedule chimera, whose "
            "two pipelines need an even number of stages and whole units of p "
            "micro-batches (Li & Hoefler 2021 §3.1, §3.5); use an even pipeline degree "
            "and a multiple of it as the number of micro-batches"
        )
    half, each = stages // 2, microbatches // 2
    down = [mb for mb in range(microbatches) if mb % stages < half]
    up = [mb for mb in range(microbatches) if mb % stages >= half]
    one = [with_weight_passes(s, one_f_one_b_order(stages, each, s), lag=0)
           for s in range(stages)]
    merged: list[list[tuple[float, int, Action]]] = [[] for _ in range(stages)]
    for s, row in enumerate(unit_timeline(one, f=1, b=1, w=0)):
        for start, _, a in row:
            if a.kind == "W":  # fused: placed right after its B below
                continue
            merged[s].append((start, a.microbatch, Action(s, a.kind, down[a.microbatch], 0)))
            mirror = stages - 1 - s
            merged[mirror].append((start, a.microbatch,
                                   Action(mirror, a.kind, up[a.microbatch], 1)))
    rows: list[list[Action]] = [[] for _ in range(stages)]
    for s in range(stages):
        for *_, a in sorted(merged[s], key=lambda t: (t[0], t[1], t[2].chunk)):
            rows[s].append(a)
            if a.kind == "B":  # the fused backward's weight gradients
                rows[s].append(Action(s, "W", a.microbatch, a.chunk))
    return rows
