"""DualPipe (DeepSeek-V3 technical report, arXiv:2412.19437 §3.2.1; deepseek-ai/DualPipe)."""

from __future__ import annotations

from collections import deque

from llmsim.errors import UserError
from llmsim.schedules.action import Action
from llmsim.schedules.action_table import actions
from llmsim.schedules.registry import register
from llmsim.schedules.route import Route


def dualpipe_route(stages: int, microbatches: int) -> Route:
    """The first half of the micro-batches down the stages (chunk 0 of stage ``s`` is the
    forward direction's stage ``s``), the second half up (chunk 1 of stage ``s`` is the
    reverse direction's stage ``p − 1 − s``): deepseek-ai/DualPipe feeds half the chunks
    at the first rank and half at the last."""
    down = tuple((s, 0) for s in range(stages))
    up = tuple((s, 1) for s in reversed(range(stages)))
    half = max(microbatches // 2, 1)  # placement() asks for one micro-batch's route
    return lambda mb: down if mb < half else up


def dualpipe_bubble(p: int, m: int, v: int, f: float, b: float, w: float) -> float:
    """(PP/2 − 1)(F&B + B − 3W), the DualPipe README's table (DeepSeek-V3 report
    Table 2), whose B is a full backward chunk (llmsim's ``b + w``) and F&B the time of a
    forward and a backward chunk run overlapped, taken here as a perfect overlap,
    max(t_F, t_B + t_W).

    The reference timing (:func:`~llmsim.schedules.unit_timeline`) runs the two passes
    of a pair one after the other; it gives this idle time exactly at equal pass times,
    (PP/2 − 1)·t (tested for p = 4, 6, 8), and less than it otherwise (p = 4, m = 8,
    t_F, t_B, t_W = 1, 2, 1: 2 against 3)."""
    full = b + w
    return (p // 2 - 1) * (max(f, full) + full - 3 * w)


def forward_backward_pairs(actions: list[Action]) -> list[tuple[int, int]]:
    """The (forward, backward) index pairs of a rank's order that DualPipe runs
    overlapped: each forward directly followed by a backward of the other chunk, which
    are the ``_forward_backward_chunk`` calls of steps 4 and 5 of ``DualPipe.step``
    (deepseek-ai/DualPipe; the report's §3.2.1, Figure 4), ``2(m/2 − p + h + 1) +
    p/2 − h − 1`` of them on rank r (:func:`dualpipe`). The backward's W follows it at
    once (not deferred in those steps) and belongs to the pair."""
    return [(i, i + 1) for i in range(len(actions) - 1)
            if actions[i].kind == "F" and actions[i + 1].kind == "B"
            and actions[i + 1].chunk != actions[i].chunk]


@register("dualpipe", split_backward=True,
          route=lambda p, m, v: dualpipe_route(p, m),
          peak_forwards=lambda p, i, m, v: p + 1,
          bubble=dualpipe_bubble,
          pipelines=2,
          overlapped_pairs=forward_backward_pairs)
def dualpipe(stages: int, microbatches: int, chunks: int) -> list:
    """DualPipe's per-rank order, step by step as ``DualPipe.step`` of deepseek-ai/DualPipe
    runs it (commit bb214e8): rank ``r`` holds stage ``r`` of the forward direction
    (chunk 0) and stage ``p − 1 − r`` of the reverse one (chunk 1), 2× the parameters, like
    Chimera; half the micro-batches go each way. With ``h = min(r, p − 1 − r)`` and phase 0
    the rank's own direction's first chunk (chunk 0 on the first half of the ranks,
    chunk 1 on the second):

    1. ``2(p/2 − h − 1)`` forwards of phase 0;
    2. ``h + 1`` times a forward of phase 0 and one of phase 1;
    3. ``p/2 − h − 1`` times a backward of phase 1 whose W is deferred, a deferred W, a
       forward of phase 1;
    4. ``m/2 − p + h + 1`` times: forward 0 with backward 1, forward 1 with backward 0
       (each pair overlapped in DualPipe: "F&B");
    5. ``p/2 − h − 1`` times: backward 1, forward 1 with backward 0;
    6. ``h + 1`` times backward 1 and backward 0, the second half of them with W deferred;
    7. ``p/2 − h − 1`` times a deferred W and a backward 0 with W deferred;
    8. the ``h + 1`` W left.

    A backward not deferred runs its W right after its B. Needs an even p and
    m ≥ 2p, m even (the code's assertion). Its idle time is
    :func:`dualpipe_bubble`; each rank holds PP + 1 micro-batches' activations at its
    peak (README), which ``peak_forwards`` states.
    """
    if chunks != 1:
        raise UserError(
            f"chunks (virtual stages): {chunks} with schedule dualpipe, which places one "
            "stage of each direction on every rank; set chunks to 1")
    if stages % 2 or microbatches % 2 or microbatches < 2 * stages:
        raise UserError(
            f"stages, microbatches: {stages}, {microbatches} with schedule dualpipe, which "
            "needs an even number of stages and an even number of micro-batches of at "
            "least twice the stages (deepseek-ai/DualPipe's assertion); change them")
    return [_rank_order(stages, microbatches, r) for r in range(stages)]


def _rank_order(p: int, m: int, rank: int) -> list[Action]:
    half_ranks, half = p // 2, m // 2
    h = min(rank, p - 1 - rank)
    second = int(rank >= half_ranks)
    out: list[Action] = []
    f_next, b_next = [0, 0], [0, 0]  # per phase: the next forward, backward (FIFO)
    deferred: deque[Action] = deque()
    # Per phase, its chunk's F, B and W of this rank by micro-batch: chunk 0 runs the
    # first half of the micro-batches, chunk 1 the rest.
    table = [[actions(rank, kind, phase ^ second, m)[half * (phase ^ second):]
              for kind in ("F", "B", "W")] for phase in (0, 1)]

    def forward(phase: int) -> None:
        out.append(table[phase][0][f_next[phase]])
        f_next[phase] += 1

    def backward(phase: int, defer: bool = False) -> None:
        _, b, w = table[phase]
        k = b_next[phase]
        b_next[phase] += 1
        out.append(b[k])
        if defer:
            deferred.append(w[k])
        else:
            out.append(w[k])

    def weight() -> None:
        out.append(deferred.popleft())

    for _ in range((half_ranks - h - 1) * 2):  # step 1
        forward(0)
    for _ in range(h + 1):  # step 2
        forward(0)
        forward(1)
    for _ in range(half_ranks - h - 1):  # step 3
        backward(1, defer=True)
        weight()
        forward(1)
    for _ in range(half - p + h + 1):  # step 4
        forward(0)
        backward(1)
        forward(1)
        backward(0)
    for _ in range(half_ranks - h - 1):  # step 5
        backward(1)
        forward(1)
        backward(0)
    defer = False
    for i in range(h + 1):  # step 6
        if i == (h + 1) // 2 and h % 2 == 1:
            defer = True
        backward(1, defer)
        if i == (h + 1) // 2 and h % 2 == 0:
            defer = True
        backward(0, defer)
    for _ in range(half_ranks - h - 1):  # step 7
        weight()
        backward(0, defer=True)
    while deferred:  # step 8
        weight()
    return out
