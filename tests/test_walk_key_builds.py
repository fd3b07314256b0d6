"""The search's one-time builds per walk key — Chimera's and DualPipe's orders, the wait
graph with its rows, the shared actions — against the plain implementations they
replaced (kept here as references, as they were at e1a2df5): the same actions in the
same order, the same graph and rows, over grids of stages and micro-batches.
``benchmarks/bench_walk_keys.py --digest`` makes the same comparison over
every walk key of selene-gpt3's space."""

from __future__ import annotations

from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import llmsim
from llmsim.schedules import SCHEDULES, SPLIT_BACKWARD, Action, action_table, build, unit_timeline
from llmsim.schedules.orders import one_f_one_b_order, with_weight_passes
from llmsim.schedules.walk import KINDS, wait_graph


def reference_chimera(p: int, m: int) -> list[list[Action]]:
    """Chimera's order as it was built: the two pipelines' 1F1B timelines (t_F = t_B =
    1, t_W = 0) merged per worker by (start, micro-batch, chunk)."""
    half, each = p // 2, m // 2
    down = [mb for mb in range(m) if mb % p < half]
    up = [mb for mb in range(m) if mb % p >= half]
    one = [with_weight_passes(s, one_f_one_b_order(p, each, s), lag=0) for s in range(p)]
    merged: list[list[tuple]] = [[] for _ in range(p)]
    for s, row in enumerate(unit_timeline(one, f=1, b=1, w=0)):
        for start, _, a in row:
            if a.kind == "W":
                continue
            merged[s].append((start, a.microbatch, Action(s, a.kind, down[a.microbatch], 0)))
            mirror = p - 1 - s
            merged[mirror].append((start, a.microbatch,
                                   Action(mirror, a.kind, up[a.microbatch], 1)))
    rows: list[list[Action]] = [[] for _ in range(p)]
    for s in range(p):
        for *_, a in sorted(merged[s], key=lambda t: (t[0], t[1], t[2].chunk)):
            rows[s].append(a)
            if a.kind == "B":
                rows[s].append(Action(s, "W", a.microbatch, a.chunk))
    return rows


def reference_dualpipe_rank(p: int, m: int, rank: int) -> list[Action]:
    """DualPipe's rank order as it was built, an Action made per pass, from its steps
    written as a program: ``F0``/``F1`` a forward of phase 0/1, ``B0``/``B1`` a backward
    with its W at once, ``b0``/``b1`` one whose W is deferred, ``W`` the oldest deferred W
    (:func:`llmsim.schedules.dualpipe.dualpipe`'s steps 1 to 8)."""
    half, h = m // 2, min(rank, p - 1 - rank)
    n = p // 2 - h - 1
    second = int(rank >= p // 2)
    turn = (h + 1) // 2  # step 6 defers from here: both W's if h is odd, else B0's
    step6 = [op for i in range(h + 1) for op in
             (("b1" if i > turn or (i == turn and h % 2) else "B1"),
              ("b0" if i >= turn else "B0"))]
    program = (["F0"] * 2 * n + ["F0", "F1"] * (h + 1) + ["b1", "W", "F1"] * n
               + ["F0", "B1", "F1", "B0"] * (half - p + h + 1) + ["B1", "F1", "B0"] * n
               + step6 + ["W", "b0"] * n)
    out: list[Action] = []
    next_of = {"F": [0, 0], "B": [0, 0]}
    deferred: deque[Action] = deque()
    for op in program:
        if op == "W":
            out.append(deferred.popleft())
            continue
        phase = int(op[1])
        chunk = phase ^ second
        kind = op[0].upper()
        k = next_of[kind][phase]
        next_of[kind][phase] += 1
        action = Action(rank, kind, k + half * chunk, chunk)
        out.append(action)
        if kind == "B":
            (deferred if op[0] == "b" else out).append(Action(rank, "W", action.microbatch, chunk))
    return out + list(deferred)


def reference_wait_graph(order, route, gradient_after_weights=False):
    """(actions, needs, senders, rows) as the wait graph was walked: a dict per route,
    sweeps over the stages, the rows made afterwards from the actions."""
    p = len(order)
    chunks = 1 + max((a.chunk for row in order for a in row), default=0)
    m = 1 + max((a.microbatch for row in order for a in row), default=0)
    positions: dict = {}
    index_of, lasts = [], []
    for mb in range(m):
        hops = route(mb)
        if hops not in positions:
            positions[hops] = {hop: k for k, hop in enumerate(hops)}
        index_of.append(positions[hops])
        lasts.append(len(hops) - 1)
    width = 1 + max(lasts, default=0)
    produced = [0] * (3 * m * width)
    sender_of = [0] * (3 * m * width)
    actions, needs, senders = [], [], []
    position = [0] * p
    progress = True
    while progress:
        progress = False
        for s, row in enumerate(order):
            at = position[s]
            while at < len(row):
                a = row[at]
                mb = a.microbatch
                k = index_of[mb][(s, a.chunk)]
                own_f = mb * width + k
                if a.kind == "F":
                    need = own_f - 1 if k > 0 else -1
                elif a.kind == "B":
                    if k < lasts[mb]:
                        need = (2 * m + mb) * width + k + 1
                        if not produced[own_f]:
                            break
                    else:
                        need = own_f
                else:
                    need = (m + mb) * width + k
                if need < 0:
                    j, sender = 0, s
                else:
                    j = produced[need]
                    if not j:
                        break
                    sender = sender_of[need]
                actions.append(a)
                needs.append(j)
                senders.append(sender)
                number = len(actions)
                if a.kind == "F":
                    done = (own_f,)
                elif a.kind == "B":
                    gradient = (2 * m + mb) * width + k
                    done = ((m + mb) * width + k,) if gradient_after_weights else \
                        ((m + mb) * width + k, gradient)
                else:
                    done = ((2 * m + mb) * width + k,) if gradient_after_weights else ()
                for slot in done:
                    produced[slot], sender_of[slot] = number, s
                at += 1
                progress = True
            position[s] = at
    if any(position[s] < len(row) for s, row in enumerate(order)):
        raise ValueError("schedule cannot finish")
    rows = []
    for a, j, sender in zip(actions, needs, senders, strict=True):
        s = a.stage
        hop = 0 if sender == s or a.kind == "W" else (
            1 + sender if s == sender + 1 else 1 + p + sender)
        rows.append((s, 3 * (chunks * s + a.chunk) + KINDS[a.kind], j, hop))
    return tuple(actions), tuple(needs), tuple(senders), tuple(rows)


@pytest.mark.parametrize("p", [2, 4, 6, 8, 12, 16, 24])
def test_chimera_equals_the_merged_timelines(p: int) -> None:
    """Every whole number of units up to 6, action for action."""
    for m in range(p, 6 * p + 1, p):
        assert build("chimera", p, m) == reference_chimera(p, m)


@pytest.mark.parametrize("p", [2, 4, 6, 8, 12, 16])
def test_dualpipe_equals_the_step_by_step_order(p: int) -> None:
    for m in range(2 * p, 6 * p + 1, 2):
        assert build("dualpipe", p, m) == [reference_dualpipe_rank(p, m, r) for r in range(p)]


CASES = [(name, p, m, v) for name in SCHEDULES for p in (1, 2, 3, 4, 6, 8)
         for m in (1, 2, 3, 4, 6, 8, 12, 16, 24) for v in (1, 2, 3)]


def _valid(name: str, p: int, m: int, v: int):
    try:
        return build(name, p, m, v)
    except (ValueError, llmsim.UserError):  # a shape the schedule refuses
        return None


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_the_wait_graph_equals_the_reference(name: str) -> None:
    """Every schedule over a grid of p, m, v, the input gradient leaving after B or after
    W: the same actions, waits, senders and rows."""
    checked = 0
    for _, p, m, v in (case for case in CASES if case[0] == name):
        order = _valid(name, p, m, v)
        if order is None:
            continue
        route = SCHEDULES[name].route_of(p, m, v)
        for after_weights in (False, True):
            try:
                expected = reference_wait_graph(order, route, after_weights)
            except ValueError:
                with pytest.raises(ValueError, match="cannot finish"):
                    wait_graph(order, route, gradient_after_weights=after_weights)
                continue
            graph = wait_graph(order, route, gradient_after_weights=after_weights)
            assert (graph.actions, graph.needs, graph.senders, graph.rows()) == expected
            checked += 1
    assert checked


@settings(max_examples=60, deadline=None)
@given(p=st.sampled_from([2, 4, 6, 8, 10]), units=st.integers(1, 8),
       name=st.sampled_from(["chimera", "dualpipe", "zb-v", "zb-h2"]))
def test_the_walk_keys_graphs_equal_the_references(p: int, units: int, name: str) -> None:
    """The searched two-pipeline and greedy orders at random shapes: the wait graph with
    the search's gradient rule (after W where the backward is fused)."""
    m = units * p if name == "chimera" else 2 * p + 2 * units
    v = 2 if name == "zb-v" else 1
    order = build(name, p, m, v)
    route = SCHEDULES[name].route_of(p, m, v)
    after_weights = name not in SPLIT_BACKWARD
    graph = wait_graph(order, route, gradient_after_weights=after_weights)
    assert (graph.actions, graph.needs, graph.senders, graph.rows()) == \
        reference_wait_graph(order, route, after_weights)


def test_actions_are_shared_and_equal(monkeypatch: pytest.MonkeyPatch) -> None:
    """The table gives equal actions, the same objects on a second call, and equal ones
    again once it has started over past its bound."""
    monkeypatch.setattr(action_table, "_TABLE", {})
    monkeypatch.setattr(action_table, "_HELD", [0])
    monkeypatch.setattr(action_table, "MAX_ACTIONS", 10)
    first = action_table.actions(3, "B", 1, 4)
    assert first[:4] == [Action(3, "B", mb, 1) for mb in range(4)]
    assert action_table.actions(3, "B", 1, 2) is first
    longer = action_table.actions(3, "B", 1, 6)  # a longer list, the same first actions
    assert longer == [Action(3, "B", mb, 1) for mb in range(6)] and len(first) == 4
    assert all(a is b for a, b in zip(first, longer, strict=False))
    fresh = action_table.actions(0, "F", 0, 8)  # past the bound: starts again
    assert fresh == [Action(0, "F", mb, 0) for mb in range(8)]
    assert action_table._HELD[0] == 8
    assert action_table.actions(3, "B", 1, 2) == [Action(3, "B", mb, 1) for mb in range(2)]
