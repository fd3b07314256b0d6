"""The dragonfly's count of ring steps leaving a group, on arrays, equals the walk.

:func:`llmsim.costs.topology.dragonfly._steps_leaving` counts on numpy arrays what a walk
over every group touching a dragonfly group and every ring step of it counts
(:func:`~llmsim.costs.topology.base.groups_touching`,
:func:`~llmsim.costs.topology.base.rank_steps`); the count, and the order of its
destinations, must be the walk's, so that every route's share is unchanged.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmsim import load_scenario
from llmsim.costs.topology import dragonfly
from llmsim.costs.topology.base import groups_touching, is_chain, rank_steps
from llmsim.plan import Plan

ORDERS = [None, "[tp,cp,ep,dp,pp]", "[tp,cp,ep,pp,dp]", "[pp,tp,cp,ep,dp]", "[dp,pp,tp,cp,ep]"]
"""Rank orders tried (None: the scenario's default)."""


def _walk(plan: Plan, axis: str, home_nodes: range, home: int, size: int) -> Counter[int]:
    """The reference: group by group, step by step."""
    to_group: Counter[int] = Counter()
    for group in groups_touching(plan, axis, home_nodes):
        for a, b in rank_steps(plan, group, is_chain(axis)):
            node_a, node_b = plan.location(a)[0], plan.location(b)[0]
            if node_a in home_nodes and node_b // size != home:
                to_group[node_b // size] += 1
    return to_group


def _plan(system: str, tp: int, pp: int, cp: int, dp: int, order: str | None) -> Plan:
    dpn = {"frontier": 8, "lumi": 8, "aurora": 12}[system]
    devices = tp * pp * cp * dp
    sets = [f"system={system}", f"nodes={-(-devices // dpn)}", f"parallelism.tp={tp}",
            f"parallelism.pp={pp}", f"parallelism.cp={cp}", f"parallelism.dp={dp}",
            "model=gpt3-175b", "parallelism.schedule=1f1b", "parallelism.virtual_stages=1",
            f"training.global_batch={dp * pp * 2}"]
    if order:
        sets.append(f"parallelism.rank_order={order}")
    return Plan.from_scenario(load_scenario("frontier", sets))


@settings(max_examples=60, deadline=None)
@given(system=st.sampled_from(["frontier", "lumi", "aurora"]),
       tp=st.sampled_from([1, 2, 4]), pp=st.sampled_from([1, 2, 3, 8, 16]),
       cp=st.sampled_from([1, 2]), replicas=st.sampled_from([1, 3, 16, 50]),
       order=st.sampled_from(ORDERS), axis=st.sampled_from(["tp", "dp", "pp", "cp", "stage",
                                                            "cp+dp"]),
       where=st.floats(0, 1))
def test_the_count_on_arrays_is_the_walk(system, tp, pp, cp, replicas, order, axis, where):
    dpn = {"frontier": 8, "lumi": 8, "aurora": 12}[system]
    dp = replicas * dpn  # whole nodes
    plan = _plan(system, tp, pp, cp, dp, order)
    size = plan.system.network.nodes_per_group
    home = int(where * ((plan.nodes - 1) // size))
    home_nodes = range(home * size, min((home + 1) * size, plan.nodes))
    fast = dragonfly._steps_leaving(plan, axis, home_nodes, home, size)
    assert list(fast.items()) == list(_walk(plan, axis, home_nodes, home, size).items())


@pytest.mark.parametrize("axis", ["dp", "pp", "tp"])
def test_frontier_whole_machine_groups(axis, monkeypatch):
    """Frontier's scenario (65,536 GCDs, DP groups across the machine), in chunks of a
    few groups too: the count and its order are the walk's."""
    plan = Plan.from_scenario(load_scenario("frontier"))
    size = plan.system.network.nodes_per_group
    for home in (0, 31, plan.nodes // size - 1):
        home_nodes = range(home * size, (home + 1) * size)
        walk = list(_walk(plan, axis, home_nodes, home, size).items())
        assert list(dragonfly._steps_leaving(plan, axis, home_nodes, home, size).items()) == walk
        monkeypatch.setattr(dragonfly, "MAX_CELLS", 3000)
        assert list(dragonfly._steps_leaving(plan, axis, home_nodes, home, size).items()) == walk
        monkeypatch.undo()

