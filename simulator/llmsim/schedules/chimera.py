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
    capped by the p/2 micro-batches a pipeline gets per unit (Li & Hoefler 2021 §3.3 and
    Table 1: between (p/2 + 1)·M_a and p·M_a)."""
    half = max(p // 2, 1)
    return min(p - i, half) + min(i + 1, half)


@register("chimera",
          route=lambda p, m, v: bidirectional(p),
          peak_forwards=chimera_peak,
          bubble=lambda p, m, v, f, b, w: (m // p) * (p - 2) * max(f, b),
          pipelines=2)
def chimera(stages: int, microbatches: int, chunks: int) -> list:
    """Two 1F1B pipelines in opposite directions on the same p workers (Li & Hoefler
    2021 §3.1, Fig. 3): worker i runs stage i of the down pipeline (chunk 0) and stage
    p − 1 − i of the up pipeline (chunk 1); of each p micro-batches, the first p/2 go
    down and the others up. Each worker holds both stages' weights (2·M_θ).

    Each pipeline runs 1F1B on its p/2 micro-batches; the two are merged on each worker
    in the order of their passes' start times with t_B = 2·t_F (the paper's setting),
    which never puts two passes in one slot when p is even (§3.1). More micro-batches
    are whole units of p run one after the other on each worker (the paper's direct
    concatenation, §3.5).

    The idle time of a worker in the reference timing is (m/p)·(p − 2)·max(t_F, t_B)
    (tested for even p ≤ 12, up to three units, several pass times): 2(p − 2)·t_F per
    unit when t_B = 2t_F, against 1F1B's 3(p − 1)·t_F. The paper's Table 1 bubble,
    (p/2 − 1)(t_F + t_B) = 1.5(p − 2)·t_F per unit (ratio (D−2)/(2N+D−2)), is smaller:
    merging the two 1F1B timings slot by slot, as done here, puts some forwards of the
    two pipelines in the same slot, and the conflict-free placement of the paper's
    Fig. 3 is not reproduced.
    """
    require_one_chunk("chimera", chunks)
    if stages % 2 or microbatches % stages:
        raise UserError(
            f"stages, microbatches: {stages}, {microbatches} with schedule chimera, whose "
            "two pipelines need an even number of stages and whole units of p "
            "micro-batches (Li & Hoefler 2021 §3.1, §3.5); use an even pipeline degree "
            "and a multiple of it as the number of micro-batches"
        )
    half = stages // 2
    one = [with_weight_passes(s, one_f_one_b_order(stages, half, s), lag=0)
           for s in range(stages)]
    timeline = unit_timeline(one, f=1, b=2, w=0)
    rows: list[list[Action]] = [[] for _ in range(stages)]
    for unit in range(microbatches // stages):
        base = unit * stages
        merged: list[list[tuple[float, int, Action]]] = [[] for _ in range(stages)]
        for s, row in enumerate(timeline):
            for start, _, a in row:
                if a.kind == "W":  # fused: placed right after its B below
                    continue
                merged[s].append((start, a.microbatch, Action(s, a.kind, base + a.microbatch, 0)))
                up = stages - 1 - s
                merged[up].append((start, a.microbatch,
                                   Action(up, a.kind, base + half + a.microbatch, 1)))
        for s in range(stages):
            for *_, a in sorted(merged[s], key=lambda t: (t[0], t[1], t[2].chunk)):
                rows[s].append(a)
                if a.kind == "B":  # the fused backward's weight gradients
                    rows[s].append(Action(s, "W", a.microbatch, a.chunk))
    return rows
