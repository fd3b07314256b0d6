"""All-to-all pricing (llmsim.costs.alltoall): closed forms on one node, across nodes,
over a tapered level and on a torus; monotone in the message size."""

from __future__ import annotations

import pytest
from helpers import make_scenario
from hypothesis import given, settings
from hypothesis import strategies as st

from llmsim.costs import HardwareCosts
from llmsim.costs.alltoall import (
    all_to_all_s,
    torus_all_to_all_node_bytes_per_s,
    torus_sub_block,
)
from llmsim.costs.collectives import GroupPath
from llmsim.ops import CommOp
from llmsim.plan import Plan

MOE = {"experts": 64, "top_k": 2, "ffn_hidden": 1024}
S = 64e6  # bytes per rank


def costs_for(**overrides) -> HardwareCosts:
    settings = {"model__moe": MOE, "parallelism__tp": 1, "parallelism__pp": 1,
                "training__global_batch": 256} | overrides
    scenario = make_scenario(**settings)
    return HardwareCosts.from_scenario(scenario, Plan.from_scenario(scenario))


def a2a(costs: HardwareCosts, nbytes: float = S) -> float:
    return costs.comm_s(CommOp("moe_dispatch", "all_to_all", "ep", "F", nbytes))


def test_one_node_moves_seven_eighths_over_the_fabric():
    """Selene, ep 8 on one DGX A100: t = α + S·7/8 / (300 GB/s · 0.78) + launch."""
    costs = costs_for(parallelism__ep=8)
    expected = 3.4e-6 + S * 7 / 8 / (300e9 * 0.78) + 4e-6
    assert a2a(costs) == pytest.approx(expected, rel=1e-12)


def test_across_two_nodes_the_network_share_sets_the_pace():
    """ep 16 on two nodes: each node's 8 members send S·8/16 each through 8 × 200 Gb/s
    at 0.9 efficiency (the fabric's S·7/16 is faster)."""
    costs = costs_for(nodes=2, parallelism__ep=16)
    network = 9.6e-6 + 1e-6 + 8 * S * 8 / 16 / (8 * 25e9 * 0.9)
    fabric = 3.4e-6 + S * 7 / 16 / (300e9 * 0.78)
    assert network > fabric
    assert a2a(costs) == pytest.approx(network + 4e-6, rel=1e-12)


def test_one_rank_or_no_bytes_costs_nothing():
    assert a2a(costs_for(parallelism__ep=1)) == 0.0
    assert a2a(costs_for(parallelism__ep=8), 0.0) == 0.0


PATH = GroupPath(ranks=64, nodes=8, per_node=8, intra_bytes_per_s=200e9,
                 intra_latency_s=2e-6, inter_bytes_per_s=100e9, inter_latency_s=10e-6)


def test_crossing_a_tapered_level_closed_form():
    """Of a node's k·S·(n−k)/n bytes, the crossing share goes at the tapered rate; the
    slower of the two bounds sets the time."""
    leaving = 8 * S * 56 / 64
    flat = all_to_all_s(S, PATH)
    assert flat == pytest.approx(max(2e-6 + S * 7 / 64 / 200e9, 10e-6 + leaving / 100e9))
    tapered = all_to_all_s(S, PATH, crossing_share=0.75, crossing_bytes_per_s=50e9)
    assert tapered == pytest.approx(10e-6 + leaving * 0.75 / 50e9)
    assert all_to_all_s(S, PATH, 0.25, 50e9) == pytest.approx(flat)  # taper not binding


def frontier_ep(cabinets: int) -> HardwareCosts:
    """ep over ``cabinets`` × 128 Frontier nodes, one member per node (dp 8 inside)."""
    ep = 128 * cabinets
    return costs_for(system="frontier", nodes=ep, parallelism__ep=ep, parallelism__dp=8,
                     parallelism__rank_order=["tp", "cp", "dp", "ep", "pp"],
                     model__moe=MOE | {"experts": ep}, training__global_batch=8 * ep)


def test_a_dragonfly_group_across_cabinets_pays_the_global_taper():
    """Frontier (global taper 1.753): spread over D cabinets, (D−1)/D of a node's traffic
    crosses the global links. Over two cabinets the taper does not bind (0.5 × 1.753 <
    1); over four it does, and the time is 0.75 × 1.753 of the untapered one."""
    one, two, four = frontier_ep(1), frontier_ep(2), frontier_ep(4)
    assert [c.all_to_all._shape("ep")[1] for c in (one, two, four)] == [0.0, 0.5, 0.75]
    untapered = S * 127 / 128
    assert a2a(two) / a2a(one) == pytest.approx(255 / 256 / (127 / 128), rel=1e-3)
    assert a2a(four) / a2a(one) == pytest.approx(0.75 * 1.753 * S * 511 / 512 / untapered,
                                                 rel=1e-3)


def test_torus_sub_block_and_bisection_bound():
    """Fugaku (24×23×24×2×3×2, 6.8 GB/s links): 64 nodes form a 2⁶ block, a mesh in the
    long dimensions: a node sends at most 4·(N/2)·6.8/N = 13.6 GB/s, under its
    6 × 6.8 GB/s injection."""
    scenario = make_scenario(system="fugaku", nodes=8, training__precision="fp16")
    torus = scenario.system.network
    assert torus_sub_block(torus, 64) == [2, 2, 2, 2, 2, 2]
    injection = scenario.system.node.injection_bytes_per_s
    assert torus_all_to_all_node_bytes_per_s(torus, 64, injection) == pytest.approx(13.6e9)
    assert torus_all_to_all_node_bytes_per_s(torus, 1, injection) == injection
    # Bigger blocks have longer sides and a smaller share of the bisection per node.
    rates = [torus_all_to_all_node_bytes_per_s(torus, n, injection) for n in (64, 512, 4096)]
    assert rates == sorted(rates, reverse=True)


@given(small=st.floats(1e3, 1e9), factor=st.floats(1.0, 100.0),
       share=st.floats(0.0, 1.0), nodes=st.integers(1, 16), per_node=st.integers(1, 8))
@settings(max_examples=60)
def test_a_bigger_buffer_never_takes_less_time(small, factor, share, nodes, per_node):
    path = GroupPath(ranks=nodes * per_node, nodes=nodes, per_node=per_node,
                     intra_bytes_per_s=150e9, intra_latency_s=3e-6,
                     inter_bytes_per_s=50e9 * per_node, inter_latency_s=8e-6)
    assert all_to_all_s(small * factor, path, share, 20e9) >= all_to_all_s(small, path,
                                                                             share, 20e9)
