"""Dragonfly (Slingshot): all-to-all groups joined by global links.

A job's nodes fill dragonfly groups of ``nodes_per_group`` in order (``job_placement:
packed``), or go round the groups one node each (``scattered``: node i in group i mod G,
G the machine's groups or the job's nodes if fewer; a busy machine's scheduler handing
out free nodes wherever they are). Inside a group every switch reaches every other in
one hop (2 switch hops node to node); a step to another group takes 3 (Kim, Dally, Scott
& Abts, "Technology-Driven, Highly-Scalable Dragonfly Topology", ISCA 2008). Every group
of an axis runs at once, and the ring flows leaving the worst group's dragonfly group
share its global links:

* all of them together carry ``nodes_per_group × injection / global_taper``;
* between one pair of groups there are ``global_links_per_group_pair`` links
  (Frontier: 4, hardware.md §2.2). Minimal routing sends a flow to the next group on
  those direct links only; adaptive routing (UGAL, Slingshot's default) also sends it
  through an intermediate group, two global hops, so the rest of the global links carry
  half as much of it (Valiant routing's factor of two, Kim et al. 2008 §4).

The group keeps the lowest share any of these limits leaves it
(:func:`~llmsim.costs.topology.base.shared_share`). A scattered job shares its groups with
other jobs: it holds only its own nodes' part of a group's global links (``m /
nodes_per_group`` of both limits for its ``m`` nodes there), and since consecutive nodes
lie in different groups every ring step between nodes leaves its group. Where the
schedule runs another axis's transfers at the same time
(:func:`~llmsim.costs.topology.base.concurrent_axes`), that axis's flows leaving the
dragonfly group load the same global links: each limit is then taken over both axes'
demand, at most what the group's nodes can inject. An expert-parallel axis at once sends
all to all (:func:`~llmsim.costs.topology.base.alltoall_leaving`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

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
from llmsim.specs import Dragonfly


@dataclass(frozen=True)
class DragonflyTopology:
    """:class:`~llmsim.specs.Dragonfly` behind the topology interface."""

    network: Dragonfly
    machine_nodes: int = 0
    """Nodes of the whole machine: its groups bound how far a scattered job spreads (0:
    as many groups as the job's own nodes fill)."""

    @property
    def scattered(self) -> bool:
        """Whether the job's nodes go round the groups (``job_placement: scattered``)."""
        return self.network.job_placement == "scattered"

    def groups(self, job_nodes: int) -> int:
        """G: the dragonfly groups a scattered job of ``job_nodes`` goes round."""
        return self.network.job_groups(job_nodes, self.machine_nodes)

    def group_of(self, nodes: np.ndarray, job_nodes: int) -> np.ndarray:
        """The dragonfly group of each of the job's ``nodes``."""
        if self.scattered:
            return nodes % self.groups(job_nodes)
        return nodes // self.network.nodes_per_group

    def nodes_in(self, group: int, job_nodes: int) -> range:
        """The job's nodes in dragonfly group ``group``."""
        if self.scattered:
            return range(group, job_nodes, self.groups(job_nodes))
        size = self.network.nodes_per_group
        return range(group * size, min((group + 1) * size, job_nodes))

    def _share_of_group(self, home_nodes: range) -> float:
        """The job's part of a group's global links: all of them packed, its nodes' part of
        the group scattered."""
        if not self.scattered:
            return 1.0
        return min(1.0, len(home_nodes) / self.network.nodes_per_group)

    def route(self, plan: Plan, placement: GroupPlacement) -> Route:
        """Dragonfly group or global links, hops, and the global links' share."""
        net, node = self.network, plan.system.node
        size = net.nodes_per_group
        members = plan.members(placement.axis, placement.first_rank)
        dpn = node.devices_per_node
        home = int(self.group_of(np.asarray([members[0] // dpn]), plan.nodes)[0])
        home_nodes = self.nodes_in(home, plan.nodes)
        to_group = self._leaving(plan, placement.axis, home_nodes, home)
        spanned = len(np.unique(self.group_of(np.asarray(members) // dpn, plan.nodes)))
        where = (f"{placement.members_per_node} per node on {placement.nodes_spanned} nodes in "
                 f"{spanned} dragonfly group(s) of {size} nodes"
                 + (f", the job scattered over {self.groups(plan.nodes)} groups"
                    if self.scattered else ""))
        if not to_group:
            return Route("dragonfly group", 2, 1.0, detail=where)
        k = placement.members_per_node
        part = self._share_of_group(home_nodes)
        flow_rate = node.injection_bytes_per_s * min(1.0, k / node.devices_per_node)
        global_bw = size * node.injection_bytes_per_s / net.global_taper * part
        share = shared_share(global_bw, sum(to_group.values()), flow_rate)
        if net.global_links_per_group_pair is not None:
            direct = net.global_links_per_group_pair * node.nic_gbit * 1e9 / 8 * part
            indirect = 0.0 if net.routing == "minimal" else max(0.0, global_bw - direct) / 2
            for flows in to_group.values():
                share = min(share, shared_share(direct + indirect, flows, flow_rate))
        detail = (f"{where}; {sum(to_group.values())} ring flows leave the group "
                  f"({net.routing} routing): {100 * share:.0f} % of line rate")
        both, crossed = self._with_concurrent(plan, placement.axis, home_nodes, home,
                                              to_group, flow_rate)
        if both < share:
            share = both
            detail += f"; with the {'/'.join(crossed)} flows that run at once: {100 * share:.0f} %"
        return Route("dragonfly global links", 3, share, detail=detail)

    def _leaving(self, plan: Plan, axis: str, home_nodes: range, home: int) -> Counter[int]:
        """Ring (or chain) steps of every group of ``axis`` that leave dragonfly group
        ``home`` (its ``home_nodes``), counted by the group they go to; counted once per
        plan (:attr:`Plan.memo`; a copy returned)."""
        key = ("dragonfly._leaving", id(self.network), axis, home_nodes, home)
        known = plan.memo.get(key)
        if known is not None and known[0] is self.network:
            return Counter(known[1])  # type: ignore[arg-type]
        to_group = _steps_leaving(plan, axis, home_nodes, home, self.network.nodes_per_group,
                                  lambda nodes: self.group_of(nodes, plan.nodes))
        plan.memo[key] = (self.network, Counter(to_group))
        return to_group

    def _with_concurrent(self, plan: Plan, axis: str, home_nodes: range, home: int,
                         to_group: Counter[int], flow_rate: float) -> tuple[float, list[str]]:
        """The share the global links leave ``axis``'s flows (``to_group``, each at
        ``flow_rate``) when the axes that run at once send theirs too (1.0 when none
        leaves the group), and those axes."""
        net, node = self.network, plan.system.node
        demand_to: Counter[int] = Counter({g: f * flow_rate for g, f in to_group.items()})
        crossed = []
        for other in concurrent_axes(plan.parallelism, axis):
            if plan.degrees[other] < 2:
                continue
            leaving = (alltoall_leaving(plan, other, home_nodes,
                                        lambda n: int(self.group_of(np.asarray(n), plan.nodes)))
                       if is_alltoall(other) else self._leaving(plan, other, home_nodes, home))
            if leaving:
                crossed.append(other)
                k = plan.placement(other).members_per_node
                rate = node.injection_bytes_per_s * min(1.0, k / node.devices_per_node)
                demand_to.update({g: f * rate for g, f in leaving.items()})
        if not crossed:
            return 1.0, []
        injection = len(home_nodes) * node.injection_bytes_per_s
        part = self._share_of_group(home_nodes)
        global_bw = net.nodes_per_group * node.injection_bytes_per_s / net.global_taper * part
        share = shared_share(global_bw, 1, min(sum(demand_to.values()), injection))
        if net.global_links_per_group_pair is not None:
            direct = net.global_links_per_group_pair * node.nic_gbit * 1e9 / 8 * part
            indirect = 0.0 if net.routing == "minimal" else max(0.0, global_bw - direct) / 2
            for dest in to_group:
                share = min(share, shared_share(direct + indirect, 1,
                                                min(demand_to[dest], injection)))
        return share, crossed


MAX_CELLS = 1 << 20
"""Most (group, member) cells :func:`_steps_leaving` holds at once (8 MiB of int64)."""


def _steps_leaving(plan: Plan, axis: str, home_nodes: range, home: int,
                   nodes_per_group: int,
                   group_of: Callable[[np.ndarray], np.ndarray] | None = None) -> Counter[int]:
    """The ring (or chain) steps between nodes of every group of ``axis`` with a member on
    ``home_nodes`` (dragonfly group ``home``) that go from one of those nodes to another
    dragonfly group, counted by that group, in the order a walk group by group
    (:func:`~llmsim.costs.topology.base.groups_touching`) and step by step
    (:func:`~llmsim.costs.topology.base.rank_steps`) meets them.

    The same count as that walk, on arrays: each group is its first rank plus the offsets
    of the first group's members (the members of every group of an axis are one set of
    offsets from its first rank, :meth:`Plan.members`); a step is a change of node from
    one member to the next, and for a ring the step from the last member's node back to
    the first's (members ascend, so a group's nodes never come back to its first node,
    the case :func:`~llmsim.costs.topology.base.ring_edges` also handles). About six
    times faster than the walk on Frontier's 65,536 GCDs, whose data-parallel groups span
    the machine (``tests/test_topology_dragonfly.py`` checks the two agree). A node's
    dragonfly group is ``group_of`` it (default: packed, ``node // nodes_per_group``)."""
    if group_of is None:
        def group_of(nodes: np.ndarray) -> np.ndarray:
            return nodes // nodes_per_group
    dpn = plan.system.node.devices_per_node
    on_home = np.asarray(home_nodes, dtype=np.int64)
    ranks = (on_home[:, None] * dpn + np.arange(dpn, dtype=np.int64)[None, :]).ravel()
    # each rank's group's first rank, a column at a time (group_first's arithmetic on arrays)
    firsts = list(dict.fromkeys(plan.group_first(axis, ranks[ranks < plan.devices]).tolist()))
    if not firsts:
        return Counter()
    offsets = np.asarray(plan.members(axis, firsts[0]), dtype=np.int64) - firsts[0]
    starts = np.asarray(firsts, dtype=np.int64)
    chain = is_chain(axis)
    found = []
    rows = max(1, MAX_CELLS // len(offsets))
    for i in range(0, len(starts), rows):
        nodes = (starts[i:i + rows, None] + offsets[None, :]) // dpn
        back = nodes[:, -1:] != nodes[:, :1]  # the step from the last node to the first
        src = np.concatenate([nodes[:, :-1], nodes[:, -1:]], axis=1)
        dst = np.concatenate([nodes[:, 1:], nodes[:, :1]], axis=1)
        step = np.concatenate([nodes[:, 1:] != nodes[:, :-1], back], axis=1)
        if chain:
            step[:, -1] = False
        dst_group = group_of(dst)
        leaving = step & (group_of(src) == home) & (dst_group != home)
        found.append(dst_group[leaving])  # row-major: the walk's order
    return Counter(np.concatenate(found).tolist())
