"""Network topologies behind one interface (design §13): the route of a group's traffic.

:func:`topology_of` picks the implementation by the network's ``kind``:
:class:`FatTreeTopology` (leaf, spine, rails), :class:`DragonflyTopology` (groups, global
links, routing) and :class:`TorusTopology` (the job's sub-torus and its dimensions). Each
answers :meth:`Topology.route` with a :class:`Route`: level, hops, the share of line rate
left when every group of the axis runs at once, and on a torus the dimensions a group's
rings run along. :func:`placement_rows` describes a plan's groups for ``llmsim run``, and
:func:`job_shape_line` a torus job's shape.
"""

from __future__ import annotations

from collections.abc import Callable

from llmsim.costs.topology.base import Route, Topology, TorusDimension, shared_share
from llmsim.costs.topology.dragonfly import DragonflyTopology
from llmsim.costs.topology.fat_tree import FatTreeTopology
from llmsim.costs.topology.torus import TorusTopology
from llmsim.costs.topology.torus_shape import job_shape
from llmsim.plan import Plan
from llmsim.specs import System

__all__ = [
    "DragonflyTopology",
    "FatTreeTopology",
    "Route",
    "Topology",
    "TorusDimension",
    "TorusTopology",
    "job_shape",
    "job_shape_line",
    "placement_rows",
    "shared_share",
    "topology_of",
]

_KINDS: dict[str, Callable[[System, int], Topology]] = {
    "fat_tree": lambda system, nodes: FatTreeTopology(system.network),  # type: ignore[arg-type]
    "dragonfly": lambda system, nodes: DragonflyTopology(system.network,  # type: ignore[arg-type]
                                                         system.nodes),
    "torus": lambda system, nodes: TorusTopology(system.network, nodes),  # type: ignore[arg-type]
}
"""Topology implementation by ``network.kind``."""


def topology_of(system: System, nodes: int) -> Topology:
    """The topology of ``system``'s network for a job of ``nodes`` nodes."""
    return _KINDS[system.network.kind](system, nodes)


def job_shape_line(plan: Plan) -> str | None:
    """The job's torus and who chose it (the user's ``network.job_shape`` or llmsim),
    for ``llmsim run``; None on a network that is not a torus."""
    topology = topology_of(plan.system, plan.nodes)
    return topology.describe() if isinstance(topology, TorusTopology) else None


def placement_rows(plan: Plan) -> list[dict[str, object]]:
    """One row per parallel axis of ``plan`` with more than one rank: its degree, the ranks
    of its worst group, how that group sits (members per node, nodes), the level and hops
    of its ring's steps and the route in words."""
    topology = topology_of(plan.system, plan.nodes)
    rows = []
    for axis, placement in plan.placements.items():
        if placement.size < 2:
            continue
        if placement.crosses_nodes:
            route = topology.route(plan, placement)
            level, hops, detail = route.level, route.hops, route.detail
        else:
            level, hops = placement.level, 0
            detail = f"all {placement.size} ranks on one node"
        members = plan.members(axis, placement.first_rank)
        shown = ", ".join(str(r) for r in members[:3])
        ranks = shown + (f", …, {members[-1]}" if len(members) > 3 else "")
        rows.append({"axis": axis, "degree": placement.size, "ranks": ranks,
                     "per_node": placement.members_per_node,
                     "nodes": placement.nodes_spanned, "level": level, "hops": hops,
                     "route": detail})
    return rows
