"""Fat-tree: full bisection under a leaf switch, an oversubscribed spine above it.

A leaf holds ``nodes_per_leaf`` nodes (on a rail-optimised fabric, NIC i of each of those
nodes sits on rail leaf i: DGX SuperPOD reference architecture). Its uplinks carry
``nodes_per_leaf × injection / oversubscription``. Every group of an axis runs at once, so
the ring flows that leave the worst group's leaf share those uplinks: the group keeps
:func:`~llmsim.costs.topology.base.shared_share` of its rate, where each flow runs at the
group's NIC share (``injection × k / devices_per_node``). A ring leaves a leaf once per
run of its members inside it, so a group with many nodes per leaf loses little to the
taper, and a non-blocking fabric (oversubscription 1) never slows a group.

On a rail-optimised fabric a step between members on different local slots (a group with
one member per node whose stride is not a multiple of the node's devices) joins two rails,
which meet only at the spine: it crosses the spine even inside one leaf's nodes. On a
fabric that is not rail-optimised every NIC of a node sits on the node's own leaf.

Where the schedule runs another axis's transfers at the same time
(:func:`~llmsim.costs.topology.base.concurrent_axes`), that axis's ring flows leaving the
leaf load the same uplinks: the group keeps ``capacity / demand`` of its rate, the demand
of both axes together and at most what the leaf's nodes can inject (their NICs are not
modelled as shared between the axes), so a non-blocking fabric still slows no group. An
expert-parallel axis at once sends all to all: its traffic leaving the leaf is each of its
members' ``1/(n − 1)`` share to every member outside the leaf
(:func:`~llmsim.costs.topology.base.alltoall_leaving`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from llmsim.costs.topology.base import (
    Route,
    alltoall_leaving,
    concurrent_axes,
    is_alltoall,
    is_chain,
    shared_share,
)
from llmsim.plan import GroupPlacement, Plan
from llmsim.specs import FatTree


@dataclass(frozen=True)
class FatTreeTopology:
    """:class:`~llmsim.specs.FatTree` behind the topology interface."""

    network: FatTree

    def _crosses(self, plan: Plan, a: Any, b: Any, k: int) -> Any:
        """Whether the ring step from rank ``a`` to rank ``b`` climbs to the spine (element
        by element for numpy arrays of ranks)."""
        dpn = plan.system.node.devices_per_node
        leaf = self.network.nodes_per_leaf
        other_leaf = a // dpn // leaf != b // dpn // leaf
        if self.network.rail_optimized and k == 1:
            return other_leaf | (a % dpn != b % dpn)  # another rail
        return other_leaf

    def route(self, plan: Plan, placement: GroupPlacement) -> Route:
        """Leaf or spine, the hops, and the share the leaf's uplinks leave the group."""
        net, node = self.network, plan.system.node
        k = placement.members_per_node
        first = plan.group_first(placement.axis, placement.first_rank)
        leaf = plan.location(first)[0] // net.nodes_per_leaf
        leaf_nodes = range(leaf * net.nodes_per_leaf,
                           min((leaf + 1) * net.nodes_per_leaf, plan.nodes))
        flows = self._leaving(plan, placement.axis, leaf_nodes, k)
        if flows == 0:
            return Route("leaf switch", 1, 1.0, detail=_leaf_detail(placement, net))
        flow_rate = node.injection_bytes_per_s * min(1.0, k / node.devices_per_node)
        capacity = len(leaf_nodes) * node.injection_bytes_per_s / net.oversubscription
        share = shared_share(capacity, flows, flow_rate)
        detail = (f"{_leaf_detail(placement, net)}; {flows} ring flows leave the leaf "
                  f"on uplinks of 1/{net.oversubscription:g} its injection: "
                  f"{100 * share:.0f} % of line rate")
        demand, crossed = flows * flow_rate, []
        for other in concurrent_axes(plan.parallelism, placement.axis):
            if plan.degrees[other] < 2:
                continue
            k_other = plan.placement(other).members_per_node
            other_flows = (sum(alltoall_leaving(plan, other, leaf_nodes,
                                                lambda n: n // net.nodes_per_leaf).values())
                           if is_alltoall(other)
                           else self._leaving(plan, other, leaf_nodes, k_other))
            if other_flows:
                crossed.append(other)
                demand += other_flows * node.injection_bytes_per_s * min(
                    1.0, k_other / node.devices_per_node)
        if crossed:
            injected = min(demand, len(leaf_nodes) * node.injection_bytes_per_s)
            both = min(share, shared_share(capacity, 1, injected))
            if both < share:
                share = both
                detail += (f"; with the {'/'.join(crossed)} flows that run at once: "
                           f"{100 * share:.0f} %")
        return Route("fat-tree spine", 3, share, detail=detail)

    def _leaving(self, plan: Plan, axis: str, leaf_nodes: range, k: int) -> int:
        """Ring (or chain) steps of every group of ``axis`` that leave the leaf holding
        ``leaf_nodes`` for the spine (``k``: the axis's members per node); counted once
        per plan (:attr:`Plan.memo`).

        The count a walk over every group with a member on the leaf and every ring step
        of it makes (:func:`~llmsim.costs.topology.base.groups_touching`,
        :func:`~llmsim.costs.topology.base.rank_steps`), of the steps that start on the
        leaf: each rank on it is one group's member, and its step goes to the group's
        next member, or, closing a ring, from the group's last member to its first (none
        from a chain's last). Every group is one set of ascending offsets from its first
        rank (:meth:`Plan.members`), so the next member is found for all the leaf's ranks
        at once with numpy (:meth:`Plan.group_first`, a search in the offsets): the time
        grows with the leaf's ranks, not with the number or size of the groups
        (``tests/test_topology_fat_tree.py`` checks it against the walk)."""
        key = ("fat_tree._leaving", id(self.network), axis, leaf_nodes, k)
        known = plan.memo.get(key)
        if known is not None and known[0] is self.network:
            return known[1]  # type: ignore[return-value]
        dpn = plan.system.node.devices_per_node
        lo, hi = leaf_nodes.start * dpn, min(leaf_nodes.stop * dpn, plan.devices)
        flows = 0
        if hi > lo:
            ranks = np.arange(lo, hi, dtype=np.int64)
            first = plan.group_first(axis, ranks)
            offsets = np.asarray(plan.members(axis, int(first[0])), dtype=np.int64) - first[0]
            at = np.searchsorted(offsets, ranks - first)  # each rank's place in its group
            has_next = at + 1 < offsets.size
            b = np.where(has_next, first + offsets[np.minimum(at + 1, offsets.size - 1)],
                         first)
            steps = has_next if is_chain(axis) else np.ones(ranks.size, dtype=bool)
            leaving = steps & (ranks // dpn != b // dpn) & self._crosses(plan, ranks, b, k)
            flows = int(np.count_nonzero(leaving))
        plan.memo[key] = (self.network, flows)
        return flows

def _leaf_detail(placement: GroupPlacement, net: FatTree) -> str:
    rail = "rail-optimised" if net.rail_optimized else "not rail-optimised"
    return (f"{placement.members_per_node} per node on {placement.nodes_spanned} nodes "
            f"in {placement.domains_spanned} leaf of {net.nodes_per_leaf} nodes ({rail})"
            if placement.domains_spanned == 1 else
            f"{placement.members_per_node} per node on {placement.nodes_spanned} nodes "
            f"in {placement.domains_spanned} leaves of {net.nodes_per_leaf} nodes ({rail})")
