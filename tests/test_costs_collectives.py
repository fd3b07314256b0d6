"""Collective cost model: closed forms per algorithm, the path a group uses, measured tables."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmsim import catalog, load_scenario
from llmsim.calibration import (
    Calibration,
    CollectivePoint,
    build_calibration,
    parse_nccl_tests,
    save_calibration,
)
from llmsim.costs import HardwareCosts, algorithm_times_s
from llmsim.costs.collectives import CollectiveTable
from llmsim.errors import UserError
from llmsim.loader import read_yaml
from llmsim.ops import CommOp
from llmsim.plan import Plan
from llmsim.specs import CollectiveLibrary, Parallelism, System

DATA = Path(__file__).parent / "data"
LAUNCH_S = 5e-6
FAT_TREE = {"kind": "fat_tree", "nodes_per_leaf": 16, "hop_latency_us": 1.0, "efficiency": 0.9}
ACCELERATOR = {
    "name": "test-gpu",
    "dense_tflops": {"bf16": 300.0},
    "hbm_gb": 80,
    "hbm_tbps": 2.0,
    "gemm": {"peak_fraction": 0.8, "compute_units": 100},
    "memory_bound_fraction": 0.9,
    "kernel_launch_us": LAUNCH_S * 1e6,
}


def system(
    *,
    nodes: int = 64,
    devices: int = 8,
    fabric_gbps: float = 300.0,
    fabric_efficiency: float = 0.8,
    nics: int = 8,
    nic_gbit: float = 200.0,
    network: dict[str, Any] | None = None,
    link_gbps: float | None = None,
    collective_units: int = 0,
) -> System:
    """An 8-GPU switched node (300 GB/s per device) with 8 × 200 Gb/s NICs."""
    fabric = (
        [
            {
                "devices": devices,
                "gbps_per_direction": fabric_gbps,
                "efficiency": fabric_efficiency,
                "latency_us": 2.0,
                "link_gbps": link_gbps,
            }
        ]
        if devices > 1
        else []
    )
    return System.model_validate(
        {
            "name": "test-system",
            "nodes": nodes,
            "node": {
                "accelerator": ACCELERATOR,
                "devices_per_node": devices,
                "fabric": fabric,
                "nics_per_node": nics,
                "nic_gbit": nic_gbit,
                "collective_units": collective_units,
            },
            "network": network or FAT_TREE,
        }
    )


def costs(
    sysm: System, nodes: int, tp: int = 1, pp: int = 1, calibration: Calibration | None = None
) -> HardwareCosts:
    dp = nodes * sysm.node.devices_per_node // (tp * pp)
    plan = Plan(sysm, nodes, Parallelism(tp=tp, pp=pp, dp=dp), dp)
    return HardwareCosts(sysm, plan, "bf16", calibration)


def price(model: HardwareCosts, collective: str, axis: str, nbytes: float) -> float:
    return model.comm_s(CommOp("op", collective, axis, "F", nbytes))  # type: ignore[arg-type]


# -- closed forms ---------------------------------------------------------------------------

B_INTRA = 300e9 * 0.8
ALPHA_INTRA = 2e-6


@pytest.mark.parametrize("nbytes", [1e3, 1e6, 1e9])
def test_ring_all_reduce_on_one_node(nbytes: float) -> None:
    model = costs(system(), nodes=1, tp=8)
    expected = 2 * 7 / 8 * nbytes / B_INTRA + 2 * 7 * ALPHA_INTRA + LAUNCH_S
    assert price(model, "all_reduce", "tp", nbytes) == pytest.approx(expected)


@pytest.mark.parametrize("collective", ["reduce_scatter", "all_gather"])
def test_reduce_scatter_and_all_gather_take_half_the_volume(collective: str) -> None:
    model = costs(system(), nodes=1, tp=8)
    expected = 7 / 8 * 1e8 / B_INTRA + 7 * ALPHA_INTRA + LAUNCH_S
    assert price(model, collective, "tp", 1e8) == pytest.approx(expected)


def test_send_recv_inside_a_node_and_between_nodes() -> None:
    inside = costs(system(), nodes=1, pp=8)
    assert price(inside, "send_recv", "pp", 1e7) == pytest.approx(
        ALPHA_INTRA + 1e7 / B_INTRA + LAUNCH_S
    )
    across = costs(system(), nodes=2, tp=8, pp=2)
    per_device = 8 * 25e9 * 0.9 / 8  # the node's NICs shared by its 8 devices
    assert price(across, "send_recv", "pp", 1e7) == pytest.approx(
        1e-6 + 1e7 / per_device + LAUNCH_S
    )


def test_send_recv_of_a_pipeline_spread_over_nodes() -> None:
    """pp = 16 on two 8-GPU nodes with 4 NICs each: neighbours on one node use the fabric;
    across nodes only the boundary stage's device sends, on its own NIC."""
    sysm = system(nics=4)
    model = costs(sysm, nodes=2, pp=16)
    within = CommOp("op", "send_recv", "pp", "F", 1e7, within_node=True)
    across = CommOp("op", "send_recv", "pp", "F", 1e7)
    assert model.comm_s(within) == pytest.approx(ALPHA_INTRA + 1e7 / B_INTRA + LAUNCH_S)
    one_nic = 25e9 * 0.9  # not the device's 1/8 share of the node's four NICs
    assert model.comm_s(across) == pytest.approx(1e-6 + 1e7 / one_nic + LAUNCH_S)
    # With tp = 8 every device of a node sends at once: each gets its share again.
    full = costs(sysm, nodes=2, tp=8, pp=2)
    assert price(full, "send_recv", "pp", 1e7) == pytest.approx(
        1e-6 + 1e7 / (4 * 25e9 * 0.9 / 8) + LAUNCH_S)


def test_a_pipeline_spread_over_nodes_sends_on_the_network_peers_channels() -> None:
    """NCCL gives every peer of a communicator with peers on other nodes the network's
    two channels, each half a link: neighbours on one node get one link, not the fabric."""
    within = CommOp("op", "send_recv", "pp", "F", 1e7, within_node=True)
    spread = costs(system(nics=4, link_gbps=20.0), nodes=2, pp=16)
    assert spread.comm_s(within) == pytest.approx(ALPHA_INTRA + 1e7 / 20e9 + LAUNCH_S)
    # NCCL_NCHANNELS_PER_NET_PEER = 3 is rounded up to a power of two: four channels.
    wider = costs(system(nics=4, link_gbps=20.0,
                         network={**FAT_TREE, "p2p_channels_per_net_peer": 3}), nodes=2, pp=16)
    assert wider.comm_s(within) == pytest.approx(ALPHA_INTRA + 1e7 / 40e9 + LAUNCH_S)
    # On one node every peer has two channels per link of its path: the fabric's rate.
    one_node = costs(system(link_gbps=20.0), nodes=1, pp=8)
    assert price(one_node, "send_recv", "pp", 1e7) == pytest.approx(
        ALPHA_INTRA + 1e7 / B_INTRA + LAUNCH_S)
    # Channels never make a send faster than the fabric itself.
    fast_links = costs(system(nics=4, link_gbps=1000.0), nodes=2, pp=16)
    assert fast_links.comm_s(within) == pytest.approx(ALPHA_INTRA + 1e7 / B_INTRA + LAUNCH_S)
    # Collectives of the same group keep the fabric (their channels are the rings').
    assert price(spread, "all_reduce", "pp", 1e7) == price(
        costs(system(nics=4), nodes=2, pp=16), "all_reduce", "pp", 1e7)


def test_one_member_per_node_ring_versus_tree() -> None:
    """dp over 16 nodes, one member per node: each group owns 1/8 of the node's NICs."""
    model = costs(system(), nodes=16, tp=8)
    path = model.collectives.path("dp")
    assert path is not None
    bw = 8 * 25e9 * 0.9 / 8
    assert (path.ranks, path.nodes, path.per_node) == (16, 16, 1)
    assert path.inter_bytes_per_s == pytest.approx(bw)

    def ring(s: float) -> float:
        return 2 * 15 / 16 * s / bw + 2 * 15 * 1e-6

    def tree(s: float) -> float:
        return 2 * s / bw + 2 * math.log2(16) * 1e-6

    for nbytes in (1e3, 1e5, 1e9):
        times = algorithm_times_s("all_reduce", nbytes, path)
        assert times == {"ring": pytest.approx(ring(nbytes)), "tree": pytest.approx(tree(nbytes))}
        assert price(model, "all_reduce", "dp", nbytes) == pytest.approx(
            min(ring(nbytes), tree(nbytes)) + LAUNCH_S
        )
    assert tree(1e3) < ring(1e3) and ring(1e9) < tree(1e9)  # NCCL: tree small, ring large


def test_several_members_per_node_ring_or_hierarchical() -> None:
    """tp 2 → dp groups of 16 with 4 members on each of 4 nodes."""
    model = costs(system(), nodes=4, tp=2)
    path = model.collectives.path("dp")
    assert path is not None and (path.ranks, path.nodes, path.per_node) == (16, 4, 4)
    net = 8 * 25e9 * 0.9 * 4 / 8
    assert path.inter_bytes_per_s == pytest.approx(net)
    s = 1e9
    ring = 2 * 15 / 16 * s / min(B_INTRA, net) + (30 - 6) * ALPHA_INTRA + 6 * 1e-6
    hier = 2 * 3 / 4 * s / B_INTRA + 6 * ALPHA_INTRA + 2 * 3 / 4 * s / net + 6 * 1e-6
    times = algorithm_times_s("all_reduce", s, path)
    assert times["ring"] == pytest.approx(ring)
    assert times["hierarchical"] == pytest.approx(hier)
    assert price(model, "all_reduce", "dp", s) == pytest.approx(min(times.values()) + LAUNCH_S)
    assert ring < hier  # a fabric only 2.7× the network share: the pipelined ring wins
    fast_fabric = costs(system(fabric_gbps=3000.0), nodes=4, tp=2).collectives.path("dp")
    assert fast_fabric is not None
    fast = algorithm_times_s("all_reduce", s, fast_fabric)
    assert fast["hierarchical"] < fast["ring"]  # it moves less over the network


def test_fat_tree_taper_applies_only_to_the_flows_that_leave_a_leaf() -> None:
    """Eight DP rings (one per local slot) over 16 nodes. With one node per leaf each ring
    leaves every leaf: 8 flows of a NIC's worth on uplinks of half the node's injection,
    so each ring keeps half its rate. With 4 nodes per leaf each ring leaves a leaf once
    per 4 nodes: the uplinks carry the flows at full rate."""
    s = 1e9
    within = costs(system(network={**FAT_TREE, "oversubscription": 2.0}), nodes=16, tp=8)
    one_node_leaves = {**FAT_TREE, "nodes_per_leaf": 1, "oversubscription": 2.0}
    across = costs(system(network=one_node_leaves), nodes=16, tp=8)
    four_node_leaves = {**FAT_TREE, "nodes_per_leaf": 4, "oversubscription": 2.0}
    runs = costs(system(network=four_node_leaves), nodes=16, tp=8)
    p_in, p_out = within.collectives.path("dp"), across.collectives.path("dp")
    p_runs = runs.collectives.path("dp")
    assert p_in is not None and p_out is not None and p_runs is not None
    assert p_out.inter_bytes_per_s == pytest.approx(p_in.inter_bytes_per_s / 2)
    assert p_runs.inter_bytes_per_s == pytest.approx(p_in.inter_bytes_per_s)
    assert (p_in.inter_latency_s, p_out.inter_latency_s, p_runs.inter_latency_s) == (
        pytest.approx(1e-6),
        pytest.approx(3e-6),
        pytest.approx(3e-6),
    )
    assert price(across, "all_reduce", "dp", s) > price(within, "all_reduce", "dp", s)


def test_network_step_latency_is_paid_once_per_inter_node_step_beside_the_hops() -> None:
    """α_inter = step_latency + hop_latency × hops (NCCL's per-step endpoint cost)."""
    small_leaves = {**FAT_TREE, "nodes_per_leaf": 4}
    plain = costs(system(network=small_leaves), nodes=16, tp=8)
    nccl = costs(system(network={**small_leaves, "step_latency_us": 9.6}), nodes=16, tp=8)
    p_plain, p_nccl = plain.collectives.path("dp"), nccl.collectives.path("dp")
    assert p_plain is not None and p_nccl is not None
    assert p_nccl.inter_latency_s == pytest.approx(9.6e-6 + 3 * 1e-6)  # three hops across leaves
    # A ring over 16 nodes with one member each: 2·15 steps, all across the network.
    extra = price(nccl, "all_reduce", "dp", 1e9) - price(plain, "all_reduce", "dp", 1e9)
    assert extra == pytest.approx(2 * 15 * 9.6e-6)


def test_dragonfly_global_taper() -> None:
    """Groups of one node: each of the 8 DP rings leaves every dragonfly group, so their
    flows (a node's injection) share global links of 1/1.75 of it."""
    dragonfly = {
        "kind": "dragonfly",
        "nodes_per_group": 1,
        "global_taper": 1.75,
        "hop_latency_us": 1.0,
        "efficiency": 0.9,
    }
    inside = costs(system(network={**dragonfly, "nodes_per_group": 16}), nodes=16, tp=8)
    across = costs(system(network=dragonfly), nodes=16, tp=8)
    p_in, p_out = inside.collectives.path("dp"), across.collectives.path("dp")
    assert p_in is not None and p_out is not None
    assert p_out.inter_bytes_per_s == pytest.approx(p_in.inter_bytes_per_s / 1.75)


def test_torus_ring_uses_both_neighbour_links() -> None:
    """One device per node (Fugaku-like): a ring along the torus sends to both neighbours."""
    torus = {
        "kind": "torus",
        "dims": [4, 4, 4],
        "link_gbps_per_direction": 6.8,
        "hop_latency_us": 0.5,
        "efficiency": 0.8,
    }
    sysm = system(nodes=64, devices=1, nics=6, nic_gbit=54.4, network=torus)
    model = costs(sysm, nodes=64)
    path = model.collectives.path("dp")
    assert path is not None and path.per_node == 1
    assert path.inter_bytes_per_s == pytest.approx(min(2 * 6.8e9, 6 * 6.8e9) * 0.8)
    narrow = costs(system(nodes=64, devices=1, nics=1, nic_gbit=54.4, network=torus), nodes=64)
    narrow_path = narrow.collectives.path("dp")
    assert narrow_path is not None
    assert narrow_path.inter_bytes_per_s == pytest.approx(6.8e9 * 0.8)  # injection-bound


def test_trivial_groups_and_empty_messages_are_free() -> None:
    model = costs(system(), nodes=1, tp=8)  # dp = 1
    assert price(model, "all_reduce", "dp", 1e9) == 0.0
    assert price(model, "all_reduce", "tp", 0.0) == 0.0


def test_unsupported_precision_is_a_user_error() -> None:
    sysm = system()
    plan = Plan(sysm, 1, Parallelism(tp=8, dp=1), 1)
    with pytest.raises(UserError, match=r"training\.precision: fp8"):
        HardwareCosts(sysm, plan, "fp8")


def test_cudnn_attention_without_a_measured_fraction_is_a_user_error() -> None:
    sysm = system()
    plan = Plan(sysm, 1, Parallelism(tp=8, dp=1), 1)
    with pytest.raises(UserError, match=r"training\.attention_kernel: cudnn .* test-gpu"):
        HardwareCosts(sysm, plan, "bf16", attention_kernel="cudnn")


# -- measured tables ------------------------------------------------------------------------


def test_measured_table_reproduces_nccl_tests_times() -> None:
    cal = build_calibration(nccl_outputs=[DATA / "nccl_all_reduce_8xa100.txt"])
    model = costs(system(), nodes=1, tp=8, calibration=cal)
    # "8589934592 ... 64816.8 132.53 231.92": t = S / algbw = S·2(n−1)/n / busbw.
    assert price(model, "all_reduce", "tp", 8589934592) == pytest.approx(64816.8e-6, rel=1e-4)
    assert price(model, "all_reduce", "tp", 2097152) == pytest.approx(37.82e-6, rel=1e-3)
    assert price(model, "all_reduce", "tp", 1) == pytest.approx(22.0e-6, rel=1e-3)  # floor
    # Collectives without measurements keep the model.
    plain = costs(system(), nodes=1, tp=8)
    assert price(model, "all_gather", "tp", 1e8) == price(plain, "all_gather", "tp", 1e8)


def test_measured_busbw_interpolates_in_log_size() -> None:
    points = [
        CollectivePoint(collective="all_gather", ranks=8, nodes=1, bytes=b, busbw_gbps=g)
        for b, g in ((1 << 20, 50.0), (1 << 22, 150.0))
    ]
    table = CollectiveTable(points)
    t = table.time_s("all_gather", 8, 1, 1 << 21)
    assert t == pytest.approx((1 << 21) * 7 / 8 / 100e9)


def test_closest_measured_shape_is_used() -> None:
    def series(ranks: int, nodes: int, gbps: float) -> CollectivePoint:
        return CollectivePoint(
            collective="all_reduce", ranks=ranks, nodes=nodes, bytes=1 << 30, busbw_gbps=gbps
        )

    table = CollectiveTable([series(2, 1, 10.0), series(8, 1, 20.0), series(16, 2, 30.0)])
    assert table.series_for("all_reduce", 4, 1).ranks == 2  # tie in log distance: fewer ranks
    assert table.series_for("all_reduce", 8, 1).ranks == 8
    assert table.series_for("all_reduce", 64, 8).ranks == 16  # the multi-node measurement


@settings(max_examples=200, deadline=None)
@given(a=st.floats(1.0, 1e10), b=st.floats(1.0, 1e10))
def test_measured_times_never_decrease_with_size(a: float, b: float) -> None:
    """Even where the measured busbw jumps faster than the size (protocol switch)."""
    rows = ((4 << 20, 11.2), (8 << 20, 32.7), (16 << 20, 36.7), (64 << 20, 30.0))
    table = CollectiveTable(
        [
            CollectivePoint(collective="all_reduce", ranks=16, nodes=2, bytes=s, busbw_gbps=g)
            for s, g in rows
        ]
    )
    small, big = sorted((a, b))
    assert table.time_s("all_reduce", 16, 2, big) >= table.time_s("all_reduce", 16, 2, small)


def test_from_scenario_loads_the_calibration(tmp_path: Path) -> None:
    cal = Calibration(collectives=parse_nccl_tests(DATA / "nccl_all_reduce_8xa100.txt"))
    path = tmp_path / "profile.yaml"
    save_calibration(cal, path)
    scenario = load_scenario(
        {
            "system": system(nodes=2).model_dump(),
            "model": {
                "name": "m",
                "layers": 4,
                "hidden": 512,
                "heads": 8,
                "ffn_hidden": 2048,
                "vocab": 1024,
            },
            "parallelism": {"tp": 8, "pp": 2},
            "training": {"global_batch": 8, "seq_len": 512, "tokens": 1e9},
            "calibration": str(path),
        }
    )
    model = HardwareCosts.from_scenario(scenario, Plan.from_scenario(scenario))
    assert model.calibration == cal
    assert price(model, "all_reduce", "tp", 8589934592) == pytest.approx(64816.8e-6, rel=1e-4)


def test_the_calibration_is_read_when_the_scenario_loads(tmp_path: Path, monkeypatch) -> None:
    """A scenario's profile is read and checked by load_scenario; the cost model reuses it
    at simulate time without reading the file again."""
    import llmsim.loader

    path = tmp_path / "profile.yaml"
    path.write_text("gemm: not a list\n", encoding="utf-8")
    raw = {"system": system(nodes=2).model_dump(),
           "model": {"name": "m", "layers": 4, "hidden": 512, "heads": 8,
                     "ffn_hidden": 2048, "vocab": 1024},
           "parallelism": {"tp": 8, "pp": 2},
           "training": {"global_batch": 8, "seq_len": 512, "tokens": 1e9},
           "calibration": str(path)}
    with pytest.raises(UserError, match=r"profile\.yaml"):
        load_scenario(raw)  # a bad profile is a load error
    save_calibration(Calibration(collectives=parse_nccl_tests(
        DATA / "nccl_all_reduce_8xa100.txt")), path)
    scenario = load_scenario(raw)
    reads: list[Path] = []
    monkeypatch.setattr(llmsim.loader, "read_yaml", lambda p: reads.append(p) or {})
    model = HardwareCosts.from_scenario(scenario, Plan.from_scenario(scenario))
    assert model.calibration is not None and model.calibration.collectives
    assert reads == []


# -- monotonicity ---------------------------------------------------------------------------

LAYOUTS = [  # (nodes, tp, pp, network)
    (1, 8, 1, FAT_TREE),
    (4, 2, 1, FAT_TREE),
    (16, 8, 1, FAT_TREE),
    (8, 4, 2, FAT_TREE),
    (32, 8, 2, {**FAT_TREE, "nodes_per_leaf": 4, "oversubscription": 3.0}),
    (16, 2, 2, {"kind": "dragonfly", "nodes_per_group": 4, "global_taper": 1.75}),
    (2, 1, 16, FAT_TREE),  # a pipeline over two nodes: neighbours on one node and across
]

layouts = st.sampled_from(LAYOUTS)
collectives = st.sampled_from(["all_reduce", "all_gather", "reduce_scatter", "send_recv"])
axes = st.sampled_from(["tp", "dp", "pp"])


@settings(max_examples=150, deadline=None)
@given(
    layout=layouts,
    collective=collectives,
    axis=axes,
    nbytes=st.floats(1.0, 1e10),
    gain=st.floats(1.0, 8.0),
    which=st.sampled_from(["fabric_gbps", "nic_gbit", "nics", "link_gbps"]),
    within=st.booleans(),
)
def test_more_bandwidth_never_takes_longer(
    layout: tuple, collective: str, axis: str, nbytes: float, gain: float, which: str,
    within: bool,
) -> None:
    nodes, tp, pp, network = layout
    base_kwargs: dict[str, Any] = {
        "fabric_gbps": 300.0,
        "nic_gbit": 200.0,
        "nics": 4,
        "network": network,
        "link_gbps": 20.0,
    }
    faster = dict(base_kwargs)
    faster[which] = (
        round(base_kwargs[which] * gain) if which == "nics" else (base_kwargs[which] * gain)
    )
    slow = costs(system(**base_kwargs), nodes, tp, pp)
    fast = costs(system(**faster), nodes, tp, pp)
    op = CommOp("op", collective, axis, "F", nbytes, within_node=within)  # type: ignore[arg-type]
    assert fast.comm_s(op) <= slow.comm_s(op) * (1 + 1e-12)


@settings(max_examples=150, deadline=None)
@given(
    layout=layouts,
    collective=collectives,
    axis=axes,
    a=st.floats(0.0, 1e10),
    b=st.floats(0.0, 1e10),
)
def test_bigger_messages_never_take_less_time(
    layout: tuple, collective: str, axis: str, a: float, b: float
) -> None:
    nodes, tp, pp, network = layout
    model = costs(system(network=network), nodes, tp, pp)
    small, big = sorted((a, b))
    assert price(model, collective, axis, big) >= price(model, collective, axis, small)


@pytest.mark.parametrize(("extra", "launches", "message_passes"), [
    ({"copies": 32}, 32, 2),        # tensor-list all-gather: 32 slice copies, read + write
    ({"staging_passes": 3}, 3, 6),  # DeepSpeed's fallback: flatten, scale, copy back
    ({"fill_passes": 1}, 1, 1),     # a zero-filled output buffer: one write
    ({"copies": 32, "fill_passes": 1}, 33, 3),  # DeepSpeed 2021's ZeRO-3 gather
])
def test_copies_around_a_collective_cost_launches_and_passes_over_the_message(
    extra: dict[str, int], launches: int, message_passes: int,
) -> None:
    sysm = system()
    model = costs(sysm, nodes=4)
    op = CommOp("z3_ag", "all_gather", "dp", "F", 64e6)
    copied = CommOp("z3_ag", "all_gather", "dp", "F", 64e6, **extra)
    accelerator = sysm.node.accelerator
    expected = (launches * accelerator.kernel_launch_us * 1e-6 + message_passes * 64e6
                / (accelerator.hbm_bytes_per_s * accelerator.memory_bound_fraction))
    assert model.comm_s(copied) - model.comm_s(op) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("extra", [{}, {"copies": 32}])
def test_host_time_before_a_collective_adds_to_its_duration(extra: dict[str, int]) -> None:
    model = costs(system(), nodes=4)
    op = CommOp("z3_ag", "all_gather", "dp", "F", 64e6, **extra)
    hosted = CommOp("z3_ag", "all_gather", "dp", "F", 64e6, host_s=1.5e-3, **extra)
    assert model.comm_s(hosted) - model.comm_s(op) == pytest.approx(1.5e-3, rel=1e-9)


# -- a collective library's own model (NCCL's tuner) ----------------------------------------

NCCL_2021 = read_yaml(catalog.path_of("collectives", "nccl-2021"))
LIBRARY = CollectiveLibrary.model_validate(NCCL_2021)
NCCL_2024 = read_yaml(catalog.path_of("collectives", "nccl-2024"))
LIBRARIES = {"nccl-2021": NCCL_2021, "nccl-2024": NCCL_2024}


def test_library_ring_and_tree_follow_the_tuner_formulas() -> None:
    """dp over 16 nodes, one member per node (ppn 1): NCCL 2021's ring and tree."""
    model = costs(system(network={**FAT_TREE, "collectives": NCCL_2021}), nodes=16, tp=8)
    path = model.collectives.path("dp")
    assert path is not None and (path.ranks, path.nodes, path.per_node) == (16, 16, 1)
    bus = 8 * 25e9 * 0.9 / 8  # the node's NICs shared by its 8 dp groups
    hop_us = 1.0  # one leaf switch

    def ring(s: float, base: float, net: float, fraction: float) -> float:
        latency = base + 2 * 15 * (net + hop_us)  # every step crosses the network
        if base == 8.4 and s >= 16 / 16 * 65536:
            latency *= 1.9  # the plateau of a large Simple ring all-reduce
        return latency * 1e-6 + 2 * 15 / 16 * s / (bus * fraction)

    def tree(s: float, base: float, net: float, cap: float, fraction: float,
             correction: float) -> float:
        latency = base + 2 * (0 + 4 * (net + hop_us))  # log2(16) levels, no local chain
        return latency * 1e-6 + 2 * s / (min(bus * 0.9, cap) * fraction * correction)

    s = 1e9  # beyond the tree corrections
    times = algorithm_times_s("all_reduce", s, path, LIBRARY)
    assert times == {
        "ring/ll": pytest.approx(ring(s, 3.6, 2.7, 0.25)),
        "ring/ll128": pytest.approx(ring(s, 10.0, 4.0, 0.7)),  # ppn < 2
        "ring/simple": pytest.approx(ring(s, 8.4, 9.6, 1.0)),
        "tree/ll": pytest.approx(tree(s, 4.4, 5.0, 80e9, 1 / 3.8, 1.0)),
        "tree/ll128": pytest.approx(tree(s, 4.4, 8.5, 105e9, 0.915, 1.0)),
        "tree/simple": pytest.approx(tree(s, 0.0, 50.0, 80e9, 1.0, 1.0)),
    }
    assert min(times, key=times.__getitem__) == "ring/simple"  # 22.5 GB/s is under the caps
    small = algorithm_times_s("all_reduce", 4096, path, LIBRARY)  # size class 6
    assert small["tree/ll"] == pytest.approx(tree(4096, 4.4, 5.0, 80e9, 1 / 3.8, 0.7))
    assert min(small, key=small.__getitem__) == "tree/ll"  # few steps, cheap ones
    assert price(model, "all_reduce", "dp", 4096) == pytest.approx(small["tree/ll"] + LAUNCH_S)


def test_library_gathers_use_only_rings_and_one_node_skips_the_network() -> None:
    model = costs(system(network={**FAT_TREE, "collectives": NCCL_2021}), nodes=1, tp=1)
    path = model.collectives.path("dp")
    assert path is not None and (path.ranks, path.nodes) == (8, 1)
    times = algorithm_times_s("all_gather", 1e8, path, LIBRARY)
    assert set(times) == {"ring/ll", "ring/ll128", "ring/simple"}
    assert times["ring/simple"] == pytest.approx(
        (8.4 + 7 * 3.4) * 1e-6 + 7 / 8 * 1e8 / B_INTRA)
    assert times["ring/ll"] == pytest.approx(  # LL on one node: a third of the bandwidth
        (3.6 + 7 * 0.47) * 1e-6 + 7 / 8 * 1e8 / (B_INTRA / 3))


def test_library_tree_on_eight_members_per_node_pays_the_chain_and_the_cap() -> None:
    """dp groups of 64 with all 8 members on each of 8 nodes: LL128's tree cap is 105 GB/s."""
    model = costs(system(network={**FAT_TREE, "collectives": NCCL_2021}), nodes=8, tp=1)
    path = model.collectives.path("dp")
    assert path is not None and (path.ranks, path.nodes, path.per_node) == (64, 8, 8)
    bus = min(B_INTRA, 8 * 25e9 * 0.9)  # 180 GB/s: the NICs
    s = 1e9
    tree_ll128 = (4.4 + 2 * (7 * 1.2 + 3 * (8.5 + 1.0))) * 1e-6 + 2 * s / (105e9 * 0.915)
    ring_simple = ((8.4 + (126 - 14) * 3.4 + 14 * (9.6 + 1.0)) * 1.9 * 1e-6
                   + 2 * 63 / 64 * s / bus)
    times = algorithm_times_s("all_reduce", s, path, LIBRARY)
    assert times["tree/ll128"] == pytest.approx(tree_ll128)
    assert times["ring/simple"] == pytest.approx(ring_simple)
    assert times["ring/simple"] < times["tree/ll128"]  # the cap halves the tree's rate


@pytest.mark.parametrize(("collective", "per_channel_gbps", "volume"), [
    ("all_gather", 18.3, 63 / 64), ("reduce_scatter", 15.2, 63 / 64),
    ("all_reduce", 16.7, 2 * 63 / 64)])
def test_library_ll128_ring_is_capped_per_channel_of_the_ring_graph(
    collective: str, per_channel_gbps: float, volume: float
) -> None:
    """8 ring-graph channels cap LL128's ring at 8 × ll128MaxBwPerCh, below 0.92 × 180 GB/s;
    the other protocols, and a system that does not give its channels, are not capped."""
    capped_net = {**FAT_TREE, "collectives": NCCL_2021, "ring_graph_channels": 8}
    model = costs(system(network=capped_net), nodes=8, tp=1)
    plain = costs(system(network={**FAT_TREE, "collectives": NCCL_2021}), nodes=8, tp=1)
    path, plain_path = model.collectives.path("dp"), plain.collectives.path("dp")
    assert path is not None and plain_path is not None
    assert (path.ring_channels, plain_path.ring_channels) == (8, 0)
    s = 1e9
    capped = algorithm_times_s(collective, s, path, LIBRARY)
    uncapped = algorithm_times_s(collective, s, plain_path, LIBRARY)
    bus = 8 * 25e9 * 0.9  # the NICs, 180 GB/s
    cap = per_channel_gbps * 8 * 1e9
    assert cap < 0.92 * bus
    assert capped["ring/ll128"] - uncapped["ring/ll128"] == pytest.approx(
        volume * s / cap - volume * s / (0.92 * bus))
    for name in set(capped) - {"ring/ll128"}:
        assert capped[name] == uncapped[name]
    one_node = costs(system(network=capped_net), nodes=1, tp=1).collectives.path("dp")
    assert one_node is not None and one_node.ring_channels == 0  # the graph across nodes only


@settings(max_examples=100, deadline=None)
@given(a=st.floats(1.0, 1e10), b=st.floats(1.0, 1e10), channels=st.integers(1, 32),
       layout=st.sampled_from([(2, 1), (8, 1), (16, 8)]),
       collective=st.sampled_from(["all_reduce", "all_gather", "reduce_scatter"]))
def test_library_ll128_ceiling_only_slows_and_keeps_time_growing_with_size(
    a: float, b: float, channels: int, layout: tuple[int, int], collective: str
) -> None:
    """With the ceiling no call is faster than without, and a bigger one never faster."""
    nodes, tp = layout
    capped_net = {**FAT_TREE, "collectives": NCCL_2021, "ring_graph_channels": channels}
    capped = costs(system(network=capped_net), nodes=nodes, tp=tp)
    plain = costs(system(network={**FAT_TREE, "collectives": NCCL_2021}), nodes=nodes, tp=tp)
    small, big = sorted((a, b))
    for nbytes in (small, big):
        assert price(capped, collective, "dp", nbytes) >= price(plain, collective, "dp", nbytes)
    assert price(capped, collective, "dp", big) >= price(capped, collective, "dp", small)


@settings(max_examples=200, deadline=None)
@given(a=st.floats(1.0, 1e10), b=st.floats(1.0, 1e10), nodes=st.sampled_from([1, 2, 8, 16]),
       tp=st.sampled_from([1, 8]),
       collective=st.sampled_from(["all_reduce", "all_gather", "reduce_scatter"]),
       library=st.sampled_from(["nccl-2021", "nccl-2024"]))
def test_library_bigger_messages_never_take_less_time(
    a: float, b: float, nodes: int, tp: int, collective: str, library: str
) -> None:
    """The tuner's tree corrections rise with size in places; llmsim holds the time there."""
    model = costs(system(network={**FAT_TREE, "collectives": LIBRARIES[library]},
                         collective_units=16), nodes=nodes, tp=tp)
    small, big = sorted((a, b))
    assert price(model, collective, "dp", big) >= price(model, collective, "dp", small)


@settings(max_examples=100, deadline=None)
@given(nbytes=st.floats(1.0, 1e10), gain=st.floats(1.0, 8.0),
       which=st.sampled_from(["fabric_gbps", "nic_gbit", "nics"]),
       layout=st.sampled_from([(8, 1), (16, 8), (4, 2)]),
       library=st.sampled_from(["nccl-2021", "nccl-2024"]))
def test_library_more_bandwidth_never_takes_longer(
    nbytes: float, gain: float, which: str, layout: tuple[int, int], library: str
) -> None:
    nodes, tp = layout
    base: dict[str, Any] = {"fabric_gbps": 300.0, "nic_gbit": 200.0, "nics": 4,
                            "network": {**FAT_TREE, "collectives": LIBRARIES[library]},
                            "collective_units": 16}
    faster = {**base, which: round(base[which] * gain) if which == "nics" else base[which] * gain}
    slow, fast = costs(system(**base), nodes, tp), costs(system(**faster), nodes, tp)
    assert price(fast, "all_reduce", "dp", nbytes) <= price(slow, "all_reduce", "dp", nbytes) * (
        1 + 1e-12)


def test_a_library_without_a_tree_cap_for_a_protocol_is_rejected() -> None:
    broken = {**NCCL_2021, "tree_max_bus_gbps": {"simple": {"two_nodes": 1, "more_nodes": 1}}}
    with pytest.raises(ValueError, match="tree_max_bus_gbps and tree_correction need an entry"):
        CollectiveLibrary.model_validate(broken)


def test_library_2024_steps_floors_caps_and_plateau() -> None:
    """dp groups of 64, all 8 members on each of 8 nodes, 16 channels: NCCL 2024's tuner."""
    library = CollectiveLibrary.model_validate(NCCL_2024)
    model = costs(system(network={**FAT_TREE, "collectives": NCCL_2024}, collective_units=16),
                  nodes=8, tp=1)
    path = model.collectives.path("dp")
    assert path is not None and (path.ranks, path.nodes, path.per_node) == (64, 8, 8)
    bus = min(B_INTRA, 8 * 25e9 * 0.9)  # 180 GB/s: the NICs
    hop_us = 1.0
    # Ring: 2N = 16 network steps; the other 110 fabric steps at no less than the floor.
    ring_ll = (6.6 + 110 * 1.0 + 16 * (2.7 + hop_us)) * 1e-6  # LL's 0.6 us raised to 1.0
    ring_simple = (8.4 + 110 * 3.4 + 16 * (14.0 + hop_us)) * 1e-6  # 3.4 us beats the 3.0 floor
    tree_ll = (6.8 + 2 * (7 * 0.6 + 3 * (5.0 + hop_us))) * 1e-6
    tree_simple = (0.0 + 2 * (7 * 28.0 + 3 * (28.0 + hop_us))) * 1e-6
    s = 1e9  # beyond the tree corrections, past the plateau (64 B x 16 channels x 64 ranks)
    times = algorithm_times_s("all_reduce", s, path, library)
    assert times["ring/ll"] == pytest.approx(ring_ll + 2 * 63 / 64 * s / 20.4e9)  # LL's cap
    assert times["ring/simple"] == pytest.approx(ring_simple * 1.4 + 2 * 63 / 64 * s / bus)
    assert times["tree/ll"] == pytest.approx(tree_ll + 2 * s / 20.4e9)
    assert times["tree/simple"] == pytest.approx(tree_simple + 2 * s / (0.92 * bus))
    below = 64 * 16 * 64 - 1  # just under the plateau
    assert algorithm_times_s("all_reduce", below, path, library)["ring/simple"] == (
        pytest.approx(ring_simple + 2 * 63 / 64 * below / bus))
    tiny = algorithm_times_s("all_reduce", 4096, path, library)  # size class 6: 0.7
    assert tiny["tree/ll"] == pytest.approx(tree_ll + 2 * 4096 / (0.7 * 20.4e9))
    assert min(tiny, key=tiny.__getitem__) == "tree/ll"


def test_library_2024_tree_cap_is_per_channel() -> None:
    """Two channels cap the tree at 2 x 36 GB/s over more than two nodes."""
    library = CollectiveLibrary.model_validate(NCCL_2024)
    model = costs(system(network={**FAT_TREE, "collectives": NCCL_2024}, collective_units=2),
                  nodes=8, tp=1)
    path = model.collectives.path("dp")
    assert path is not None and path.channels == 2
    s = 1e9
    latency = 2 * (7 * 28.0 + 3 * (28.0 + 1.0)) * 1e-6
    assert algorithm_times_s("all_reduce", s, path, library)["tree/simple"] == (
        pytest.approx(latency + 2 * s / 72e9))


def test_a_per_channel_library_needs_the_nodes_channel_count() -> None:
    with pytest.raises(ValueError, match=r"node\.collective_units is 0"):
        system(network={**FAT_TREE, "collectives": NCCL_2024})


def test_a_library_gives_its_tree_cap_one_way() -> None:
    both = {**NCCL_2024, "tree_max_bus_gbps": NCCL_2021["tree_max_bus_gbps"]}
    neither = {k: v for k, v in NCCL_2024.items() if k != "tree_max_bus_gbps_per_channel"}
    for raw in (both, neither):
        with pytest.raises(ValueError, match="either per protocol"):
            CollectiveLibrary.model_validate(raw)


def test_a_stage_group_is_priced_over_every_rank_of_a_pipeline_stage() -> None:
    """tp 4 x dp 16 of a stage on 8 full nodes: a tiny all-reduce takes NCCL's tree with LL."""
    library = CollectiveLibrary.model_validate(NCCL_2024)
    model = costs(system(network={**FAT_TREE, "collectives": NCCL_2024}, collective_units=16),
                  nodes=64, tp=4, pp=8)
    path = model.collectives.path("stage")
    assert path is not None and (path.ranks, path.nodes, path.per_node) == (64, 8, 8)
    times = algorithm_times_s("all_reduce", 48, path, library)
    assert min(times, key=times.__getitem__) == "tree/ll"
    assert price(model, "all_reduce", "stage", 48) == pytest.approx(times["tree/ll"] + LAUNCH_S)
    one_stage = costs(system(), nodes=1, tp=1, pp=8)  # one rank per stage: nothing to reduce
    assert price(one_stage, "all_reduce", "stage", 48) == 0.0


def test_a_broadcast_is_a_chain_of_the_whole_message() -> None:
    """A ring broadcast (Megatron-LM's ``broadcast_data``) pipelines the whole message down
    the n − 1 hops of the chain from its root: bus factor 1 (nccl-tests PERFORMANCE.md)."""
    model = costs(system(), nodes=1, tp=8)
    expected = 1e8 / B_INTRA + 7 * ALPHA_INTRA + LAUNCH_S
    assert price(model, "broadcast", "tp", 1e8) == pytest.approx(expected)
