"""A job scattered over a dragonfly's groups (``network.job_placement: scattered``).

Node i of the job lies in group i mod G (G: the machine's groups, or the job's nodes if
fewer), so every ring step between nodes leaves its group, and the job holds only its
own nodes' part of each group's global links (:mod:`llmsim.costs.topology.dragonfly`).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from test_cli import run_cli
from test_topology import costs, system

from llmsim.costs.topology import dragonfly, topology_of
from llmsim.costs.topology.base import groups_touching, is_chain, rank_steps


def network(placement: str, taper: float = 2.0) -> dict[str, Any]:
    return {"kind": "dragonfly", "nodes_per_group": 4, "global_taper": taper,
            "hop_latency_us": 0.0, "efficiency": 1.0, "job_placement": placement}


def dp_bandwidth(placement: str, machine: int, job: int) -> float:
    model = costs(system(network(placement), machine, nics=1, nic_gbit=100), job)
    path = model.collectives.path("dp")
    assert path is not None
    return path.inter_bytes_per_s


def test_a_scattered_ring_leaves_its_group_at_every_step() -> None:
    """8 one-NIC nodes in 2 groups of 4, global links of half a group's injection. Packed,
    the DP ring of 8 leaves group 0 once (3→4): one flow on 2 NICs' worth of global links,
    full rate. Scattered (nodes 0, 2, 4, 6 in group 0), every step leaves: 4 flows on
    them, half the rate each."""
    nic = 100e9 / 8
    assert dp_bandwidth("packed", 8, 8) == pytest.approx(nic)
    assert dp_bandwidth("scattered", 8, 8) == pytest.approx(nic / 2)


def test_a_small_scattered_job_holds_its_nodes_part_of_the_global_links() -> None:
    """The same 8-node job on a machine of 16 nodes (4 groups): G = 4, group 0 holds the
    job's nodes 0 and 4, half the group, so half its global links, 4·NIC/2·1/2 = one NIC's
    worth, for the 2 flows that leave it: half the rate each."""
    nic = 100e9 / 8
    assert dp_bandwidth("scattered", 16, 8) == pytest.approx(nic / 2)


def test_groups_inside_a_node_do_not_care() -> None:
    sysm = system(network("scattered"), 8, devices=4, nics=1, nic_gbit=100)
    packed = system(network("packed"), 8, devices=4, nics=1, nic_gbit=100)
    assert (costs(sysm, 8, tp=4).collectives.path("tp").inter_bytes_per_s
            == costs(packed, 8, tp=4).collectives.path("tp").inter_bytes_per_s)


def test_the_route_says_the_job_is_scattered() -> None:
    model = costs(system(network("scattered"), 16, nics=1, nic_gbit=100), 8)
    route = topology_of(model.plan.system, 8).route(model.plan, model.plan.placements["dp"])
    assert "the job scattered over 4 groups" in route.detail
    assert route.level == "dragonfly global links" and route.hops == 3


def _walk(plan: Any, axis: str, home_nodes: range, home: int, groups: int) -> Counter[int]:
    """The reference count, group by group and step by step, with scattered groups."""
    to_group: Counter[int] = Counter()
    for group in groups_touching(plan, axis, home_nodes):
        for a, b in rank_steps(plan, group, is_chain(axis)):
            node_a, node_b = plan.location(a)[0], plan.location(b)[0]
            if node_a in home_nodes and node_b % groups != home:
                to_group[node_b % groups] += 1
    return to_group


@settings(max_examples=30, deadline=None)
@given(tp=st.sampled_from([1, 2, 4]), pp=st.sampled_from([1, 2, 3]),
       nodes=st.sampled_from([6, 8, 12, 24]), machine=st.sampled_from([8, 16, 64]),
       axis=st.sampled_from(["tp", "dp", "pp"]), home=st.integers(0, 15))
def test_the_scattered_count_is_the_walk(tp: int, pp: int, nodes: int, machine: int,
                                         axis: str, home: int) -> None:
    devices = 2
    if (nodes * devices) % (tp * pp) or machine < nodes:
        return
    model = costs(system(network("scattered"), machine, devices=devices), nodes, tp=tp, pp=pp)
    topology = topology_of(model.plan.system, nodes)
    assert isinstance(topology, dragonfly.DragonflyTopology)
    groups = topology.groups(nodes)
    home %= groups
    home_nodes = topology.nodes_in(home, nodes)
    fast = dragonfly._steps_leaving(model.plan, axis, home_nodes, home, 4,
                                    lambda n: topology.group_of(n, nodes))
    assert fast == _walk(model.plan, axis, home_nodes, home, groups)
    assert list(home_nodes) == [n for n in range(nodes)
                                if int(topology.group_of(np.asarray([n]), nodes)[0]) == home]


def test_llmsim_run_shows_a_scattered_job(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["run", "frontier.yaml", "--set",
                            "system.network.job_placement=scattered"], capsys)
    assert code == 0
    assert "the job scattered over 74 groups" in " ".join(out.split())


def test_a_bad_placement_is_refused_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(["run", "frontier.yaml", "--set",
                              "system.network.job_placement=spread"], capsys)
    assert code == 2
    assert "job_placement" in err + out
    assert "Traceback" not in err


def test_consecutive_nodes_slow_down_a_stride_of_the_groups_does_not() -> None:
    """16 nodes, PP = 2 (stages 8 nodes apart), groups of 4, the reduction not
    overlapped. The DP rings of 8 consecutive nodes leave their group once packed (full
    rate) and at every step scattered (half); the pipeline's step of 8 nodes is a multiple
    of G = 4, so scattered it stays inside a group (packed it crosses to another): the
    round-robin stand-in for a scheduler's scatter keeps strides of a multiple of G
    together."""
    def path(placement: str, axis: str):
        return costs(system(network(placement), 16, nics=1, nic_gbit=100), 16, pp=2,
                     overlap_dp_comm=False).collectives.path(axis)
    assert path("scattered", "dp").inter_bytes_per_s < path("packed", "dp").inter_bytes_per_s
    assert path("scattered", "pp").inter_bytes_per_s == 100e9 / 8
    assert path("packed", "pp").inter_bytes_per_s < 100e9 / 8


def test_yaml_round_trip_of_the_field() -> None:
    spec = system(network("scattered"), 8)
    assert yaml.safe_load(yaml.safe_dump(spec.network.model_dump()))["job_placement"] == (
        "scattered")


def test_the_plan_counts_the_groups_a_scattered_job_spans() -> None:
    """The plan's group counts follow the placement the route uses. 16 nodes of 1 device,
    groups of 4, PP = 2: each DP group is 8 consecutive nodes, 2 groups packed and all
    G = 4 scattered; the pipeline's pair 8 nodes apart is 2 groups packed, 1 scattered."""
    def placement(how: str, axis: str) -> Any:
        return costs(system(network(how), 16, nics=1, nic_gbit=100), 16,
                     pp=2).plan.placements[axis]
    assert placement("packed", "dp").domains_spanned == 2
    assert placement("scattered", "dp").domains_spanned == 4
    assert placement("packed", "pp").domains_spanned == 2
    assert placement("scattered", "pp").domains_spanned == 1
    assert placement("scattered", "pp").level == "dragonfly group"


@settings(max_examples=60, deadline=None)
@given(devices=st.sampled_from([1, 2, 4]), job=st.integers(1, 24), extra=st.integers(0, 40),
       per_group=st.integers(1, 6), tp=st.sampled_from([1, 2, 4]), pp=st.sampled_from([1, 2, 3]),
       how=st.sampled_from(["packed", "scattered"]))
def test_the_plans_group_count_is_the_routes(devices: int, job: int, extra: int,
                                              per_group: int, tp: int, pp: int,
                                              how: str) -> None:
    """Every axis's worst group spans as many dragonfly groups, by the plan's count (in
    closed form for evenly spaced ranks), as its members' nodes lie in by the topology's
    ``group_of``, packed or scattered."""
    ranks = job * devices
    if ranks % (tp * pp):
        return
    net = {**network(how), "nodes_per_group": per_group}
    model = costs(system(net, job + extra, devices=devices, nics=1, nic_gbit=100), job,
                  tp=tp, pp=pp)
    plan, topology = model.plan, topology_of(model.plan.system, job)
    for axis, placement in plan.placements.items():
        members = np.asarray(plan.members(axis, placement.first_rank))
        groups = len(np.unique(topology.group_of(members // devices, job)))
        assert placement.domains_spanned == groups, axis
