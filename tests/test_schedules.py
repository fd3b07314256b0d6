"""Pipeline schedules: completeness, dependencies, bubble closed forms, memory, printing."""

from __future__ import annotations

import dataclasses
import itertools
from collections import Counter
from fractions import Fraction
from typing import get_args

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmsim.errors import UserError
from llmsim.schedules import (
    SCHEDULES,
    Action,
    Schedule,
    Timeline,
    aligned_grad_syncs,
    build,
    format_grid,
    idle_fractions,
    peak_in_flight,
    route_of,
    to_dataframe,
    unit_timeline,
)
from llmsim.specs import ScheduleName
from llmsim.specs.parallelism_rules import NOT_REPLAYED

FLAT = ("gpipe", "1f1b", "zb-h1")


@st.composite
def configurations(draw: st.DrawFn) -> tuple[str, int, int, int]:
    """Any valid (name, p, m, v): interleaved needs v ≥ 2 and p | m."""
    name = draw(st.sampled_from(sorted(SCHEDULES)))
    stages = draw(st.integers(1, 8))
    if name == "interleaved-1f1b":
        return name, stages, stages * draw(st.integers(1, 4)), draw(st.integers(2, 4))
    if name == "chimera":  # two pipelines: an even p, whole units of p micro-batches
        stages = 2 * draw(st.integers(1, 4))
        return name, stages, stages * draw(st.integers(1, 3)), 1
    if name == "dualpipe":  # an even p, an even m ≥ 2p (deepseek-ai/DualPipe)
        stages = 2 * draw(st.integers(1, 4))
        return name, stages, 2 * stages + 2 * draw(st.integers(0, 4)), 1
    return name, stages, draw(st.integers(1, 20)), 2 if name == "zb-v" else 1


def _step(timeline: Timeline) -> Fraction:
    return max(Fraction(end) for row in timeline for _, end, _ in row)


def _idle(timeline: Timeline) -> list[Fraction]:
    """Per stage, step time − busy time, exact for integer or Fraction durations."""
    step = _step(timeline)
    return [
        step - sum(Fraction(end) - Fraction(start) for start, end, _ in row) for row in timeline
    ]


# ---------------------------------------------------------------- actions and registry


def test_action_prints_compactly_like_torchtitan() -> None:
    assert str(Action(2, "F", 0)) == "2F0"
    assert str(Action(0, "W", 13)) == "0W13"
    assert str(Action(2, "F", 0, chunk=1)) == "2F0c1"
    assert Action(3, "B", 5, 2).cell(show_chunk=True) == "B5c2"
    assert Action(3, "B", 5).cell(show_chunk=False) == "B5"


def test_action_is_a_frozen_hashable_value() -> None:
    action = Action(1, "B", 2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        action.stage = 0  # type: ignore[misc]
    assert action == Action(1, "B", 2, 0)
    assert len({action, Action(1, "B", 2)}) == 1


def test_registry_matches_the_names_the_specs_accept() -> None:
    assert set(SCHEDULES) == set(get_args(ScheduleName))
    assert {n for n, info in SCHEDULES.items() if not info.replayed} == set(NOT_REPLAYED)


# ---------------------------------------------------------------- structure


@settings(max_examples=150, deadline=None)
@given(configurations())
def test_every_microbatch_chunk_gets_one_f_one_b_one_w_per_stage(
    config: tuple[str, int, int, int],
) -> None:
    name, p, m, v = config
    schedule = build(name, p, m, v)
    assert len(schedule) == p
    # Every micro-batch visits each (stage, chunk) of its route once; with the looping
    # placement that is every chunk of every stage.
    route = route_of(schedule)
    expected = Counter(
        (s, kind, mb, c) for mb in range(m) for s, c in route(mb) for kind in "FBW"
    )
    if SCHEDULES[name].route is None:
        assert expected == Counter(
            (s, kind, mb, c) for s in range(p) for kind in "FBW" for mb in range(m)
            for c in range(v))
    seen = Counter((a.stage, a.kind, a.microbatch, a.chunk) for row in schedule for a in row)
    assert seen == expected
    assert all(a.stage == s for s, row in enumerate(schedule) for a in row)


def _dependencies_met(schedule: Schedule, timeline: Timeline) -> None:
    """Restates the dependency rules on the virtual stages of each micro-batch's route
    (c·p + s for the looping placement, Narayanan et al. §2.2)."""
    route = route_of(schedule)
    times = {a: (start, end) for row in timeline for start, end, a in row}

    def at(kind: str, virtual: int, mb: int) -> Action:
        stage, chunk = route(mb)[virtual]
        return Action(stage, kind, mb, chunk)  # type: ignore[arg-type]

    for action, (start, _) in times.items():
        mb = action.microbatch
        virtual = route(mb).index((action.stage, action.chunk))
        last = len(route(mb)) - 1
        if action.kind == "F" and virtual > 0:
            assert start >= times[at("F", virtual - 1, mb)][1]
        if action.kind == "B":
            before = at("B", virtual + 1, mb) if virtual < last else at("F", virtual, mb)
            assert start >= times[before][1]
        if action.kind == "W":
            assert start >= times[at("B", virtual, mb)][1]
    for row, steps in zip(schedule, timeline, strict=True):
        assert [a for _, _, a in steps] == row
        assert all(e0 <= s1 for (_, e0, _), (s1, _, _) in itertools.pairwise(steps))


@settings(max_examples=100, deadline=None)
@given(configurations(), st.integers(1, 3), st.integers(1, 3), st.integers(0, 3))
def test_unit_timeline_respects_dependencies_and_stage_order(
    config: tuple[str, int, int, int], f: int, b: int, w: int
) -> None:
    name, p, m, v = config
    schedule = build(name, p, m, v)
    _dependencies_met(schedule, unit_timeline(schedule, f=f, b=b, w=w))


def test_fused_schedules_run_each_w_right_after_its_b() -> None:
    for name, v in (("gpipe", 1), ("1f1b", 1), ("interleaved-1f1b", 2)):
        for row in build(name, 4, 8, v):
            for before, after in itertools.pairwise(row):
                if before.kind == "B":
                    assert after == dataclasses.replace(before, kind="W")


# ---------------------------------------------------------------- bubble closed forms
# The closed forms (Narayanan et al. 2021 §2.2) treat the backward as one block B+W that
# must finish before the previous stage's backward starts, so the check uses F = 1,
# B = 2, W = 0 per chunk (t_b = 2·t_f). With separate B and W of 1 each the previous
# stage may start after B alone, which is what ZB-H1 exploits.


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p", [1, 2, 3, 4, 6, 8])
@pytest.mark.parametrize("m", [1, 2, 3, 5, 8, 13, 16])
def test_bubble_of_gpipe_and_1f1b_is_p_minus_1_over_m_plus_p_minus_1(
    name: str, p: int, m: int
) -> None:
    timeline = unit_timeline(build(name, p, m), f=1, b=2, w=0)
    assert _step(timeline) == 3 * (m + p - 1)
    assert all(idle / _step(timeline) == Fraction(p - 1, m + p - 1) for idle in _idle(timeline))
    assert idle_fractions(timeline) == pytest.approx([(p - 1) / (m + p - 1)] * p, rel=1e-12)


@pytest.mark.parametrize("p", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("groups", [1, 2, 3, 4])
@pytest.mark.parametrize("v", [2, 3, 4])
def test_bubble_of_interleaved_1f1b_is_p_minus_1_over_vm_plus_p_minus_1(
    p: int, groups: int, v: int
) -> None:
    m = p * groups
    # A chunk holds 1/v of a stage's layers: F = 1/v, B+W = 2/v of a stage's time.
    timeline = unit_timeline(build("interleaved-1f1b", p, m, v), Fraction(1, v), Fraction(2, v), 0)
    # Step = m·(t_f + t_b) + (p−1)·(t_f + t_b)/v with t_f = 1, t_b = 2 (Narayanan et al. §2.2).
    assert _step(timeline) == 3 * m + Fraction(3 * (p - 1), v)
    assert all(idle / _step(timeline) == Fraction(p - 1, v * m + p - 1) for idle in _idle(timeline))


@pytest.mark.parametrize("p", [2, 3, 4, 6, 8])
@pytest.mark.parametrize("extra", [0, 1, 5, 12])
def test_zb_h1_bubble_is_a_third_of_1f1b_when_f_b_w_are_equal(p: int, extra: int) -> None:
    m = p + extra
    zb = _idle(unit_timeline(build("zb-h1", p, m), f=1, b=1, w=1))
    # Qi et al. 2024 Table 2: (p−1)(T_F + T_B − T_W) against 1F1B's (p−1)(T_F + T_B + T_W).
    assert zb == [p - 1] * p
    fused = _idle(unit_timeline(build("1f1b", p, m), f=1, b=2, w=0))
    assert fused == [3 * (p - 1)] * p
    # Split but not moved, 1F1B's W no longer delays the previous stage: (p−1)(T_F + T_B).
    split = _idle(unit_timeline(build("1f1b", p, m), f=1, b=1, w=1))
    assert split == [2 * (p - 1)] * p
    assert all(z < s for z, s in zip(zb, split, strict=True))


@settings(max_examples=80, deadline=None)
@given(st.integers(2, 8), st.integers(0, 12), st.integers(1, 5), st.integers(1, 5), st.data())
def test_zb_h1_bubble_matches_table_2_when_w_is_the_shortest_pass(
    p: int, extra: int, f: int, b: int, data: st.DataObject
) -> None:
    # Table 2 of Qi et al. 2024 holds for m ≥ p and T_W ≤ T_F, T_B (their Table 1 setting).
    w = data.draw(st.integers(1, min(f, b)))
    timeline = unit_timeline(build("zb-h1", p, p + extra), f=f, b=b, w=w)
    assert _idle(timeline) == [(p - 1) * (f + b - w)] * p


# ---------------------------------------------------------------- activation memory


@pytest.mark.parametrize("p", [1, 2, 4, 8])
@pytest.mark.parametrize("m", [1, 3, 4, 8, 16])
def test_peak_in_flight_of_the_flat_schedules(p: int, m: int) -> None:
    assert peak_in_flight(build("gpipe", p, m)) == [m] * p
    assert peak_in_flight(build("1f1b", p, m)) == [min(p - i, m) for i in range(p)]
    # Qi et al. 2024 §2.3: every ZB-H1 worker holds p micro-batches (B or W pending).
    assert peak_in_flight(build("zb-h1", p, m)) == [min(p, m)] * p


@pytest.mark.parametrize(("p", "m", "v"), [(2, 6, 2), (4, 8, 2), (4, 12, 3), (8, 16, 4)])
def test_peak_in_flight_of_interleaved_is_megatron_warmup_plus_one(p: int, m: int, v: int) -> None:
    expected = [min(2 * (p - i - 1) + (v - 1) * p + 1, v * m) for i in range(p)]
    assert peak_in_flight(build("interleaved-1f1b", p, m, v)) == expected


def test_peak_in_flight_of_interleaved_with_m_equal_p_is_all_forwards_first() -> None:
    assert peak_in_flight(build("interleaved-1f1b", 4, 4, 2)) == [8] * 4


# ---------------------------------------------------------------- printing and tables


def test_format_grid_of_1f1b_4_stages_8_microbatches() -> None:
    rows = format_grid(build("1f1b", 4, 8)).splitlines()
    assert rows[0].split() == [str(t) for t in range(30)]
    cells = [row.split() for row in rows[1:]]
    assert [c[:2] for c in cells] == [["stage", str(s)] for s in range(4)]
    assert cells[0][2:12] == ["F0", "F1", "F2", "F3", ".", ".", ".", "B0", "W0", "F4"]
    assert cells[3][2:11] == [".", ".", ".", "F0", "B0", "W0", "F1", "B1", "W1"]
    assert cells[3][-3:] == [".", ".", "."]


def test_format_grid_golden_for_gpipe_2_by_2() -> None:
    assert format_grid(build("gpipe", 2, 2)) == (
        "         0  1  2  3  4  5  6  7\n"
        "stage 0 F0 F1  .  . B0 W0 B1 W1\n"
        "stage 1  . F0 F1 B0 W0 B1 W1  ."
    )


def test_format_grid_shows_chunks_for_interleaved() -> None:
    first = format_grid(build("interleaved-1f1b", 2, 2, 2)).splitlines()[1].split()
    assert first[2:6] == ["F0c0", "F1c0", "F0c1", "F1c1"]


def test_to_dataframe_has_one_row_per_action_with_unit_times() -> None:
    frame = to_dataframe(build("zb-h1", 3, 5))
    assert list(frame.columns) == ["stage", "order", "kind", "microbatch", "chunk", "start", "end"]
    assert len(frame) == 3 * 5 * 3
    assert ((frame["end"] - frame["start"]) == 1.0).all()
    assert frame.groupby("stage")["order"].apply(list).tolist() == [list(range(15))] * 3
    assert frame["end"].max() == 3 * 5 + 3 - 1


# ---------------------------------------------------------------- errors


def test_unknown_schedule_lists_the_registered_ones() -> None:
    with pytest.raises(UserError, match="unknown name 'hanayo'") as info:
        build("hanayo", 4, 8)
    assert all(name in str(info.value) for name in SCHEDULES)


@pytest.mark.parametrize("name", FLAT)
def test_flat_schedules_reject_several_chunks(name: str) -> None:
    with pytest.raises(UserError, match=r"chunks \(virtual stages\): 2 needs schedule "):
        build(name, 4, 8, 2)


def test_interleaved_needs_two_chunks_or_more() -> None:
    with pytest.raises(UserError, match="set chunks to 2 or more"):
        build("interleaved-1f1b", 4, 8, 1)


def test_interleaved_needs_microbatches_divisible_by_stages() -> None:
    with pytest.raises(UserError, match=r"microbatches: 6 is not divisible by stages \(4\)"):
        build("interleaved-1f1b", 4, 6, 2)


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ((0, 8, 1), "stages"),
        ((4, -1, 1), "microbatches"),
        ((4, 8, 0), "chunks"),
        ((True, 8, 1), "stages"),
    ],
)
def test_sizes_must_be_positive_whole_numbers(args: tuple[int, int, int], field: str) -> None:
    with pytest.raises(UserError, match=rf"^{field}: .* give a whole number ≥ 1$"):
        build("1f1b", *args)


def test_unit_timeline_reports_a_schedule_that_cannot_finish() -> None:
    schedule = build("1f1b", 2, 2)
    schedule[1] = [a for a in schedule[1] if a != Action(1, "B", 1)]
    with pytest.raises(ValueError, match="wait forever at 0B1"):
        unit_timeline(schedule)
    swapped = build("gpipe", 1, 1)
    swapped[0].reverse()
    with pytest.raises(ValueError, match="cannot finish"):
        unit_timeline(swapped)


# ------------------------------------------------- where Megatron-Core issues reductions
def _issued(name: str, stages: int, microbatches: int, chunks: int):
    schedule = build(name, stages, microbatches, chunks)
    return schedule, [aligned_grad_syncs(actions, s, stages, chunks, microbatches)
                      for s, actions in enumerate(schedule)]


def test_interleaved_stage_issues_a_chunk_its_rank_steps_after_its_last_backward() -> None:
    p, m, v = 4, 8, 3
    schedule, syncs = _issued("interleaved-1f1b", p, m, v)
    for stage, (actions, issued) in enumerate(zip(schedule, syncs, strict=True)):
        steps = [i for i, a in enumerate(actions) if a.kind == "W"]
        assert issued is not None and sorted(itertools.chain(*issued.values())) == [0, 1, 2]
        for chunk in range(v):
            last = next(k for k, i in enumerate(steps)
                        if actions[i] == Action(stage, "W", m - 1, chunk))
            at = [i for i, chunks in issued.items() if chunk in chunks]
            # k − stage = last, or after the last backward step when there is no step k
            assert at == [steps[min(last + stage, len(steps) - 1)]]
    # The first stage issues each chunk right after its last micro-batch's backward.
    assert all(schedule[0][i].microbatch == m - 1 for i in syncs[0])
    # Chunk 0 is backward last: every stage issues it after its last backward. The last
    # stage issues chunk 2 three steps after its last backward, in chunk 1's backward.
    for actions, issued in zip(schedule, syncs, strict=True):
        assert 0 in issued[len(actions) - 1]
    assert syncs[p - 1] == {61: [2], 69: [1], 71: [0]}
    assert schedule[p - 1][61] == Action(p - 1, "W", 6, 1)


def test_1f1b_first_stage_uses_its_hooks_the_others_issue_after_their_last_backward() -> None:
    schedule, syncs = _issued("1f1b", 4, 8, 1)
    assert syncs[0] is None
    for actions, issued in zip(schedule[1:], syncs[1:], strict=True):
        assert issued == {len(actions) - 1: [0]} and actions[-1].kind == "W"


def test_without_a_pipeline_every_bucket_is_issued_by_the_hooks() -> None:
    _, syncs = _issued("1f1b", 1, 8, 1)
    assert syncs == [None]
