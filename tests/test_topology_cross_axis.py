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
    assert set(concurrent_axes(both, "dp")) == {"tp", "pp"}
    assert set(concurrent_axes(both, "tp")) == {"dp", "pp"}
    assert set(concurrent_axes(both, "pp")) == {"dp", "tp"}
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
