"""Contention between axes on a torus: rings of two axes that run at once share links.

The overlapped gradient reduction runs beside the backward's TP collectives
(``overlap_dp_comm``); where their rings cross the same torus links, each axis keeps its
own flows' part of every link it uses (max-min fair sharing), and where their boxes lie
along different dimensions nothing changes.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_topology import costs, system, torus

from llmsim.costs.topology import topology_of
from llmsim.costs.topology.base import concurrent_axes
from llmsim.specs import Parallelism


def inter_bw(nodes: int, dims: list[int], axis: str, **parallel: object) -> float:
    path = costs(system(torus(dims), nodes), nodes, **parallel).collectives.path(axis)
    assert path is not None
    return path.inter_bytes_per_s


def test_which_axes_run_at_once_follows_the_overlap_switches() -> None:
    both = Parallelism(overlap_dp_comm=True, overlap_pp_comm=True)
    assert set(concurrent_axes(both, "dp")) == {"tp", "pp", "cp", "ep"}
    assert set(concurrent_axes(both, "tp")) == {"dp", "pp"}
    assert set(concurrent_axes(both, "pp")) == {"dp", "tp", "cp", "ep"}
    none = Parallelism(overlap_dp_comm=False, overlap_pp_comm=False)
    assert all(concurrent_axes(none, a) == () for a in ("tp", "dp", "pp"))
    assert concurrent_axes(Parallelism(overlap_dp_comm=False, overlap_pp_comm=True),
                           "dp") == ()


def test_tp_and_dp_rings_on_one_line_share_its_links_by_their_flows() -> None:
    """A ring of 8 nodes, TP = 2 on neighbours, DP = 4 at a stride of 2. Link 0→1 carries
    two DP flows (0→2, and 7→1 round the ring) and one TP flow (0→1): overlapped, DP keeps
    2/3 of it and TP 1/3; without overlap they take turns and keep all."""
    apart = inter_bw(8, [8], "dp", tp=2, overlap_dp_comm=False)
    together = inter_bw(8, [8], "dp", tp=2, overlap_dp_comm=True)
    assert together == pytest.approx(apart * 2 / 3)
    tp_apart = inter_bw(8, [8], "tp", tp=2, overlap_dp_comm=False)
    tp_together = inter_bw(8, [8], "tp", tp=2, overlap_dp_comm=True)
    assert tp_together == pytest.approx(tp_apart / 3)


def test_boxes_along_different_dimensions_do_not_slow_each_other() -> None:
    """A 4×2 torus: TP = 2 along the inner dimension, DP = 4 along the outer one. Their
    rings use different links, so overlapping them changes nothing."""
    for axis in ("tp", "dp"):
        assert inter_bw(8, [4, 2], axis, tp=2, overlap_dp_comm=True) == inter_bw(
            8, [4, 2], axis, tp=2, overlap_dp_comm=False)


def test_the_placement_says_which_axes_share_the_links() -> None:
    model = costs(system(torus([8]), 8), 8, tp=2, overlap_dp_comm=True)
    route = topology_of(model.plan.system, 8).route(model.plan, model.plan.placements["dp"])
    assert "tp rings run at once" in route.detail


@settings(max_examples=25, deadline=None)
@given(st.sampled_from([[8], [4, 2], [4, 4], [3, 4], [2, 3, 2], [6, 2]]),
       st.sampled_from([1, 2, 4]), st.sampled_from([1, 2]))
def test_running_axes_at_once_never_speeds_a_group(dims: list[int], tp: int, pp: int) -> None:
    nodes = 1
    for d in dims:
        nodes *= d
    if nodes % (tp * pp):
        return
    for axis in ("tp", "dp", "pp"):
        alone = costs(system(torus(dims), nodes), nodes, tp=tp, pp=pp, overlap_dp_comm=False)
        shared = costs(system(torus(dims), nodes), nodes, tp=tp, pp=pp, overlap_dp_comm=True,
                       overlap_pp_comm=True)
        a, s = alone.collectives.path(axis), shared.collectives.path(axis)
        if a is None or s is None:
            continue
        assert 0 < s.inter_bytes_per_s <= a.inter_bytes_per_s * (1 + 1e-12)


# -- fat-tree and dragonfly: the axes' flows that leave a leaf or a group add up ------------


def leaving_layout(network: dict[str, object], overlap: bool) -> float:
    """8 one-device nodes, DP = 4 (neighbours) and PP = 2 (stride 4), two nodes per leaf
    or dragonfly group: the DP ring leaves a leaf once, the two pipeline chains of its
    nodes leave it too; DP's network bandwidth with or without the reduction overlapped."""
    model = costs(system(network, 8, nics=1, nic_gbit=100), 8, pp=2,
                  overlap_dp_comm=overlap)
    path = model.collectives.path("dp")
    assert path is not None
    return path.inter_bytes_per_s


@pytest.mark.parametrize("kind", ["fat_tree", "dragonfly"])
def test_flows_of_an_overlapped_axis_share_the_tapered_links(kind: str) -> None:
    """Uplinks (global links) of half the leaf's (group's) injection: DP's one flow alone
    fits; with the two pipeline flows of its nodes at once the three would need 3 NICs'
    worth, the two nodes inject at most 2, so DP keeps half its rate."""
    network: dict[str, object] = (
        {"kind": "fat_tree", "nodes_per_leaf": 2, "oversubscription": 2.0}
        if kind == "fat_tree" else
        {"kind": "dragonfly", "nodes_per_group": 2, "global_taper": 2.0})
    network = {**network, "hop_latency_us": 0.0, "efficiency": 1.0}
    alone, together = leaving_layout(network, False), leaving_layout(network, True)
    assert together == pytest.approx(alone / 2)


def test_a_non_blocking_fat_tree_is_not_slowed_by_an_overlapped_axis() -> None:
    """The same layout on full-bisection uplinks: the nodes cannot inject more than the
    uplinks carry, so overlapping the reduction changes nothing (the NVIDIA validation
    rows' fabrics)."""
    network = {"kind": "fat_tree", "nodes_per_leaf": 2, "oversubscription": 1.0,
               "hop_latency_us": 0.0, "efficiency": 1.0}
    assert leaving_layout(network, True) == leaving_layout(network, False)
