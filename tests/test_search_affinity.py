"""Which worker prices which batch (:mod:`llmsim.search.affinity`)."""

from __future__ import annotations

import random
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

import llmsim
from llmsim.search.affinity import Affinity, affinity_groups, static_owners
from llmsim.search.batching import batches as walk_batches
from llmsim.search.layout import Layout
from llmsim.search.price import state_fits
from llmsim.search.space import SpaceOptions, cores


def _core(pp: int, nodes: int, dp: int) -> Layout:
    return Layout(nodes=nodes, tp=1, pp=pp, dp=dp, virtual_stages=1, schedule="1f1b",
                  micro_batch=1, zero=0, sequence_parallel=False, recompute="none",
                  overlap_dp_comm=False, overlap_tp_comm=False, overlap_pp_comm=False,
                  overlap_param_gather=False, global_batch=64)


batch_lists = st.lists(
    st.tuples(st.sampled_from([1, 2, 4, 8]), st.integers(1, 4), st.integers(1, 5)),
    min_size=0, max_size=30).map(
        lambda specs: [(i, [_core(pp, nodes, dp)] * size)
                       for i, (pp, nodes, size) in enumerate(specs)
                       for dp in [nodes]])


def _drain(feed: Affinity, workers: int, seed: int) -> list[tuple[int, tuple]]:
    """Ask ``feed`` for batches in a random order of workers until none is left:
    (worker, batch) in the order handed out."""
    rng, out, idle = random.Random(seed), [], set()
    while len(idle) < workers:
        worker = rng.choice([w for w in range(workers) if w not in idle])
        batch = feed.next(worker)
        if batch is None:
            idle.add(worker)
        else:
            out.append((worker, batch))
    return out


@settings(max_examples=200, deadline=None)
@given(batch_lists, st.integers(1, 4), st.integers(0, 10**6), st.booleans())
def test_every_batch_is_handed_out_once_a_group_to_one_worker_until_stolen(
        batches: list, workers: int, seed: int, bounded: bool) -> None:
    groups = affinity_groups(batches, bounded)
    assert sorted(index for group in groups for index, _ in group) == \
        [index for index, _ in batches]
    for group in groups:  # one pipeline depth (and with the bound one device count) each
        assert len({cores[0].pp for _, cores in group}) == 1
        if bounded:
            assert len({cores[0].devices for _, cores in group}) == 1
        assert [index for index, _ in group] == sorted(index for index, _ in group)
    sizes = [sum(len(cores) for _, cores in group) * group[0][1][0].pp for group in groups]
    if bounded:  # most devices first, then most layout-stages first
        order = [(-group[0][1][0].devices, -size)
                 for group, size in zip(groups, sizes, strict=True)]
        assert order == sorted(order)
    else:
        assert sizes == sorted(sizes, reverse=True)
    handed = _drain(Affinity(groups, workers), workers, seed)
    assert Counter(index for _, (index, _) in handed) == Counter(i for i, _ in batches)
    group_of = {index: g for g, group in enumerate(groups) for index, _ in group}
    # A worker starts a group only once all groups before it are started: the groups
    # are started in order, and a worker's batches of one group are in index order
    # until the group is shared (taken from its end by another worker).
    started = []
    for _, (index, _) in handed:
        if group_of[index] not in started:
            started.append(group_of[index])
    assert started == sorted(started)
    # Until the last group is started, each group is priced by one worker only.
    last = min((k for k, (_, (index, _)) in enumerate(handed)
                if groups and group_of[index] == len(groups) - 1), default=len(handed))
    met: dict[int, set[int]] = {}
    for worker, (index, _) in handed[:last]:
        met.setdefault(group_of[index], set()).add(worker)
    assert all(len(workers_of) == 1 for workers_of in met.values())


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 50), max_size=30), st.integers(1, 5))
def test_static_owners_keep_the_loads_within_the_largest_group(sizes: list[int],
                                                               workers: int) -> None:
    groups = [[(i, [_core(2, 1, 1)] * size)] for i, size in enumerate(sorted(sizes,
                                                                          reverse=True))]
    owners = static_owners(groups, workers)
    loads = [0] * workers
    for group, owner in zip(groups, owners, strict=True):
        loads[owner] += len(group[0][1])
    if sizes:
        assert max(loads) - min(loads) <= max(sizes)


def test_two_workers_meet_each_pipeline_depth_of_selene_about_once() -> None:
    """Over selene-gpt3's whole space, two workers meet each (worker, pipeline depth)
    pair once but for the groups shared at the end: each placement is priced in one
    worker where the pool in order had both price nearly all of them."""
    base = llmsim.load_scenario("selene-gpt3").model_copy(update={"fidelity": "reduced"})
    space = list(cores(base, SpaceOptions(fixed={}), state_fits(base, 0.1)))
    batches = list(enumerate(walk_batches(space)))
    groups = affinity_groups(batches)
    handed = _drain(Affinity(groups, 2), 2, seed=1)
    pairs = {(w, cores[0].pp) for w, (_, cores) in handed}
    depths = {c.pp for c in space}
    assert len(pairs) <= len(depths) + 2  # at most the last groups, shared
    in_order = {(i % 2, cores[0].pp) for i, cores in batches}
    assert len(in_order) == 2 * len(depths)


def test_a_pool_by_affinity_gives_the_serial_rows_with_and_without_the_bound() -> None:
    """Two local workers fed by affinity group price the same rows as one process, and
    with the days bound keep the estimator's top best (the skipped batches may differ:
    the bound grows as results come in)."""
    from test_search import TINY

    from llmsim.search import search

    scenario = llmsim.load_scenario(dict(TINY, training=dict(TINY["training"], tokens=None,
                                                             flops=1e19)))
    fix = ["parallelism.recompute=selective", "parallelism.sequence_parallel=false"]
    columns = ["key", "memory_gb", "est_step_time_s", "est_days"]
    serial = search(scenario, fix=fix, top=0, workers=1)
    pooled = search(scenario, fix=fix, top=0, workers=2)
    assert pooled.sort_values("key")[columns].values.tolist() == \
        serial.sort_values("key")[columns].values.tolist()
    bounded = search(scenario, fix=fix, top=3, workers=2, bound=True)
    best = serial.sort_values(["est_days", "key"]).head(3)["key"].tolist()
    assert bounded.sort_values(["est_days", "key"]).head(3)["key"].tolist() == best


def test_a_dask_cluster_of_two_workers_gives_the_local_rows() -> None:
    import pytest

    distributed = pytest.importorskip("distributed")
    from test_search import TINY, TINY_FIX

    from llmsim.search import search

    scenario = llmsim.load_scenario(TINY)
    local = search(scenario, fix=TINY_FIX, top=0, workers=1)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        remote = search(scenario, fix=TINY_FIX, top=0, client=client)
    columns = ["key", "memory_gb", "est_step_time_s"]
    assert remote.sort_values("key")[columns].values.tolist() == \
        local.sort_values("key")[columns].values.tolist()


def test_a_worker_s_rows_do_not_depend_on_the_batches_it_priced_before(monkeypatch) -> None:
    """Affinity groups put a depth's ZB-H1 and ZB-H2 batches on one worker: ZB-H2's rows
    are the same whether the worker priced ZB-H1's of the same (p, m) first or not (their
    walks have as many passes and the same durations; the walks' memo once returned
    ZB-H1's for ZB-H2, 26.71 → 28.50 s a step on this one)."""
    from llmsim.search import price, zb_v_walk
    from llmsim.search.price import price_batch

    base = llmsim.load_scenario("selene-gpt3").model_copy(update={"fidelity": "reduced"})
    fixed = {"pp": 32, "tp": 1, "micro_batch": 1, "dp": 32}
    space = list(cores(base, SpaceOptions(fixed=fixed), state_fits(base, 0.1)))
    by = {s: [c for c in space if c.schedule == s] for s in ("zb-h1", "zb-h2")}
    assert by["zb-h1"] and by["zb-h2"]

    def rows(first: list, then: list) -> dict:
        monkeypatch.setattr(price, "_ESTIMATOR", None)  # a fresh worker
        zb_v_walk._WALKS.clear()
        if first:
            price_batch(base, first, {}, 0.1)
        out = price_batch(base, then, {}, 0.1).columns
        return dict(zip(out["key"], out["est_step_time_s"].tolist(), strict=True))

    for one, other in (("zb-h1", "zb-h2"), ("zb-h2", "zb-h1")):
        assert rows(by[one], by[other]) == rows([], by[other])
