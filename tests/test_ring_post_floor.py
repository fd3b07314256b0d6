"""The host's network post on every step of a library ring across nodes (NCCL
``getNetOverhead``), and a tuner that picks without it (NCCL before 2.18)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_costs_collectives import FAT_TREE, LAUNCH_S, NCCL_2021, costs, price, system

from llmsim import catalog
from llmsim.costs import algorithm_times_s
from llmsim.loader import read_yaml
from llmsim.specs import CollectiveLibrary

AMD_FLOOR = {"ll": 2.0, "ll128": 2.0, "simple": 6.0}
HOP_US = 1.0  # one leaf switch
BUS = min(300e9 * 0.8, 8 * 25e9 * 0.9)  # 180 GB/s: the node's NICs


def floored(nodes: int = 8, floor: dict[str, float] | None = None, tuned: bool = False):
    """dp over ``nodes`` nodes, all 8 members on each: NCCL 2021 with the AMD hosts' floor."""
    library = {**NCCL_2021, "ring_network_post_tuned": tuned}
    network = {**FAT_TREE, "collectives": library, "ring_post_us": floor or AMD_FLOOR}
    return costs(system(network=network), nodes=nodes, tp=1)


def bare(nodes: int = 8):
    return costs(system(network={**FAT_TREE, "collectives": NCCL_2021}), nodes=nodes, tp=1)


def gather_s(s: float, base: float, fabric: float, network: float, fraction: float) -> float:
    """An all-gather over 64 ranks on 8 nodes: 56 fabric steps and 7 network steps."""
    return (base + 56 * fabric + 7 * (network + HOP_US)) * 1e-6 + 63 / 64 * s / (BUS * fraction)


def test_every_fabric_step_of_a_ring_across_nodes_pays_the_floor() -> None:
    model = floored()
    path = model.collectives.path("dp")
    assert path is not None and (path.ranks, path.nodes, path.per_node) == (64, 8, 8)
    s = 4e8
    times = algorithm_times_s("all_gather", s, path, model.collectives.library)
    assert times["ring/simple"] == pytest.approx(gather_s(s, 8.4, 6.0, 9.6, 1.0))  # 3.4 → 6
    assert times["ring/ll128"] == pytest.approx(gather_s(s, 10.0, 2.0, 4.0, 0.92))  # 1.9 → 2
    before = algorithm_times_s("all_gather", s, path, bare().collectives.library)
    assert before["ring/simple"] == pytest.approx(gather_s(s, 8.4, 3.4, 9.6, 1.0))


def test_a_tuner_without_the_floor_picks_as_before_and_its_pick_pays_it() -> None:
    """At 400 MB NCCL 2.8's tuner picks Simple (273 µs of latency against LL128's 151, 8 %
    more bandwidth); counting the floor it would pick LL128. The run pays Simple's floor."""
    s = 4e8
    path = bare().collectives.path("dp")
    assert path is not None
    unfloored = algorithm_times_s("all_gather", s, path, bare().collectives.library)
    assert min(unfloored, key=unfloored.__getitem__) == "ring/simple"
    simple = gather_s(s, 8.4, 6.0, 9.6, 1.0)
    ll128 = gather_s(s, 10.0, 2.0, 4.0, 0.92)
    assert ll128 < simple
    assert price(floored(), "all_gather", "dp", s) == pytest.approx(simple + LAUNCH_S)
    assert price(floored(tuned=True), "all_gather", "dp", s) == pytest.approx(ll128 + LAUNCH_S)


def test_one_node_and_a_floor_under_the_steps_change_nothing() -> None:
    for s in (1e4, 1e6, 4e8):
        assert price(floored(nodes=1), "all_gather", "dp", s) == price(bare(nodes=1),
                                                                          "all_gather", "dp", s)
        low = floored(floor={"ll": 0.0, "ll128": 0.0, "simple": 0.0})
        assert price(low, "all_reduce", "dp", s) == pytest.approx(price(bare(), "all_reduce",
                                                                         "dp", s))


@settings(max_examples=40, deadline=None)
@given(s=st.floats(1e3, 4e9), collective=st.sampled_from(["all_gather", "reduce_scatter",
                                                          "all_reduce"]),
       nodes=st.sampled_from([2, 4, 8, 16]))
def test_the_floor_only_slows_and_an_unaware_pick_is_never_faster(s: float, collective: str,
                                                                  nodes: int) -> None:
    before = price(bare(nodes), collective, "dp", s)
    aware = price(floored(nodes, tuned=True), collective, "dp", s)
    unaware = price(floored(nodes), collective, "dp", s)
    assert before <= aware * (1 + 1e-12)
    assert aware <= unaware * (1 + 1e-12)


def test_selene_runs_nccl_2021_on_amd_hosts_with_the_floor_left_out_of_the_tuner() -> None:
    library = CollectiveLibrary.model_validate(read_yaml(catalog.path_of("collectives",
                                                                          "nccl-2021")))
    assert not library.ring_network_post_tuned
    assert library.ring_network_post_us is None  # the floor is the hosts', per system
    nccl_2024 = read_yaml(catalog.path_of("collectives", "nccl-2024"))
    assert CollectiveLibrary.model_validate(nccl_2024).ring_network_post_tuned
    for name in ("selene", "selene-2020"):
        entry = read_yaml(catalog.path_of("systems", name))
        assert entry["network"]["ring_post_us"] == AMD_FLOOR
        assert "getNetOverhead" in entry["sources"]["network.ring_post_us"]
