"""The search's batches (one walk key each) and the memoised two-pipeline walk."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

import llmsim
from llmsim.schedules.walk import replay
from llmsim.search import two_pipelines
from llmsim.search.batching import MAX_BATCH_CORES, batches, walk_key
from llmsim.search.price import state_fits
from llmsim.search.space import SpaceOptions, cores
from llmsim.search.two_pipelines import compiled, walk_ends


def _space(fixed: dict[str, object]) -> list:
    base = llmsim.load_scenario("selene-gpt3").model_copy(update={"fidelity": "reduced"})
    return list(cores(base, SpaceOptions(fixed=fixed), state_fits(base, 0.1)))


SPACE = _space({"tp": 8})


def test_batches_hold_every_core_once_each_of_one_walk_key() -> None:
    cut = batches(SPACE)
    assert Counter(c for batch in cut for c in batch) == Counter(SPACE)
    assert all(len({walk_key(c) for c in batch}) == 1 for batch in cut)
    assert all(0 < len(batch) <= MAX_BATCH_CORES for batch in cut)
    # one batch per walk key here (no key has more cores than a batch holds)
    assert len(cut) == len({walk_key(c) for c in SPACE})
    # within a batch, the enumeration's order
    position = {c: i for i, c in enumerate(SPACE)}
    assert all([position[c] for c in batch] == sorted(position[c] for c in batch)
               for batch in cut)
    assert batches(SPACE) == cut  # the same search, the same batches (--resume)


def test_bounded_batches_go_most_devices_first() -> None:
    cut = batches(SPACE, bounded=True)
    assert Counter(c for batch in cut for c in batch) == Counter(SPACE)
    most = [max(c.devices for c in batch) for batch in cut]
    assert all(len({c.devices for c in batch}) == 1 for batch in cut)
    assert most == sorted(most, reverse=True)


def test_a_walk_key_with_more_cores_than_a_batch_is_cut() -> None:
    many = [c for c in SPACE if walk_key(c) == walk_key(SPACE[0])] * (MAX_BATCH_CORES + 1)
    cut = batches(many)
    assert [len(b) for b in cut][:1] == [MAX_BATCH_CORES] and sum(map(len, cut)) == len(many)


@settings(max_examples=30, deadline=None)
@given(shape=st.sampled_from([("chimera", 4, 8), ("chimera", 6, 12), ("dualpipe", 4, 8),
                              ("dualpipe", 6, 12)]),
       times=st.lists(st.floats(0.01, 5.0), min_size=6, max_size=6),
       hop=st.floats(0.0, 0.5))
def test_the_memoised_walk_equals_a_fresh_replay(shape: tuple[str, int, int],
                                                 times: list[float], hop: float) -> None:
    """Memoised on its exact inputs: a repeated walk gives the replay's ends, and a walk
    with other durations is not answered from the memo."""
    schedule, p, m = shape
    order = compiled(schedule, p, m)
    durations = times * 2 * p + times[:2] * 2 * p
    hops = [0.0, *[hop] * (2 * p)]

    def fresh(durations: list[float]) -> tuple:
        end = replay(order.p, order.passes, durations, hops)[0]
        last = {s: k for k, (s, *_) in enumerate(order.passes, start=1)}
        last_w = {(a.stage, a.chunk): end[k] for (a, k) in _weight_passes(order, schedule, p, m)}
        return tuple(end[last.get(s, 0)] for s in range(p)), last_w

    assert walk_ends(order, durations, hops) == fresh(durations)
    assert walk_ends(order, durations, hops) == fresh(durations)  # from the memo
    longer = [d * 1.5 for d in durations]
    assert walk_ends(order, longer, hops) == fresh(longer)
    other = compiled(schedule, p, 2 * m)  # another order: not answered from this one's memo
    assert walk_ends(other, durations, hops)[0] != fresh(durations)[0]


def _weight_passes(order: object, schedule: str, p: int, m: int) -> list:
    """Each (device, chunk)'s last weight-gradient pass and its 1-based index in the
    compiled ``order``, from the wait graph's actions: a device's passes come in its own
    order in both, whatever valid order numbers them (Chimera's compiled order is numbered
    as its builder makes it), so a pass is found by its device and its index there."""
    from llmsim.in_flight import schedule_order
    from llmsim.schedules import SCHEDULES, SPLIT_BACKWARD
    from llmsim.schedules.walk import wait_graph

    graph = wait_graph(schedule_order(schedule, p, m, 1),
                       SCHEDULES[schedule].route_of(p, m, 1),
                       gradient_after_weights=schedule not in SPLIT_BACKWARD)
    number, seen = {}, [0] * p  # (device, its index there) → the compiled order's number
    for k, (s, *_) in enumerate(order.passes, start=1):
        number[s, seen[s]] = k
        seen[s] += 1
    last, seen = {}, [0] * p
    for a in graph.actions:
        if a.kind == "W":
            last[a.stage, a.chunk] = (a, number[a.stage, seen[a.stage]])
        seen[a.stage] += 1
    return list(last.values())


def test_the_walk_memo_is_bounded() -> None:
    order = compiled("chimera", 4, 8)
    for i in range(two_pipelines.WALK_MEMO + 10):
        walk_ends(order, [1.0 + i * 1e-6] * (6 * 4 + 4 * 4), [0.0] * 9)
    assert len(two_pipelines._WALKS) <= two_pipelines.WALK_MEMO
