"""Plan: rank ↔ coordinates, group strides and the network level each group crosses."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmsim.loader import load_scenario, load_spec
from llmsim.plan import AXES, Plan
from llmsim.specs import Parallelism, System

SELENE_LEVEL_NODE = "intra-node (NVLink3 + 6 NVSwitch)"


@pytest.fixture(scope="module")
def selene() -> System:
    """DGX A100 nodes of 8 GPUs on a fat-tree with 20-node leaves (template catalog file)."""
    return load_spec("systems", "selene")


@pytest.fixture(scope="module")
def frontier_like() -> System:
    """8 GCDs per node (pairs share a package) on a dragonfly of 128-node groups.

    The layout is Frontier's (hardware.md: 1 cabinet = 1 group of 128 nodes, global taper
    1.753); the device numbers are placeholders, since only the layout matters here.
    """
    return System.model_validate(
        {
            "name": "frontier-like",
            "nodes": 512,
            "node": {
                "accelerator": {
                    "name": "gcd",
                    "device_unit": "gcd",
                    "dense_tflops": {"bf16": 191.5},
                    "hbm_gb": 64,
                    "hbm_tbps": 1.6,
                    "gemm": {"peak_fraction": 0.7, "compute_units": 110},
                    "memory_bound_fraction": 0.8,
                },
                "devices_per_node": 8,
                "fabric_name": "Infinity Fabric",
                "fabric": [
                    {"devices": 2, "gbps_per_direction": 200, "efficiency": 0.8},
                    {"devices": 8, "gbps_per_direction": 50, "efficiency": 0.8},
                ],
                "nics_per_node": 4,
                "nic_gbit": 200,
            },
            "network": {"kind": "dragonfly", "nodes_per_group": 128, "global_taper": 1.753},
        }
    )


def plan(system: System, tp: int, pp: int, dp: int, **par: object) -> Plan:
    devices = tp * pp * dp
    nodes = max(1, devices // system.node.devices_per_node)
    return Plan(system, nodes, Parallelism(tp=tp, pp=pp, dp=dp, **par), dp)


def node_of(plan_: Plan, rank: int) -> int:
    return plan_.location(rank)[0]


# ---------------------------------------------------------------- ranks and groups


@settings(max_examples=60, deadline=None)
@given(
    tp=st.sampled_from([1, 2, 4, 8]),
    pp=st.sampled_from([1, 2, 4]),
    dp=st.sampled_from([1, 2, 3, 4]),
    order=st.permutations(list(AXES)),
)
def test_rank_and_coordinates_round_trip(selene: System, tp, pp, dp, order) -> None:
    p = plan(selene, tp, pp, dp, rank_order=order)
    devices = tp * pp * dp
    for rank in range(devices):
        coords = p.coords(rank)
        assert all(0 <= coords[a] < p.degrees[a] for a in AXES)
        assert p.rank(**coords) == rank
    for axis in ("tp", "dp", "pp"):
        groups = {tuple(p.members(axis, r)) for r in range(devices)}
        assert sorted(r for g in groups for r in g) == list(range(devices))  # a partition
        for group in groups:
            assert len(group) == p.degrees[axis]
            others = {tuple(v for a, v in p.coords(r).items() if a != axis) for r in group}
            assert len(others) == 1  # members differ only along their own axis


def test_tp_innermost_keeps_tp_groups_inside_a_node(selene: System) -> None:
    for tp in (2, 4, 8):
        p = plan(selene, tp, 4, 4)
        for rank in range(p.devices):
            assert len({node_of(p, m) for m in p.members("tp", rank)}) == 1
        g = p.placement("tp")
        assert (g.stride, g.nodes_spanned, g.span_devices) == (1, 1, tp)
        assert g.level == SELENE_LEVEL_NODE
        assert not g.crosses_nodes


def test_dp_group_stride_is_tp(selene: System) -> None:
    p = plan(selene, 8, 4, 4)
    assert p.members("dp", 0) == [0, 8, 16, 24]
    g = p.placement("dp")
    assert g.stride == 8 and g.members_per_node == 1
    assert g.groups_per_node == 8  # the 8 DP groups of one node share its NICs
    p4 = plan(selene, 4, 1, 8)
    assert p4.placement("dp").stride == 4
    assert p4.placement("dp").members_per_node == 2


def test_pp_group_spans_nodes(selene: System) -> None:
    p = plan(selene, 8, 4, 4)
    assert p.members("pp", 0) == [0, 32, 64, 96]
    assert [node_of(p, r) for r in p.members("pp", 0)] == [0, 4, 8, 12]
    g = p.placement("pp")
    assert g.crosses_nodes and g.nodes_spanned == 4 and g.level == "leaf switch"


@settings(max_examples=40, deadline=None)
@given(
    tp=st.sampled_from([1, 2, 4]),
    pp=st.sampled_from([1, 2, 4]),
    dp=st.sampled_from([1, 2, 3]),
    order=st.permutations(list(AXES)),
)
def test_a_stage_group_is_every_rank_of_one_pipeline_stage(selene: System, tp, pp, dp,
                                                             order) -> None:
    p = plan(selene, tp, pp, dp, rank_order=order)
    groups = {tuple(p.members("stage", r)) for r in range(p.devices)}
    assert len(groups) == pp
    for group in groups:
        assert len(group) == tp * dp
        assert len({p.coords(r)["pp"] for r in group}) == 1


def test_a_stage_group_of_megatrons_order_is_a_block_of_whole_nodes(selene: System) -> None:
    """tp 4 × dp 16 of one stage, pp outermost: ranks 64s … 64s + 63, 8 full nodes."""
    p = plan(selene, 4, 8, 16)
    assert p.members("stage", 64 * 3 + 5) == list(range(192, 256))
    g = p.placement("stage")
    assert (g.size, g.nodes_spanned, g.members_per_node, g.span_devices) == (64, 8, 8, 8)


def test_other_rank_orders(selene: System) -> None:
    p = plan(selene, 2, 2, 4, rank_order=["dp", "tp", "cp", "ep", "pp"])
    assert p.strides["dp"] == 1 and p.strides["tp"] == 4 and p.strides["pp"] == 8
    assert p.members("tp", 1) == [1, 5]


# ---------------------------------------------------------------- network levels


def test_selene_levels(selene: System) -> None:
    assert plan(selene, 1, 1, 8).placement("tp").level == "none (one device)"
    within_leaf = plan(selene, 8, 1, 16).placement("dp")
    assert (within_leaf.nodes_spanned, within_leaf.domains_spanned) == (16, 1)
    assert within_leaf.level == "leaf switch"
    spine = plan(selene, 8, 1, 64).placement("dp")
    assert (spine.nodes_spanned, spine.domains_spanned) == (64, 4)
    assert spine.level == "fat-tree spine"


def test_worst_group_counts_leaf_boundaries(selene: System) -> None:
    """DP groups of 3 nodes: the one on nodes 18-20 straddles two 20-node leaves."""
    p = plan(selene, 8, 7, 3)
    assert [node_of(p, r) for r in p.members("dp", 6 * 24)] == [18, 19, 20]
    g = p.placement("dp")
    assert g.nodes_spanned == 3 and g.domains_spanned == 2 and g.level == "fat-tree spine"


def test_frontier_like_levels(frontier_like: System) -> None:
    pair = plan(frontier_like, 2, 1, 4).placement("tp")
    assert pair.span_devices == 2
    assert frontier_like.node.tier_for(pair.span_devices).gbps_per_direction == 200
    node = plan(frontier_like, 8, 1, 1).placement("tp")
    assert node.level == "intra-node (Infinity Fabric)"
    assert frontier_like.node.tier_for(node.span_devices).gbps_per_direction == 50
    group = plan(frontier_like, 8, 1, 128).placement("dp")
    assert (group.domains_spanned, group.level) == (1, "dragonfly group")
    glob = plan(frontier_like, 8, 1, 256).placement("dp")
    assert (glob.domains_spanned, glob.level) == (2, "dragonfly global links")


def test_plan_of_the_selene_gpt3_template() -> None:
    p = Plan.from_scenario(load_scenario("selene-gpt3"))
    assert p.degrees == {"tp": 8, "cp": 1, "ep": 1, "dp": 16, "pp": 8}
    assert p.devices == 1024
    rows = {row["axis"]: row for row in p.describe()}
    assert set(rows) == {"tp", "dp", "pp"}
    assert rows["tp"]["level"] == SELENE_LEVEL_NODE
    assert (rows["dp"]["stride"], rows["pp"]["stride"]) == (8, 128)
    # Stage 1's DP group sits on nodes 16-31, across two leaves.
    assert rows["dp"]["level"] == "fat-tree spine"
    assert rows["pp"]["nodes_spanned"] == 8


# ---------------------------------------------------------------- placement in closed form


@settings(max_examples=80, deadline=None)
@given(tp=st.sampled_from([1, 2, 3, 4, 8, 16]), pp=st.sampled_from([1, 2, 3, 4, 8]),
       dp=st.integers(1, 40), cp=st.sampled_from([1, 2, 3]),
       order=st.permutations(AXES), dragonfly=st.booleans())
def test_placement_in_closed_form_is_the_enumerated_one(selene, frontier_like, tp, pp, dp,
                                                        cp, order, dragonfly):
    """Every group of evenly spaced ranks measured in closed form has the shape its ranks,
    enumerated, give: nodes and domains spanned, most members on a node, widest span."""
    system = frontier_like if dragonfly else selene
    devices = tp * pp * dp * cp
    nodes = -(-devices // system.node.devices_per_node)
    p = Plan(system, nodes, Parallelism(tp=tp, pp=pp, dp=dp, cp=cp, rank_order=order), dp)
    checked = 0
    for axis in (*AXES, "stage", "cp+dp"):
        progression = p._progression(axis)
        if progression is None:
            continue
        firsts = p._first_rank_of_groups(axis)
        shapes = zip(*(a.tolist() for a in p._progression_shapes(firsts, *progression)),
                     strict=True)
        for first, shape in zip(firsts, shapes, strict=True):
            members = p.members(axis, first)
            assert progression[1] == len(members)
            assert shape == p._enumerated_shape(members)
            checked += 1
        for rank in range(0, devices, max(1, devices // 16)):
            assert p.group_first(axis, rank) == min(p.members(axis, rank))
    assert checked > 0


def test_placement_of_a_hundred_thousand_gpus_takes_no_time_per_gpu(selene):
    """A data-parallel group of 12,500 nodes is measured without listing its ranks."""
    import time

    p = plan(selene, 8, 1, 12_500)
    start = time.process_time()
    g = p.placement("dp")
    assert time.process_time() - start < 0.05
    assert (g.size, g.nodes_spanned, g.members_per_node) == (12_500, 12_500, 1)
    assert g.domains_spanned == -(-12_500 // selene.network.nodes_per_leaf)


def reference_placement(p: Plan, axis: str):
    """:meth:`Plan.placement` as it was at 16721c8, every group's shape enumerated rank by
    rank (equal to the closed form, above): a placement made for every group, the first of
    the largest (nodes, domains, span) kept."""
    import math

    from llmsim.plan import GroupPlacement

    worst = None
    for first in p._first_rank_of_groups(axis):
        members = p.members(axis, first)
        size = len(members)
        nodes, domains, local, span = p._enumerated_shape(members)
        dpn = p.system.node.devices_per_node
        placement = GroupPlacement(
            axis=axis, size=size,
            stride=min(p._stride(a) for a in p.axes_of(axis)) if "+" in axis
            else p._stride(axis) if axis != "stage" else 1,
            members_per_node=local, nodes_spanned=nodes, domains_spanned=domains,
            groups_per_node=max(1, min(dpn, math.ceil(dpn / local))) if nodes > 1 else 1,
            span_devices=span, level=p._level(nodes, domains, span), first_rank=first)
        if worst is None or (nodes, domains, span) > (
                worst.nodes_spanned, worst.domains_spanned, worst.span_devices):
            worst = placement
    return worst


@settings(max_examples=80, deadline=None)
@given(tp=st.sampled_from([1, 2, 3, 4, 8, 16]), pp=st.sampled_from([1, 2, 3, 4, 8]),
       dp=st.integers(1, 40), cp=st.sampled_from([1, 2, 3]),
       order=st.permutations(AXES), dragonfly=st.booleans())
def test_the_worst_group_is_placed_once_as_every_group_was(selene, frontier_like, tp, pp,
                                                          dp, cp, order, dragonfly):
    """The placement of every axis (joined ones and ``stage`` too, in closed form or
    enumerated) equals the one found by placing every group, each group's shape
    enumerated (session s16 makes only the worst group's placement, from every group's
    shape in closed form at once), and ``group_first`` of a numpy array of ranks is each
    rank's."""
    import numpy as np

    system = frontier_like if dragonfly else selene
    devices = tp * pp * dp * cp
    nodes = -(-devices // system.node.devices_per_node)
    p = Plan(system, nodes, Parallelism(tp=tp, pp=pp, dp=dp, cp=cp, rank_order=order), dp)
    for axis in (*AXES, "stage", "cp+dp", "tp+cp", "pp+dp"):
        assert p.placement(axis) == reference_placement(p, axis)
        ranks = np.arange(devices, dtype=np.int64)
        assert p.group_first(axis, ranks).tolist() == [p.group_first(axis, int(r))
                                                       for r in ranks]
