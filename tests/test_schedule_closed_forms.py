"""The closed forms of the schedules added to the registry (ZB-H2, ZB-V, Chimera,
PipeDream) against their orders in the reference timing, and every registry entry's
peak in-flight closed form against its order."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmsim.errors import UserError
from llmsim.schedules import SCHEDULES, Timeline, build, peak_in_flight, unit_timeline


def _idle(timeline: Timeline) -> list[Fraction]:
    """Per stage, step time − busy time (the step ends with the last pass of any stage)."""
    step = max(Fraction(end) for row in timeline for _, end, _ in row)
    return [step - sum(Fraction(e) - Fraction(s) for s, e, _ in row) for row in timeline]


def _span_idle(row: list) -> Fraction:
    """Idle time of one stage between its own first start and last end."""
    busy = sum(Fraction(e) - Fraction(s) for s, e, _ in row)
    return Fraction(row[-1][1]) - Fraction(row[0][0]) - busy


def _cases(name: str) -> list[tuple[int, int, int]]:
    if name == "chimera":
        return [(p, k * p, 1) for p in (2, 4, 6, 8) for k in (1, 2, 3)]
    if name == "dualpipe":  # an even p and an even m ≥ 2p
        return [(p, m, 1) for p in (2, 4, 6, 8) for m in (2 * p, 2 * p + 2, 4 * p)]
    if name == "interleaved-1f1b":
        return [(p, k * p, v) for p in (1, 2, 4) for k in (1, 2, 3) for v in (2, 3)]
    if name == "pipedream":  # no flush: the steady state of a run of m ≥ p micro-batches
        return [(p, m, 1) for p in (1, 2, 3, 4, 6) for m in (p, p + 1, 2 * p + 3)]
    v = 2 if name == "zb-v" else 1
    return [(p, m, v) for p in (1, 2, 3, 4, 6) for m in (1, 2, 3, 5, 8, 13)]


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_every_registered_peak_closed_form_equals_its_order(name: str) -> None:
    info = SCHEDULES[name]
    for p, m, v in _cases(name):
        expected = [info.peak_forwards(p, i, m, v) for i in range(p)]
        if name == "zb-h1":  # the memory model counts the p − i waiting for B; the
            expected = [min(p, m)] * p  # i waiting for W keep less (Qi et al. §2.1)
        assert peak_in_flight(build(name, p, m, v)) == expected, (p, m, v)


# ---------------------------------------------------------------- ZB-H2


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 6), st.integers(0, 6), st.integers(1, 4), st.integers(1, 4), st.data())
def test_zb_h2_bubble_is_table_2_on_the_first_stage_and_the_step_closed_form(
    p: int, extra: int, f: int, b: int, data: st.DataObject
) -> None:
    # Qi et al. 2024 Table 2: (p−1)(T_F + T_B − 2T_W), for m ≥ 2p − 1, T_W ≤ T_F, T_B.
    w = data.draw(st.integers(1, min(f, b)))
    m = 2 * p - 1 + extra
    timeline = unit_timeline(build("zb-h2", p, m), f=f, b=b, w=w)
    assert _span_idle(timeline[0]) == (p - 1) * (f + b - 2 * w)
    assert all(_span_idle(row) <= _span_idle(timeline[0]) for row in timeline)
    # With the optimizer's synchronisation the step ends with stage 0 or stage p − 1.
    bubble = SCHEDULES["zb-h2"].bubble(p, m, 1, f, b, w)
    assert bubble == (p - 1) * max(f, f + b - 2 * w)
    assert _idle(timeline) == [bubble] * p


@pytest.mark.parametrize("p", [2, 3, 4, 8])
def test_zb_h2_is_a_parallelogram_with_equal_passes_and_twice_the_memory(p: int) -> None:
    m = 3 * p
    timeline = unit_timeline(build("zb-h2", p, m))
    # Stage i starts at i and never idles until it ends at i + 3m (§2.2, Fig. 3 bottom).
    assert [(row[0][0], row[-1][1]) for row in timeline] == [(i, i + 3 * m) for i in range(p)]
    assert [_span_idle(row) for row in timeline] == [0] * p
    assert peak_in_flight(build("zb-h2", p, m)) == [2 * p - 1] * p  # (2p − 1)·M_B
    assert peak_in_flight(build("zb-h1", p, m)) == [p] * p          # p·M_B


# ---------------------------------------------------------------- ZB-V


@pytest.mark.parametrize("p", [1, 2, 3, 4])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_zb_v_idles_p_minus_1_chunk_passes_and_holds_1f1b_s_memory(p: int, k: int) -> None:
    m = k * p
    schedule = build("zb-v", p, m, 2)
    # Equal pass times t of a chunk (half a stage): (p − 1)·t, half ZB-H1's (p − 1)·2t.
    assert _idle(unit_timeline(schedule)) == [p - 1] * p
    assert SCHEDULES["zb-v"].bubble(p, m, 2, 2, 2, 2) == p - 1
    # 2p chunk-micro-batches of half a stage: p·M_B, 1F1B's first stage.
    assert peak_in_flight(schedule) == [2 * p] * p
    route = schedule.route
    assert route is not None
    assert route(0) == tuple((s, 0) for s in range(p)) + tuple((s, 1) for s in reversed(range(p)))


@pytest.mark.parametrize("p", [5, 6, 8, 10])
def test_zb_v_greedy_order_stays_within_two_chunk_passes_of_the_form(p: int) -> None:
    # Above p = 4 the greedy order (not the paper's handcrafted one) may idle up to
    # 2 chunk passes more; docs/schedules.md says so.
    for m in (p, 2 * p):
        idle = _idle(unit_timeline(build("zb-v", p, m, 2)))
        assert all(p - 1 <= x <= p + 1 for x in idle)


def test_zb_v_needs_two_chunks() -> None:
    with pytest.raises(UserError, match=r"set parallelism\.virtual_stages to 2"):
        build("zb-v", 4, 8, 1)


# ---------------------------------------------------------------- Chimera


@pytest.mark.parametrize("p", [2, 4, 6, 8, 12])
@pytest.mark.parametrize("k", [1, 2, 3, 5])
@pytest.mark.parametrize(("f", "b", "w"), [(1, 1, 1), (1, 2, 0), (2, 3, 1), (1, 1, 0),
                                           (3, 2, 0)])
def test_chimera_bubble_closed_form(p: int, k: int, f: int, b: int, w: int) -> None:
    m = k * p
    timeline = unit_timeline(build("chimera", p, m), f=f, b=b, w=w)
    expected = SCHEDULES["chimera"].bubble(p, m, 1, f, b, w)
    assert expected == (p - 2) * max(f, b)  # the basic units concatenated: no growth in m
    assert _idle(timeline) == [expected] * p
    if f == b:  # Li & Hoefler 2021 Table 1: (p/2 − 1)(t_F + t_B), ratio (D−2)/(2N+D−2)
        assert expected == (p // 2 - 1) * (f + b)


def test_chimera_paper_bubble_is_out_of_reach_when_the_backward_is_twice_the_forward(
) -> None:
    """p = 4, m = 4, t_F = 1, t_B = 2 (fused): the least makespan over every order (all
    active schedules, which hold an optimal one: Giffler & Thompson 1960) is 16, idle 4 =
    (p − 2)·t_B, not the paper's (p/2 − 1)(t_F + t_B) = 3."""
    p, m = 4, 4
    route = build("chimera", p, m).route
    passes = [(hop[0], kind, mb, k) for mb in range(m) for k, hop in enumerate(route(mb))
              for kind in "FB"]
    duration = {"F": 1, "B": 2}

    def deps(a: tuple) -> list[tuple]:
        _, kind, mb, k = a
        hops = route(mb)
        if kind == "F":
            return [(hops[k - 1][0], "F", mb, k - 1)] if k else []
        return [(hops[k + 1][0], "B", mb, k + 1)] if k < p - 1 else [(a[0], "F", mb, k)]

    best = [10**9]
    work = [sum(duration[a[1]] for a in passes if a[0] == s) for s in range(p)]

    def search(end: dict, free: list[int], left: list[int]) -> None:
        if len(end) == len(passes):
            best[0] = min(best[0], max(end.values()))
            return
        if max(f + w for f, w in zip(free, left, strict=True)) >= best[0]:
            return
        ready = [(max([free[a[0]], *(end[d] for d in deps(a))]), a) for a in passes
                 if a not in end and all(d in end for d in deps(a))]
        start = min(t for t, _ in ready)
        s = min(a[0] for t, a in ready if t == start)
        soonest = min(t + duration[a[1]] for t, a in ready if a[0] == s)
        for t, a in sorted(x for x in ready if x[1][0] == s and x[0] < soonest):
            end[a], was = t + duration[a[1]], free[s]
            free[s], left[s] = end[a], left[s] - duration[a[1]]
            search(end, free, left)
            free[s], left[s] = was, left[s] + duration[a[1]]
            del end[a]

    search({}, [0] * p, work)
    assert best[0] - 3 * m == 4 == SCHEDULES["chimera"].bubble(p, m, 1, 1, 2, 0)
    assert best[0] - 3 * m > (p // 2 - 1) * (1 + 2)


def test_chimera_has_fewer_bubbles_than_1f1b_and_two_weight_copies() -> None:
    p, m = 4, 4
    chimera = _idle(unit_timeline(build("chimera", p, m), f=1, b=2, w=0))
    one_f_one_b = _idle(unit_timeline(build("1f1b", p, m), f=1, b=2, w=0))
    assert chimera[0] < one_f_one_b[0]  # 4 against (p − 1)(t_F + t_B) = 9
    # Li & Hoefler 2021 Table 1: activations between (p/2 + 1)·M_a and p·M_a; 2·M_θ.
    assert peak_in_flight(build("chimera", p, m)) == [3, 4, 4, 3]
    # Two pipelines: each device holds its own stage and the up pipeline's replica of
    # stage p − 1 − i (the memory model adds both; tests/test_engine_schedules.py).
    assert SCHEDULES["chimera"].pipelines == 2


@pytest.mark.parametrize(("p", "m"), [(3, 6), (4, 6)])
def test_chimera_needs_an_even_pipeline_and_whole_units(p: int, m: int) -> None:
    with pytest.raises(UserError, match="even number of stages and whole units"):
        build("chimera", p, m)


# ---------------------------------------------------------------- PipeDream


@pytest.mark.parametrize("p", [1, 2, 4, 8])
@pytest.mark.parametrize("m", [4, 8])
def test_pipedream_fills_once_per_run_so_a_step_in_steady_state_has_no_bubble(
    p: int, m: int
) -> None:
    # K steps without a flush: the fill and drain (p − 1)(t_F + t_B) are paid once, so
    # each further step adds exactly m·(t_F + t_B): the steady-state throughput of
    # Narayanan et al. 2019 §3.2 (one micro-batch per t_F + t_B per stage).
    def step(k: int) -> Fraction:
        timeline = unit_timeline(build("pipedream", p, k * m), f=1, b=2, w=0)
        return max(Fraction(end) for row in timeline for _, end, _ in row)

    assert step(1) == 3 * m + 3 * (p - 1)
    assert step(3) - step(2) == step(2) - step(1) == 3 * m
    assert SCHEDULES["pipedream"].bubble(p, m, 1, 1, 2, 0) == 0


@pytest.mark.parametrize("p", [1, 2, 4, 8])
@pytest.mark.parametrize("m", [1, 3, 8])
def test_pipedream_stashes_one_weight_version_per_micro_batch_in_flight(p: int, m: int) -> None:
    info = SCHEDULES["pipedream"]
    # Steps of m micro-batches run without a flush: the steady state of a long run.
    for i, row in enumerate(build("pipedream", p, m * (2 * p + 1))):
        # Each backward updates the weights at once; a micro-batch's forward used the
        # version after the updates before it, which stays stashed until its backward.
        version, used, most = 0, {}, 0
        for action in row:
            if action.kind == "F":
                used[action.microbatch] = version
            elif action.kind == "W":
                del used[action.microbatch]
                version += 1
            most = max(most, len(set(used.values()) | {version}))
        assert most == info.weight_versions(p, i, m) == p - i
