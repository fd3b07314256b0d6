"""Topologies: the route a group's traffic takes and what its shape does to collectives.

Each network kind has a test where its shape changes the result in the expected
direction; the torus ring along one dimension is checked against its closed form, and
link sharing against max-min fairness (two groups on one link each take twice as long).
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from llmsim import load_scenario
from llmsim.costs import HardwareCosts
from llmsim.costs.topology import job_shape, placement_rows, topology_of
from llmsim.ops import CommOp
from llmsim.plan import Plan
from llmsim.specs import Parallelism, System

LAUNCH_S = 5e-6
ACCELERATOR = {
    "name": "test-device",
    "dense_tflops": {"bf16": 100.0},
    "hbm_gb": 32,
    "hbm_tbps": 1.0,
    "gemm": {"peak_fraction": 0.8, "compute_units": 48},
    "memory_bound_fraction": 0.8,
    "kernel_launch_us": LAUNCH_S * 1e6,
}
LINK_GBPS, EFFICIENCY, HOP_US = 6.8, 0.8, 0.5


def system(network: dict[str, Any], nodes: int, devices: int = 1, nics: int = 6,
           nic_gbit: float = 54.4) -> System:
    """Nodes of ``devices`` devices (no fabric model: one device, or NICs only)."""
    fabric = ([{"devices": devices, "gbps_per_direction": 300.0, "efficiency": 0.8,
                "latency_us": 2.0}] if devices > 1 else [])
    return System.model_validate({
        "name": "test-system", "nodes": nodes,
        "node": {"accelerator": ACCELERATOR, "devices_per_node": devices, "fabric": fabric,
                 "nics_per_node": nics, "nic_gbit": nic_gbit},
        "network": network,
    })


def torus(dims: list[int]) -> dict[str, Any]:
    return {"kind": "torus", "dims": dims, "link_gbps_per_direction": LINK_GBPS,
            "hop_latency_us": HOP_US, "efficiency": EFFICIENCY}


def costs(sysm: System, nodes: int, **parallel: Any) -> HardwareCosts:
    devices = nodes * sysm.node.devices_per_node
    tp, pp = parallel.get("tp", 1), parallel.get("pp", 1)
    dp = devices // (tp * pp)
    plan = Plan(sysm, nodes, Parallelism(**{**parallel, "dp": dp}), dp)
    return HardwareCosts(sysm, plan, "bf16")


def price(model: HardwareCosts, collective: str, axis: str, nbytes: float) -> float:
    return model.comm_s(CommOp("op", collective, axis, "F", nbytes))  # type: ignore[arg-type]


# -- torus ----------------------------------------------------------------------------------


@pytest.mark.parametrize("dims", [[8], [4, 8]])
@pytest.mark.parametrize("nbytes", [1e7, 1e9])
def test_torus_ring_along_one_dimension_is_the_closed_form(dims: list[int],
                                                          nbytes: float) -> None:
    """A ring all-reduce of 8 nodes along one closed dimension: 2(k−1)/k·S over both of a
    node's links on it, 2(k−1) steps of one hop."""
    nodes = 1
    for d in dims:
        nodes *= d
    model = costs(system(torus(dims), nodes), nodes, tp=8)
    k, link = 8, LINK_GBPS * 1e9 * EFFICIENCY
    expected = 2 * (k - 1) / k * nbytes / (2 * link) + 2 * (k - 1) * HOP_US * 1e-6
    assert price(model, "all_reduce", "tp", nbytes) == pytest.approx(expected + LAUNCH_S)


def test_a_line_of_a_torus_drives_one_link() -> None:
    """Eight nodes on part of a dimension (no wrap-around link): one link per direction
    and two-hop steps, half the bandwidth of the closed ring."""
    model = costs(system(torus([16]), 16), 8, tp=8)
    path = model.collectives.path("tp")
    assert path is not None
    assert path.inter_bytes_per_s == pytest.approx(LINK_GBPS * 1e9 * EFFICIENCY)
    assert path.inter_latency_s == pytest.approx(2 * HOP_US * 1e-6)


@pytest.mark.parametrize("nbytes", [1e4, 1e6, 1e9])
def test_a_6d_torus_beats_a_1d_torus_of_the_same_nodes(nbytes: float) -> None:
    """64 nodes as one ring of 64 or as 2×2×2×2×2×2: the 6-D job runs one ring per
    dimension at once on six links (its six injection interfaces) in 12 steps, the 1-D
    ring two links in 126 steps."""
    one_d = costs(system(torus([64]), 64), 64)
    six_d = costs(system(torus([2] * 6), 64), 64)
    t1, t6 = price(one_d, "all_reduce", "dp", nbytes), price(six_d, "all_reduce", "dp", nbytes)
    assert t6 < t1
    if nbytes >= 1e9:  # bandwidth-bound: six links against two
        assert (t1 - LAUNCH_S) / (t6 - LAUNCH_S) == pytest.approx(3.0, rel=0.01)
    fewer_tnis = costs(system(torus([2] * 6), 64, nics=2), 64)
    assert price(fewer_tnis, "all_reduce", "dp", nbytes) >= t6  # two TNIs drive two links


def test_a_group_that_is_not_a_box_pays_hops_and_shared_links() -> None:
    """TP = 4 on a 2·3·2 unit: the second group straddles the unit's b dimension, so its
    ring is not a box: longer steps, on links other groups' steps cross too."""
    aligned = costs(system(torus([4, 2, 2]), 16), 16, tp=4)
    straddling = costs(system(torus([4, 3, 2]), 24), 24, tp=4)
    a, s = aligned.collectives.path("tp"), straddling.collectives.path("tp")
    assert a is not None and s is not None
    assert s.inter_bytes_per_s < a.inter_bytes_per_s
    assert s.inter_latency_s > a.inter_latency_s


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 24), min_size=1, max_size=6), st.integers(1, 4000))
def test_job_shape_holds_the_job_and_fits_the_machine(dims: list[int], nodes: int) -> None:
    total = 1
    for d in dims:
        total *= d
    nodes = min(nodes, total)
    shape = job_shape(dims, nodes)
    held = 1
    for extent, full in zip(shape, dims, strict=True):
        assert 1 <= extent <= full
        held *= extent
    assert held >= nodes


def test_job_shape_of_fugaku_jobs() -> None:
    """The Tofu unit (a·b·c = 2·3·2) fills first; the whole machine is its own shape."""
    fugaku = [24, 23, 24, 2, 3, 2]
    assert job_shape(fugaku, 48) == [1, 1, 4, 2, 3, 2]
    assert job_shape(fugaku, 158_976) == fugaku


# -- contention -----------------------------------------------------------------------------


def test_two_groups_on_one_link_each_take_twice_as_long_as_one_alone() -> None:
    """Alone: a DP pair over two one-node leaves, its flow alone on an uplink of one NIC.
    Shared: two DP pairs over two two-node leaves with 2:1 uplinks (also one NIC's worth):
    both flows leave the leaf on that link, each at half the rate."""
    flat = {"kind": "fat_tree", "hop_latency_us": 0.0, "efficiency": 1.0}
    alone = costs(system({**flat, "nodes_per_leaf": 1}, 2, nics=1, nic_gbit=100), 2)
    shared_sys = system({**flat, "nodes_per_leaf": 2, "oversubscription": 2.0}, 4, nics=1,
                        nic_gbit=100)
    shared = costs(shared_sys, 4, pp=2, rank_order=["pp", "dp", "tp", "cp", "ep"])
    assert shared.plan.members("dp", 0) == [0, 2]  # the other pair is [1, 3]
    t_alone = price(alone, "all_reduce", "dp", 1e9) - LAUNCH_S
    t_shared = price(shared, "all_reduce", "dp", 1e9) - LAUNCH_S
    assert t_shared == pytest.approx(2 * t_alone)


# -- fat-tree -------------------------------------------------------------------------------


def test_rail_optimised_fabric_sends_cross_rail_steps_over_the_spine() -> None:
    """One member per node at a stride of 12 on 8-device nodes: consecutive members sit on
    different local slots. On rails those steps climb to the tapered spine; on a fabric
    whose NICs share the node's leaf they stay on the leaf."""
    def dp_path(rails: bool) -> Any:
        network = {"kind": "fat_tree", "nodes_per_leaf": 32, "oversubscription": 4.0,
                   "rail_optimized": rails, "hop_latency_us": 1.0, "efficiency": 0.9}
        sysm = system(network, 32, devices=8, nics=8, nic_gbit=200)
        return costs(sysm, 12, tp=4, pp=3, rank_order=["tp", "pp", "dp", "cp", "ep"])
    on_rails, off_rails = dp_path(True), dp_path(False)
    assert on_rails.plan.placements["dp"].members_per_node == 1
    p_on, p_off = on_rails.collectives.path("dp"), off_rails.collectives.path("dp")
    assert p_on is not None and p_off is not None
    assert p_on.inter_bytes_per_s < p_off.inter_bytes_per_s
    assert p_on.inter_latency_s > p_off.inter_latency_s


# -- dragonfly ------------------------------------------------------------------------------


def test_dragonfly_minimal_routing_is_limited_by_the_links_between_two_groups() -> None:
    """Pipeline stages a dragonfly group apart: every device of a group sends to the next
    group at once. Minimal routing has the 2 links between the pair; adaptive routing
    also the rest of the global links, at two hops each."""
    base = {"kind": "dragonfly", "nodes_per_group": 4, "global_taper": 1.0,
            "global_links_per_group_pair": 2, "hop_latency_us": 1.0, "efficiency": 0.9}

    def pp_path(routing: str) -> Any:
        sysm = system({**base, "routing": routing}, 16, devices=8, nics=8, nic_gbit=200)
        path = costs(sysm, 16, tp=8, pp=4).collectives.path("pp")
        assert path is not None
        return path
    minimal, adaptive = pp_path("minimal"), pp_path("adaptive")
    flows = 4 * 8  # the 32 devices of a group, each at its NIC's 25 GB/s
    assert minimal.link_bytes_per_s == pytest.approx(2 * 25e9 * 0.9 / flows * 1)
    assert adaptive.link_bytes_per_s > minimal.link_bytes_per_s


@settings(max_examples=30, deadline=None)
@given(leaf=st.sampled_from([1, 2, 4, 8]), oversubscription=st.floats(1.0, 8.0),
       tp=st.sampled_from([1, 2, 4, 8]), pp=st.sampled_from([1, 2, 4]),
       nodes=st.sampled_from([2, 4, 8, 16]), rails=st.booleans())
def test_fat_tree_share_is_a_fraction_that_never_rises_with_the_taper(
        leaf: int, oversubscription: float, tp: int, pp: int, nodes: int, rails: bool) -> None:
    assume(nodes * 8 >= tp * pp)

    def paths(taper: float) -> dict[str, Any]:
        network = {"kind": "fat_tree", "nodes_per_leaf": leaf, "oversubscription": taper,
                   "rail_optimized": rails, "hop_latency_us": 1.0, "efficiency": 0.9}
        model = costs(system(network, 16, devices=8, nics=8, nic_gbit=200), nodes, tp=tp,
                      pp=pp)
        topology = topology_of(model.plan.system, nodes)
        for placement in model.plan.placements.values():
            if placement.crosses_nodes:
                share = topology.route(model.plan, placement).bandwidth_fraction
                assert 0 < share <= 1
        return {a: model.collectives.path(a) for a in ("tp", "dp", "pp")}
    base, steeper = paths(oversubscription), paths(2 * oversubscription)
    for axis, path in base.items():
        if path is not None and path.nodes > 1:
            assert steeper[axis].inter_bytes_per_s <= path.inter_bytes_per_s * (1 + 1e-12)


@settings(max_examples=20, deadline=None)
@given(group=st.sampled_from([1, 2, 4, 8]), taper=st.floats(1.0, 4.0),
       pair_links=st.integers(1, 8), pp=st.sampled_from([2, 4]))
def test_dragonfly_adaptive_routing_never_loses_to_minimal(group: int, taper: float,
                                                            pair_links: int, pp: int) -> None:
    def pp_path(routing: str) -> Any:
        network = {"kind": "dragonfly", "nodes_per_group": group, "global_taper": taper,
                   "global_links_per_group_pair": pair_links, "routing": routing,
                   "hop_latency_us": 1.0, "efficiency": 0.9}
        path = costs(system(network, 16, devices=8, nics=8, nic_gbit=200), 16, tp=8,
                     pp=pp).collectives.path("pp")
        assert path is not None
        return path
    minimal, adaptive = pp_path("minimal"), pp_path("adaptive")
    assert adaptive.link_bytes_per_s >= minimal.link_bytes_per_s * (1 - 1e-12)
    assert adaptive.link_bytes_per_s <= 25e9 * 0.9 * (1 + 1e-12)  # never above its NIC


# -- the catalog and the CLI ----------------------------------------------------------------


@pytest.mark.parametrize("name", ["fugaku", "frontier", "selene-gpt3", "abci"])
def test_placement_rows_describe_every_group_of_a_seed_scenario(name: str) -> None:
    scenario = load_scenario(name)
    plan = Plan.from_scenario(scenario)
    rows = placement_rows(plan)
    axes = {a for a, p in plan.placements.items() if p.size > 1}
    assert {r["axis"] for r in rows} == axes
    topology = topology_of(plan.system, plan.nodes)
    for row in rows:
        placement = plan.placements[str(row["axis"])]
        if placement.crosses_nodes:
            route = topology.route(plan, placement)
            assert 0 < route.bandwidth_fraction <= 1 and route.hops >= 1
            assert row["hops"] == route.hops


def test_llmsim_run_shows_the_placement(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """``llmsim run`` on 12 Fugaku nodes: TP pairs along c, the pipeline along b (a ring of
    3: the job holds the whole dimension), DP along a."""
    import sys

    import yaml

    from llmsim.cli import main

    raw = {
        "name": "tiny-fugaku", "system": "fugaku", "nodes": 12,
        "model": {"name": "t", "layers": 6, "hidden": 512, "heads": 8, "ffn_hidden": 2048,
                  "vocab": 1024},
        "parallelism": {"tp": 2, "pp": 3, "dp": 2, "rank_order": ["tp", "pp", "dp", "cp",
                                                                  "ep"]},
        "training": {"global_batch": 8, "seq_len": 256, "precision": "fp32", "tokens": 1e9,
                     "attention_kernel": "unfused"},
    }
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(raw))
    old, sys.argv = sys.argv, ["llmsim", "run", str(path)]
    try:
        main()
    except SystemExit as exc:
        assert exc.code in (0, None)
    finally:
        sys.argv = old
    out = " ".join(capsys.readouterr().out.split())
    assert "Placement" in out
    for words in ("box c:2 line", "box b:3 ring", "box a:2 line"):
        assert words in out


def test_a_torus_of_multi_device_nodes_routes_only_groups_that_leave_a_node() -> None:
    """Two devices per node, TP = 2 inside each node and DP across: the TP groups never
    touch the torus; the DP rings of the two local slots share each node's links."""
    sysm = system(torus([8]), 8, devices=2)
    model = costs(sysm, 8, tp=2)
    dp = model.collectives.path("dp")
    assert model.collectives.path("tp") is not None
    assert dp is not None and dp.nodes == 8 and dp.per_node == 1
    link = LINK_GBPS * 1e9 * EFFICIENCY
    assert dp.inter_bytes_per_s == pytest.approx(2 * link / 2)  # a closed ring, two slots
