"""The schedules' one dependency walk (llmsim.schedules.walk) and everything that times a
schedule with it — the reference timeline, ZB-V's and Chimera's/DualPipe's walks in the
search — against a reference that times the passes another way: each pass's end by
memoised recursion over what it waits for (the pass before it on its stage, and its
input), with no order of evaluation of its own."""

from __future__ import annotations

import random
import sys
from fractions import Fraction
from itertools import pairwise

import numpy as np
import pytest

from llmsim.schedules import SCHEDULES, SPLIT_BACKWARD, Action, build, unit_timeline
from llmsim.schedules.registry import route_of
from llmsim.schedules.walk import replay, rows_table, wait_graph
from llmsim.schedules.walk_kernel import replay_ends
from llmsim.search import two_pipelines
from llmsim.search.pipeline import StageTimes, _chunk_shares, zb_v_walk_s

CASES = [("1f1b", 4, 6, 1), ("gpipe", 3, 5, 1), ("interleaved-1f1b", 4, 8, 2),
         ("zb-h1", 4, 8, 1), ("zb-h2", 4, 9, 1), ("zb-v", 4, 8, 2), ("chimera", 4, 8, 1),
         ("dualpipe", 4, 8, 1), ("dualpipe", 6, 12, 1), ("pipedream", 3, 6, 1)]


def reference_ends(order, duration, hop, *, gradient_after_weights: bool = False
                   ) -> dict[Action, float]:
    """Each action's end: ``max(end of the previous action of its stage, end of its input
    + hop(sender, receiver, kind)) + duration(action)``, evaluated by recursion."""
    route = route_of(order)
    previous = {a: (row[i - 1] if i else None) for row in order for i, a in enumerate(row)}
    ends: dict[Action, float] = {}

    def producer(a: Action) -> Action | None:
        hops = route(a.microbatch)
        k = hops.index((a.stage, a.chunk))
        if a.kind == "F":
            return Action(*hops[k - 1][:1], "F", a.microbatch, hops[k - 1][1]) if k else None
        if a.kind == "W":
            return Action(a.stage, "B", a.microbatch, a.chunk)
        if k == len(hops) - 1:
            return Action(a.stage, "F", a.microbatch, a.chunk)
        s, c = hops[k + 1]
        return Action(s, "W" if gradient_after_weights else "B", a.microbatch, c)

    def end(a: Action) -> float:
        if a not in ends:
            before, source = previous[a], producer(a)
            start = end(before) if before is not None else 0
            if source is not None:
                start = max(start, end(source) + hop(source.stage, a.stage, a.kind))
            ends[a] = start + duration(a)
        return ends[a]

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 20_000))
    try:
        for row in order:
            for a in row:
                end(a)
    finally:
        sys.setrecursionlimit(limit)
    return ends


def _random_case(p: int, chunks: int, seed: int):
    rng = random.Random(seed)
    pass_s = {(s, c, k): rng.uniform(0.2, 2.0) for s in range(p) for c in range(chunks)
              for k in "FBW"}
    hop_f = [rng.uniform(0, 0.3) for _ in range(p)]
    hop_b = [rng.uniform(0, 0.3) for _ in range(p)]

    def hop(sender: int, receiver: int, kind: str) -> float:
        if sender == receiver or kind == "W":
            return 0.0
        return hop_f[sender] if receiver == sender + 1 else hop_b[sender]

    durations = [pass_s[(s, c, k)] for s in range(p) for c in range(chunks) for k in "FBW"]
    return pass_s, hop, durations, [0.0, *hop_f, *hop_b]


@pytest.mark.parametrize(("schedule", "p", "m", "v", "fused"),
                         [(*case, False) for case in CASES]
                         + [(*case, True) for case in CASES if case[0] not in SPLIT_BACKWARD])
def test_the_replay_equals_the_recursive_reference(schedule: str, p: int, m: int, v: int,
                                                   fused: bool) -> None:
    """With unequal passes per stage, chunk and kind and a hop per sender and direction,
    every pass ends exactly when the reference says, by the loop and by its compiled
    form (the input gradient leaving after W, ``fused``, only where W is never deferred)."""
    order = build(schedule, p, m, v)
    graph = wait_graph(order, route_of(order), gradient_after_weights=fused)
    pass_s, hop, durations, hops = _random_case(p, graph.chunks, p * 100 + m)
    reference = reference_ends(order, lambda a: pass_s[(a.stage, a.chunk, a.kind)], hop,
                               gradient_after_weights=fused)
    rows = graph.rows()
    end, free = replay(p, rows, durations, hops)
    assert {a: end[k] for k, a in enumerate(graph.actions, start=1)} == reference
    picks = np.arange(len(rows) + 1, dtype=np.int64)
    assert replay_ends(p, rows_table(rows), durations, hops, picks) == (end, free)
    assert free == [reference[row[-1]] for row in order]


@pytest.mark.parametrize(("schedule", "p", "m", "v"), CASES)
def test_the_unit_timeline_is_the_walk(schedule: str, p: int, m: int, v: int) -> None:
    """The reference timeline (Fractions stay exact) starts and ends each action where the
    recursive reference does, with its input gradient leaving after B."""
    f, b, w = Fraction(1), Fraction(5, 3), Fraction(2, 7)
    order = build(schedule, p, m, v)
    timeline = unit_timeline(order, f=f, b=b, w=w)
    reference = reference_ends(order, lambda a: {"F": f, "B": b, "W": w}[a.kind],
                               lambda *_: 0)
    assert {a: end for row in timeline for _, end, a in row} == reference
    for row in timeline:
        for (_, end, _), (start, _, _) in pairwise(row):
            assert start >= end


@pytest.mark.parametrize(("p", "m"), [(2, 3), (3, 7), (4, 16), (12, 30), (32, 40)])
@pytest.mark.parametrize("blocking", [False, True])
def test_the_compiled_zb_v_walk_equals_the_reference(p: int, m: int, blocking: bool) -> None:
    """ZB-V's walk in the search (the compiled loop) gives exactly
    the reference's numbers, with unequal stages, chunks and hops."""
    rng = random.Random(p * 1000 + m)
    stages = [(StageTimes(1.0, 1.0, 1.0, hop_f=rng.random() / 10, hop_b=rng.random() / 10,
                          chunk_forward=[rng.random(), rng.random()],
                          chunk_backward=[(rng.random(), rng.random()),
                                          (rng.random(), rng.random())]),
               (rng.random(), 2 * rng.random(), rng.random())) for _ in range(p)]
    shares = [list(zip(*_chunk_shares(st), strict=True)) for st, _ in stages]

    def duration(a: Action) -> float:
        f, b, w = stages[a.stage][1]
        share = shares[a.stage][a.chunk]
        return {"F": f * share[0], "B": b * share[1], "W": w * share[2]}[a.kind]

    def hop(sender: int, receiver: int, kind: str) -> float:
        if blocking or sender == receiver or kind == "W":
            return 0.0
        st = stages[sender][0]
        return st.hop_f if receiver == sender + 1 else st.hop_b

    order = build("zb-v", p, m, 2)
    reference = reference_ends(order, duration, hop)
    free = [reference[row[-1]] for row in order]
    walk, ends = zb_v_walk_s(stages, m, blocking=blocking)
    assert walk == max(free) and list(ends) == free


@pytest.mark.parametrize(("schedule", "p", "m"), [("chimera", 4, 8), ("dualpipe", 4, 8),
                                                  ("dualpipe", 6, 16)])
def test_the_two_pipelines_walk_equals_the_reference(schedule: str, p: int, m: int) -> None:
    """Chimera's (fused backward: the gradient leaves after W) and DualPipe's walks in the
    search equal the reference pass by pass."""
    order = build(schedule, p, m)
    compiled = two_pipelines.compiled(schedule, p, m)
    pass_s, hop, durations, hops = _random_case(p, 2, m)
    reference = reference_ends(order, lambda a: pass_s[(a.stage, a.chunk, a.kind)], hop,
                               gradient_after_weights=schedule not in SPLIT_BACKWARD)
    # a pass of a pair (DualPipe's) at its own durations: the pairs' columns after 6p
    pairs = [x for k in range(0, 6 * p, 3) for x in durations[k: k + 2]]
    ends = two_pipelines.walk(compiled, durations + pairs, hops)
    assert sorted(ends[1:]) == sorted(reference.values())
    assert max(ends) == max(reference.values())


def test_an_action_on_the_wrong_stage_is_refused() -> None:
    order = build("1f1b", 2, 2)
    order[0][0] = Action(1, "F", 0)
    with pytest.raises(ValueError, match="is listed on stage 0"):
        wait_graph(order, route_of(order))


def test_every_registered_schedule_compiles() -> None:
    for name, info in SCHEDULES.items():
        v = 2 if name in ("interleaved-1f1b", "zb-v") else 1
        p, m = 4, 8
        order = build(name, p, m, v)
        graph = wait_graph(order, info.route_of(p, m, v))
        assert len(graph.actions) == sum(len(row) for row in order)
