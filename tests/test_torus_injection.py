"""A torus node's network interfaces shared by the axes whose transfers run at once.

Tofu-D injects through 6 TNIs of 6.8 GB/s each (Ajima et al., IEEE Cluster 2018): TP, PP
and DP groups along different dimensions use different links, but every transfer leaves
the node through the same interfaces. With the gradient reduction overlapped
(``overlap_dp_comm``), the links the axes drive at once share the node's injection
(:meth:`~llmsim.costs.topology.TorusTopology.injection_share`)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_topology import EFFICIENCY, HOP_US, LAUNCH_S, LINK_GBPS, costs, price, system, torus

from llmsim import load_scenario
from llmsim.costs.topology import placement_rows, topology_of
from llmsim.plan import Plan

LINK = LINK_GBPS * 1e9 * EFFICIENCY


def _layout(nics: int, overlap: bool):
    """A 4×4×4 torus of one-device nodes: TP = 4 on a closed ring of the inner dimension
    (2 links a direction), DP = 16 on the outer two (one ring per dimension: 2 + 2
    links), ``nics`` network interfaces of one link's rate per node."""
    return costs(system(torus([4, 4, 4]), 64, nics=nics, nic_gbit=LINK_GBPS * 8), 64, tp=4,
                 overlap_dp_comm=overlap)


@pytest.mark.parametrize("nbytes", [1e7, 1e9])
def test_two_axes_at_once_take_longer_than_either_alone_by_the_closed_form(
        nbytes: float) -> None:
    """Four interfaces: TP drives 2 links and DP 4, 6 links' demand on 4 interfaces, so
    each keeps 4/6 of its rate: TP's ring all-reduce of S along its closed ring of 4 takes
    2(k−1)/k·S / (2·B·2/3) + 2(k−1) hop latencies, against 2(k−1)/k·S / (2·B) alone."""
    k = 4
    alone = price(_layout(4, overlap=False), "all_reduce", "tp", nbytes)
    together = price(_layout(4, overlap=True), "all_reduce", "tp", nbytes)
    steps = 2 * (k - 1) * HOP_US * 1e-6 + LAUNCH_S
    volume = 2 * (k - 1) / k * nbytes
    assert alone == pytest.approx(volume / (2 * LINK) + steps)
    assert together == pytest.approx(volume / (2 * LINK * 4 / 6) + steps)
    dp_alone = _layout(4, overlap=False).collectives.path("dp")
    dp_together = _layout(4, overlap=True).collectives.path("dp")
    assert dp_together.multidim_bytes_per_s == pytest.approx(
        dp_alone.multidim_bytes_per_s * 4 / 6)


def test_enough_interfaces_leave_the_axes_alone() -> None:
    """Six interfaces carry TP's 2 links and DP's 4 at once: nothing changes."""
    for axis in ("tp", "dp"):
        assert (_layout(6, overlap=True).collectives.path(axis).inter_bytes_per_s
                == _layout(6, overlap=False).collectives.path(axis).inter_bytes_per_s)


def test_the_placement_says_the_interfaces_are_shared() -> None:
    model = _layout(4, overlap=True)
    route = topology_of(model.plan.system, 64).route(model.plan, model.plan.placements["tp"])
    assert "4 network interfaces leave it 67 %" in route.detail
    assert "dp transfers at once" in route.detail


@settings(max_examples=20, deadline=None)
@given(nics=st.integers(1, 8))
def test_fewer_interfaces_never_speed_a_group(nics: int) -> None:
    for axis in ("tp", "dp"):
        fewer = _layout(nics, overlap=True).collectives.path(axis).inter_bytes_per_s
        more = _layout(nics + 1, overlap=True).collectives.path(axis).inter_bytes_per_s
        assert 0 < fewer <= more * (1 + 1e-12)


def test_fugaku_scenario_shows_tp_and_dp_sharing_the_tnis() -> None:
    """fugaku.yaml overlaps the gradient reduction: TP's box drives 4 links (c line, b
    ring, a line) and DP's 4 (Z and Y rings), 8 on 6 TNIs, so TP keeps 6/8; DP also
    meets the pipeline's one send, 9 on 6."""
    plan = Plan.from_scenario(load_scenario("fugaku"))
    rows = {r["axis"]: r["route"] for r in placement_rows(plan)}
    assert "6 network interfaces leave it 75 %" in str(rows["tp"])
    assert "6 network interfaces leave it 67 %" in str(rows["dp"])
