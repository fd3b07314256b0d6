"""Expert- and context-parallel traffic in the contention between axes.

With the gradient reduction overlapped (``overlap_dp_comm``) the backward's expert
all-to-alls and context-parallel ring passes run beside it
(:func:`~llmsim.costs.topology.base.concurrent_axes`). The ring passes load links as a
ring does; an all-to-all sends ``1/(n − 1)`` of each member's rate to every other member
(:func:`~llmsim.costs.topology.base.alltoall_leaving` on a leaf or dragonfly group, routed
pair by pair on a torus)."""

from __future__ import annotations

from typing import Any

import pytest
from test_topology import system, torus

from llmsim.costs import HardwareCosts
from llmsim.costs.topology import topology_of
from llmsim.costs.topology.base import concurrent_axes
from llmsim.plan import Plan
from llmsim.specs import Parallelism

NIC = 100e9 / 8
ORDER = ["dp", "tp", "cp", "ep", "pp"]


def layout(network: dict[str, Any], other: str, overlap: bool, **switches: bool) -> Plan:
    """8 one-NIC nodes: DP = 4 on consecutive nodes, and ``other`` (ep or cp) = 2 between
    nodes 4 apart (0 and 4, 1 and 5 ...)."""
    sysm = system(network, 8, nics=1, nic_gbit=100)
    par = Parallelism(**{other: 2}, dp=4, rank_order=ORDER, overlap_dp_comm=overlap,
                      **switches)
    return Plan(sysm, 8, par, 4)


def dp_bandwidth(network: dict[str, Any], other: str, overlap: bool) -> float:
    plan = layout(network, other, overlap)
    path = HardwareCosts(plan.system, plan, "bf16").collectives.path("dp")
    assert path is not None
    return path.inter_bytes_per_s


def test_ep_and_cp_run_beside_the_overlapped_reduction_and_the_pipeline() -> None:
    both = Parallelism(overlap_dp_comm=True, overlap_pp_comm=True)
    for axis in ("ep", "cp"):
        assert set(concurrent_axes(both, axis)) == {"dp", "pp"}
    only_pp = Parallelism(overlap_dp_comm=False, overlap_pp_comm=True)
    assert set(concurrent_axes(only_pp, "ep")) == {"pp"}
    assert concurrent_axes(Parallelism(overlap_dp_comm=False), "cp") == ()


@pytest.mark.parametrize("kind", ["fat_tree", "dragonfly"])
@pytest.mark.parametrize("other", ["ep", "cp"])
def test_an_overlapped_ep_or_cp_axis_shares_the_tapered_links(kind: str, other: str) -> None:
    """Leaves (groups) of 2 nodes with uplinks of half their injection, one NIC's worth.
    DP's ring leaves leaf 0 once (1→2); the pairs 0↔4 and 1↔5 leave it twice more, the
    all-to-all's whole traffic as each member has one other member, the ring's two steps
    out. Alone DP's flow fits; at once 3 flows on 2 nodes' injection, on one NIC's
    worth of uplinks: DP keeps half its rate."""
    network: dict[str, Any] = (
        {"kind": "fat_tree", "nodes_per_leaf": 2, "oversubscription": 2.0}
        if kind == "fat_tree" else
        {"kind": "dragonfly", "nodes_per_group": 2, "global_taper": 2.0})
    network = {**network, "hop_latency_us": 0.0, "efficiency": 1.0}
    assert dp_bandwidth(network, other, overlap=False) == pytest.approx(NIC)
    assert dp_bandwidth(network, other, overlap=True) == pytest.approx(NIC / 2)


@pytest.mark.parametrize(("other", "share"), [("ep", 1 / 5), ("cp", 1 / 5)])
def test_on_a_torus_ep_and_cp_flows_cross_the_dp_ring_s_links(other: str,
                                                               share: float) -> None:
    """A ring of 8 nodes: DP's group 0-3 is a line, its step 2→3 on link 2→3. The pairs
    0↔4, 1↔5, 2↔6, 3↔7 are 4 hops either way (ties go forward), so 0→4, 1→5, 2→6 and
    7→3 cross link 2→3 too: one DP flow of five, DP keeps 1/5 (an all-to-all of two
    members sends all of its rate to the other, as the ring of two does)."""
    alone = dp_bandwidth({**torus([8])}, other, overlap=False)
    together = dp_bandwidth({**torus([8])}, other, overlap=True)
    assert together == pytest.approx(alone * share)
    plan = layout(torus([8]), other, overlap=True)
    route = topology_of(plan.system, 8).route(plan, plan.placements["dp"])
    assert f"{other} {'transfers' if other == 'ep' else 'rings'} run at once" in route.detail


def test_a_larger_all_to_all_spreads_its_traffic() -> None:
    """Expert groups of 4 on nodes 0, 2, 4, 6 and 1, 3, 5, 7, leaves of 4 nodes: each
    member sends a third of its rate to each other member; a member on leaf 0 has one
    other member there and two on leaf 1, so 2/3 of its rate leaves; leaf 0's four
    members send 8/3 flows' worth to leaf 1."""
    from llmsim.costs.topology.base import alltoall_leaving

    network = {"kind": "fat_tree", "nodes_per_leaf": 4, "oversubscription": 2.0,
               "hop_latency_us": 0.0, "efficiency": 1.0}
    sysm = system(network, 8, nics=1, nic_gbit=100)
    plan = Plan(sysm, 8, Parallelism(ep=4, dp=2, rank_order=ORDER), 2)
    assert plan.members("ep", 0) == [0, 2, 4, 6]
    leaving = alltoall_leaving(plan, "ep", range(0, 4), lambda n: n // 4)
    assert leaving == {1: pytest.approx(8 / 3)}
