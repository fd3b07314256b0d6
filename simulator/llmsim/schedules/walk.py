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

from llmsim.schedules.action import Action
from llmsim.schedules.route import Hop, Route

KINDS = {"F": 0, "B": 1, "W": 2}
"""A pass kind's number: its column within its chunk's three (F, B, W)."""

Row = tuple[int, int, int, int]
"""(stage, duration column, the 1-based pass it waits for or 0, the hop its input takes)
of one pass, as :func:`replay` reads it."""


@dataclass(frozen=True, slots=True)
class WaitGraph:
    """A schedule's passes in an order in which each comes after the one it waits for."""

    p: int
    """Stages."""
    chunks: int
    """Chunks per stage (the largest chunk index + 1)."""
    actions: tuple[Action, ...]
    """The action of each pass (pass ``k`` is ``actions[k − 1]``)."""
    needs: tuple[int, ...]
    """Per pass, the 1-based index of the pass whose end releases it, 0 for none."""
    senders: tuple[int, ...]
    """Per pass, the stage of the pass it waits for (its own stage when none)."""
    table: tuple[Row, ...]
    """The passes as :data:`Row`, as :meth:`rows` gives them (made in the same walk)."""

    def rows(self) -> tuple[Row, ...]:
        """The passes as :data:`Row` with the standard columns and hops: duration column
        ``3·(chunks·s + chunk) + kind``; hop 0 for an input from the same stage (and for
        a W, which follows its own B), ``1 + s`` for stage s's send to s + 1, else
        ``1 + p + s`` (its send to s − 1)."""
        return self.table


def wait_graph(order: list[list[Action]], route: Route, *,
               gradient_after_weights: bool = False) -> WaitGraph:
    """Walk ``order`` (per stage, its actions) once along the micro-batches' ``route``,
    recording for each pass what it waits for instead of when it runs.

    The stages are swept in turn, each running its actions as far as their inputs are
    in. A produced output (kind F 0, B 1, input gradient 2; micro-batch; virtual stage)
    is the slot ``(kind·m + mb)·width + k`` of flat tables of integers; a route's virtual
    stage of (stage, chunk) is a list by ``chunks·stage + chunk``.

    Raises ValueError if an action is listed on another stage than its own, or if the
    order cannot finish (a missing action or a deadlock)."""
    p = len(order)
    chunks = 1 + max((max(a.chunk for a in row) for row in order if row), default=0)
    m = 1 + max((max(a.microbatch for a in row) for row in order if row), default=0)
    positions: dict[tuple[Hop, ...], list[int]] = {}  # a route → its k by chunks·s + c
    index_of, lasts = [], []
    for mb in range(m):
        hops = route(mb)
        at = positions.get(hops)
        if at is None:
            at = positions[hops] = [-1] * (p * chunks)
            for k, (s, c) in enumerate(hops):
                at[chunks * s + c] = k
        index_of.append(at)
        lasts.append(len(hops) - 1)
    width = 1 + max(lasts, default=0)
    grads = 2 * m * width  # the input gradients' first slot
    produced = [0] * (3 * m * width)  # the pass's number (1-based), 0 while not run
    sender_of = [0] * (3 * m * width)
    actions: list[Action] = []
    needs: list[int] = []
    senders: list[int] = []
    rows: list[Row] = []
    position = [0] * p
    progress = True
    while progress:
        progress = False
        for s, row in enumerate(order):
            at = start = position[s]
            end = len(row)
            first = chunks * s
            while at < end:
                a = row[at]
                if a.stage != s:
                    raise ValueError(f"action {a} is listed on stage {s}")
                mb, c, kind = a.microbatch, a.chunk, a.kind
                k = index_of[mb][first + c]
                if k < 0:
                    raise KeyError((s, c))
                own_f = mb * width + k
                column = 3 * (first + c)
                if kind == "F":  # after the F of the previous virtual stage
                    if k:
                        j = produced[own_f - 1]
                        if not j:
                            break
                        sender = sender_of[own_f - 1]
                        hop = 0 if sender == s else (s if sender == s - 1 else 1 + p + sender)
                    else:
                        j, sender, hop = 0, s, 0
                    produced[own_f], sender_of[own_f] = len(actions) + 1, s
                elif kind == "B":  # after the next one's input gradient, and its own F
                    column += 1
                    if k < lasts[mb]:
                        if not produced[own_f]:
                            break
                        j = produced[grads + own_f + 1]
                        if not j:
                            break
                        sender = sender_of[grads + own_f + 1]
                        hop = 0 if sender == s else (s if sender == s - 1 else 1 + p + sender)
                    else:
                        j, sender, hop = produced[own_f], sender_of[own_f], 0
                        if not j:
                            break
                    number = len(actions) + 1
                    slot = m * width + own_f  # its W waits for it
                    produced[slot], sender_of[slot] = number, s
                    if not gradient_after_weights:  # the input gradient may leave
                        produced[grads + own_f], sender_of[grads + own_f] = number, s
                else:  # W after its own B
                    column += 2
                    j = produced[m * width + own_f]
                    if not j:
                        break
                    sender, hop = sender_of[m * width + own_f], 0
                    if gradient_after_weights:
                        produced[grads + own_f], sender_of[grads + own_f] = len(actions) + 1, s
                actions.append(a)
                needs.append(j)
                senders.append(sender)
                rows.append((s, column, j, hop))
                at += 1
            if at != start:
                position[s] = at
                progress = True
    stuck = [str(row[position[s]]) for s, row in enumerate(order) if position[s] < len(row)]
    if stuck:
        raise ValueError(f"schedule cannot finish: stages wait forever at {', '.join(stuck)}")
    return WaitGraph(p, chunks, tuple(actions), tuple(needs), tuple(senders), tuple(rows))


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
