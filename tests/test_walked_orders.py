"""Orders built together with their wait graphs: ZB-V's and ZB-H2's greedy scheduler
(:func:`llmsim.schedules.orders.greedy_order`'s ``graph``) and Chimera's merge
(:func:`llmsim.schedules.chimera.chimera_walked`) number the passes as they make them,
where :func:`llmsim.schedules.walk.wait_graph` sweeps the finished order again. The
numbering differs; the graph must not: every pass (a stage's n-th) waits for the same
pass with the same hop and duration column, and every pass comes after the one it waits
for, so a replay gives every pass the same end, bit for bit. The search's compiled
two-pipeline orders are checked against the implementation they replaced (as it was at
16721c8), walk for walk."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmsim.schedules import SCHEDULES, SPLIT_BACKWARD, build
from llmsim.schedules.chimera import chimera_walked
from llmsim.schedules.orders import greedy_order
from llmsim.schedules.registry import walked
from llmsim.schedules.route import bidirectional, looping, v_shape
from llmsim.schedules.walk import replay, rows_table, wait_graph
from llmsim.schedules.walk_kernel import replay_ends
from llmsim.search import two_pipelines


def by_position(p: int, rows) -> dict[tuple[int, int], tuple]:
    """Each pass, named (stage, its index on the stage), → (duration column, the pass it
    waits for named so, or None, hop); and every pass after the one it waits for."""
    name, seen, out = [None], [0] * p, {}
    for k, (s, column, j, hop) in enumerate(rows, start=1):
        assert 0 <= j < k, "a pass before the one it waits for"
        name.append((s, seen[s]))
        seen[s] += 1
        out[name[k]] = (column, name[j], hop)
    return out


def assert_same_graph(order, rows, route, after_weights: bool) -> None:
    """``rows`` are ``order``'s wait graph (as :func:`wait_graph` finds it), its passes
    numbered in some valid order, each stage's in the stage's order."""
    p = len(order)
    expected = wait_graph(order, route, gradient_after_weights=after_weights).rows()
    assert len(rows) == len(expected)
    assert by_position(p, rows) == by_position(p, expected)
    # and so the same floats: a replay with random times, by the loop and compiled
    rng = random.Random(len(rows))
    chunks = 1 + max(a.chunk for row in order for a in row)
    durations = [rng.random() for _ in range(3 * chunks * p)]
    hops = [0.0] + [rng.random() for _ in range(2 * p)]
    ends, free = replay(p, rows, durations, hops)
    ends_ref, free_ref = replay(p, expected, durations, hops)
    assert free == free_ref
    names = list(by_position(p, rows))
    names_ref = list(by_position(p, expected))
    assert dict(zip(names, ends[1:], strict=True)) == \
        dict(zip(names_ref, ends_ref[1:], strict=True))
    assert replay_ends(p, rows_table(rows), durations, hops)[1] == free_ref


@settings(max_examples=150, deadline=None)
@given(p=st.integers(1, 9), m=st.integers(1, 30), v=st.booleans(), fused=st.booleans(),
       times=st.tuples(st.integers(1, 3), st.integers(1, 3), st.integers(1, 3)),
       extra=st.integers(0, 6))
def test_the_greedy_scheduler_makes_the_orders_wait_graph(p, m, v, fused, times,
                                                         extra) -> None:
    """Any shape, memory limit (an integer), fused or split backward and pass times: the
    same order with and without ``graph``, and its graph."""
    route, low = (v_shape(p), 2) if v else (looping(p, 1), 1)
    graph: list = []
    try:
        order = greedy_order(p, m, route, low + extra, fused=fused, times=times, graph=graph)
    except ValueError:  # no stage can move at this limit
        return
    assert order == greedy_order(p, m, route, low + extra, fused=fused, times=times)
    assert_same_graph(order, tuple(graph), route, after_weights=False)


@settings(max_examples=40, deadline=None)
@given(p=st.sampled_from([2, 4, 6, 8, 10, 12]), units=st.integers(1, 6))
def test_chimera_makes_its_wait_graph_with_its_order(p: int, units: int) -> None:
    """The input gradient leaving after W (its fused backward)."""
    m = units * p
    order, rows = chimera_walked(p, m, 1)
    assert order == build("chimera", p, m)
    assert_same_graph(order, rows, bidirectional(p), after_weights=True)


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_walked_gives_builds_order_and_rows_only_where_made(name: str) -> None:
    """:func:`walked`: :func:`build`'s order for every schedule, with the rows of the
    schedules that make them (ZB-V, ZB-H2, Chimera) and None for the others."""
    checked = 0
    for p in (1, 2, 3, 4, 6):
        for m in (2, 4, 6, 8, 12, 24):
            for v in (1, 2):
                try:
                    expected = build(name, p, m, v)
                except (ValueError, Exception):  # a shape the schedule refuses
                    continue
                order, rows = walked(name, p, m, v)
                assert order == expected
                assert getattr(order, "route", None) is not None or \
                    getattr(expected, "route", None) is None
                if SCHEDULES[name].walked is None:
                    assert rows is None
                else:
                    assert_same_graph(order, rows, SCHEDULES[name].route_of(p, m, v),
                                      after_weights=name not in SPLIT_BACKWARD)
                checked += 1
    assert checked
    assert {n for n, info in SCHEDULES.items() if info.walked} == {"zb-v", "zb-h2", "chimera"}


def reference_compile(schedule: str, p: int, m: int) -> two_pipelines.CompiledOrder:
    """``two_pipelines._compile`` as it was at 16721c8: the graph from :func:`wait_graph`,
    the pairs' columns looked up by action, the last W by action."""
    order = build(schedule, p, m)
    graph = wait_graph(order, SCHEDULES[schedule].route_of(p, m, 1),
                       gradient_after_weights=schedule not in SPLIT_BACKWARD)
    find_pairs = SCHEDULES[schedule].overlapped_pairs
    paired: dict = {}
    for actions in order if find_pairs is not None else ():
        for i, j in find_pairs(actions):
            for a in (actions[i], actions[j]):
                paired[a] = 6 * p + 4 * a.stage + 2 * a.chunk + (a.kind == "B")
    rows = graph.rows() if not paired else tuple(
        (s, paired.get(a, column), j, hop)
        for (s, column, j, hop), a in zip(graph.rows(), graph.actions, strict=True))
    last_w = {(a.stage, a.chunk): k for k, a in enumerate(graph.actions, start=1)
              if a.kind == "W"}
    return two_pipelines.CompiledOrder(p, rows_table(rows), last_w)


@pytest.mark.parametrize("schedule", ["chimera", "dualpipe"])
def test_compiled_two_pipeline_orders_walk_as_before(schedule: str) -> None:
    """The same graph (DualPipe's rows equal; Chimera's numbered otherwise), and the ends
    the search reads — each device's last pass, each (device, chunk)'s last W — equal."""
    for p in (2, 4, 6, 8):
        for m in range(2 * p, 6 * p + 1, p):
            if not two_pipelines.allows(schedule, p, m):
                continue
            new = two_pipelines._compile(schedule, p, m)
            old = reference_compile(schedule, p, m)
            assert by_position(p, new.passes) == by_position(p, old.passes)
            assert set(new.last_w) == set(old.last_w)  # read by key
            if schedule == "dualpipe":
                assert (new.passes, new.last_w) == (old.passes, old.last_w)
            rng = random.Random(p * m)
            durations = [rng.random() for _ in range(6 * p + 4 * p)]
            hops = [0.0] + [rng.random() for _ in range(2 * p)]
            ends_new, last_new = replay(p, new.passes, durations, hops)
            ends_old, last_old = replay(p, old.passes, durations, hops)
            assert last_new == last_old  # each device's last pass's end
            assert {held: ends_new[k] for held, k in new.last_w.items()} == \
                {held: ends_old[k] for held, k in old.last_w.items()}


def test_schedule_walked_hands_the_rows_out_once() -> None:
    """The memo of the last two shapes keeps the order; the rows go to the first caller
    (the walk's compile) and a second call gets None, whose caller finds them again."""
    from llmsim.in_flight import _walked, schedule_order, schedule_walked

    _walked.cache_clear()
    order, rows = schedule_walked("zb-v", 4, 8, 2)
    assert order == schedule_order("zb-v", 4, 8, 2) == tuple(map(tuple, build("zb-v", 4, 8, 2)))
    assert_same_graph(order, rows, SCHEDULES["zb-v"].route_of(4, 8, 2), after_weights=False)
    assert schedule_walked("zb-v", 4, 8, 2) == (order, None)
    assert schedule_walked("dualpipe", 4, 8, 1)[1] is None  # made by wait_graph
