"""The fat-tree's count of ring steps leaving a leaf equals the walk over every group.

:meth:`FatTreeTopology._leaving` visits only the members on the leaf (issue #37: a
walk over every ring step of every group touching the leaf grew with the data-parallel
degree, 1.33× the simulate CPU at 99,840 GPUs); the count must be the walk's, so that
every route's share is unchanged.
"""

from __future__ import annotations

import time

from hypothesis import given, settings
from hypothesis import strategies as st

from llmsim import load_scenario
from llmsim.costs.topology.base import groups_touching, is_chain, rank_steps
from llmsim.costs.topology.fat_tree import FatTreeTopology
from llmsim.plan import Plan
from llmsim.specs import FatTree, Parallelism, System

AXES = ["tp", "dp", "pp", "cp", "stage", "cp+dp"]
ORDERS = [["tp", "cp", "ep", "dp", "pp"], ["tp", "cp", "ep", "pp", "dp"],
          ["pp", "tp", "cp", "ep", "dp"], ["dp", "pp", "tp", "cp", "ep"]]


def _walk(topology: FatTreeTopology, plan: Plan, axis: str, leaf_nodes: range, k: int) -> int:
    """The reference: group by group, step by step."""
    return sum(1 for group in groups_touching(plan, axis, leaf_nodes)
               for a, b in rank_steps(plan, group, is_chain(axis))
               if plan.location(a)[0] in leaf_nodes and topology._crosses(plan, a, b, k))


def _system(devices: int, leaf: int, rails: bool, nodes: int) -> System:
    return System.model_validate({
        "name": "test-fat-tree", "nodes": nodes,
        "node": {"accelerator": {"name": "test-device", "dense_tflops": {"bf16": 100.0},
                                 "hbm_gb": 32, "hbm_tbps": 1.0,
                                 "gemm": {"peak_fraction": 0.8, "compute_units": 48},
                                 "memory_bound_fraction": 0.8, "kernel_launch_us": 5.0},
                 "devices_per_node": devices,
                 "fabric": [{"devices": devices, "gbps_per_direction": 300.0,
                             "efficiency": 0.8, "latency_us": 2.0}] if devices > 1 else [],
                 "nics_per_node": devices, "nic_gbit": 200},
        "network": {"kind": "fat_tree", "nodes_per_leaf": leaf, "oversubscription": 2.0,
                    "rail_optimized": rails, "hop_latency_us": 1.0, "efficiency": 0.9},
    })


@settings(max_examples=80, deadline=None)
@given(devices=st.sampled_from([1, 4, 6, 8]), leaf=st.sampled_from([1, 2, 3, 5, 20]),
       rails=st.booleans(), tp=st.sampled_from([1, 2, 4, 8]),
       pp=st.sampled_from([1, 2, 3, 8]), cp=st.sampled_from([1, 2]),
       dp=st.sampled_from([1, 2, 3, 5, 12, 40]), order=st.sampled_from(ORDERS),
       axis=st.sampled_from(AXES), where=st.floats(0, 1), k=st.sampled_from([1, 2, 8]))
def test_the_count_on_the_leaf_is_the_walk(devices, leaf, rails, tp, pp, cp, dp, order,
                                          axis, where, k):
    ranks = tp * pp * cp * dp
    nodes = -(-ranks // devices)
    system = _system(devices, leaf, rails, nodes)
    plan = Plan(system, nodes, Parallelism(tp=tp, pp=pp, cp=cp, dp=dp, rank_order=order), dp)
    assert isinstance(system.network, FatTree)
    topology = FatTreeTopology(system.network)
    home = int(where * ((nodes - 1) // leaf))
    leaf_nodes = range(home * leaf, min((home + 1) * leaf, nodes))
    assert topology._leaving(plan, axis, leaf_nodes, k) == _walk(topology, plan, axis,
                                                                 leaf_nodes, k)


def _dp_route_s(dp: int) -> float:
    """CPU seconds to route dp, pp and tp on a fresh plan of GPT-3's tp 8 · pp 8 layout at
    data-parallel degree ``dp`` on openai-a100's fat-tree (its leaf's count checked
    against the walk)."""
    nodes = 8 * dp
    scenario = load_scenario("openai-a100", [
        f"nodes={nodes}", f"system.nodes={max(nodes, 3125)}", "model=gpt3-175b",
        "parallelism.tp=8", "parallelism.pp=8", f"parallelism.dp={dp}",
        "parallelism.schedule=1f1b", "parallelism.virtual_stages=1",
        f"training.global_batch={dp * 96}"])
    plan = Plan.from_scenario(scenario)
    assert isinstance(scenario.system.network, FatTree)
    topology = FatTreeTopology(scenario.system.network)
    placements = {axis: plan.placement(axis) for axis in ("dp", "pp", "tp")}
    start = time.process_time()
    for placement in placements.values():
        topology.route(plan, placement)
    elapsed = time.process_time() - start
    leaf = scenario.system.network.nodes_per_leaf
    first = range(0, leaf)
    k = placements["dp"].members_per_node
    assert topology._leaving(plan, "dp", first, k) == _walk(topology, plan, "dp", first, k)
    return elapsed


def test_routing_does_not_grow_with_the_data_parallel_degree():
    """The routes of a 1,024-GPU and a 99,840-GPU layout take about the same CPU time
    (the walk over every group took ~20× longer at the larger), and count what the walk
    counts."""
    small = min(_dp_route_s(16) for _ in range(3))
    large = min(_dp_route_s(1560) for _ in range(3))
    assert large < 3 * small + 0.002
