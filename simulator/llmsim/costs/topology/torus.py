"""Torus (Tofu-D): the job's sub-torus, the rings a group builds along its dimensions.

**The job's shape.** A job of N nodes gets a box of the machine's torus: the dimensions
fill from the last listed to the first (on Fugaku ``[X, Y, Z, a, b, c]``: the 2·3·2 Tofu
unit first, then Z, Y, X), each taking the largest divisor of the nodes still to place
that fits it (:mod:`.torus_shape`); rank r sits on node r // devices_per_node, whose
coordinates count the last-listed dimension fastest. A dimension of the box closes into a
ring only where the job holds all of it and it has 3 or more nodes (a box of part of a
dimension is a mesh line: Fujitsu's job shapes, Ajima et al., "The Tofu Interconnect D",
IEEE Cluster 2018). Where the user gives the shape (``network.job_shape``, 1 to 3
extents as Fugaku's ``pjsub -L node=...:torus`` asks for it) the job's torus is that
shape instead: the job manager lays each extent as a ring of physically neighbouring
nodes (Tofu's virtual torus), so llmsim prices the job on a torus of those extents, each
closing into a ring from 3 nodes on (:attr:`TorusTopology.dims`).

**A group's rings.** A group whose member nodes form a box of the job's torus spans the
dimensions along which they vary (:class:`~llmsim.costs.topology.base.TorusDimension`):
a ring along one dimension drives 2 links per direction where it closes, 1 on a line.
The collective model runs either one ring through all members (a Hamiltonian cycle of
the box, 1-hop steps: 2 links) or one ring per dimension, concurrently over slices of
the data, which drives the links of every dimension at once up to the node's injection
interfaces (Tofu-D: 6 TNIs) — ``torus_s`` in :mod:`llmsim.costs.collectives`,
:mod:`llmsim.costs.multidim`.

**Contention.** Groups of an axis that form boxes use disjoint lines of the torus. A group
whose members do not form a box (a stride that cuts across dimensions) sends each step
over several hops by dimension-order routing; when every group of the axis does the same
shift, each link carries on average as many flows as a step has hops, so the group keeps
1/(mean hops of its steps) of its rate, and a step's latency pays the longest one.

**Contention between axes.** Where the schedule runs two axes' transfers at once
(:func:`~llmsim.costs.topology.base.concurrent_axes`: the overlapped gradient reduction
beside the backward's TP collectives and pipeline sends), their ring flows can cross the
same links. The first steps of the worst group (:data:`CROSS_AXIS_STEPS`), and the steps
of every group, of its own axis or a concurrent one, that start or end on the nodes
those steps pass, are routed by dimension order and counted on those first steps' links
(:mod:`~llmsim.costs.topology.torus_links`); on each directed link the group's axis keeps
its own flows' part of all the flows (max-min fair sharing of equal flows), and the group
keeps the least of those parts over its links, on top of its own axis's sharing. Groups
whose boxes lie along different dimensions use different links and do not slow each
other. An expert-parallel axis at once sends all to all: each of its members near those steps
sends ``1/(n − 1)`` of its rate to every other member, routed the same way.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from itertools import pairwise

import numpy as np

from llmsim.costs.topology.base import (
    Route,
    TorusDimension,
    concurrent_axes,
    groups_touching,
    is_alltoall,
    is_chain,
    shared_share,
)
from llmsim.costs.topology.torus_links import Link, LinkLoads, ring_steps
from llmsim.costs.topology.torus_shape import job_box
from llmsim.plan import GroupPlacement, Plan
from llmsim.specs import Torus

TOFU_NAMES = ("X", "Y", "Z", "a", "b", "c")
"""Tofu-D's dimension labels, in the order the catalog lists them."""

CROSS_AXIS_STEPS = 16
"""Ring steps of the worst group whose links the contention between axes examines: the
groups of an axis repeat along the torus, so the first steps' links stand for the rest,
and the work stays bounded for groups of thousands of nodes (a layout search prices
hundreds of layouts)."""


@dataclass(frozen=True)
class TorusTopology:
    """:class:`~llmsim.specs.Torus` behind the topology interface."""

    network: Torus
    nodes: int
    """Nodes of the job."""

    @property
    def shape(self) -> list[int]:
        """The job's extent along each dimension (:mod:`.torus_shape`)."""
        return list(self._box)

    @property
    def given(self) -> bool:
        """Whether the user gave the job's shape (``network.job_shape``)."""
        return self.network.job_shape is not None

    @functools.cached_property
    def dims(self) -> tuple[int, ...]:
        """The torus the job lies on: the user's ``job_shape`` (a virtual torus whose
        every extent closes into a ring), else the machine's ``dims``."""
        return tuple(self.network.job_dims)

    @functools.cached_property
    def _box(self) -> tuple[int, ...]:
        """:attr:`shape` as a tuple, worked out once per topology."""
        if self.given and math.prod(self.dims) < self.nodes:
            raise ValueError(
                f"network.job_shape {list(self.dims)} holds {math.prod(self.dims)} nodes, "
                f"fewer than the job's {self.nodes}; give a shape of at least {self.nodes} "
                "nodes")
        return job_box(self.dims, self.nodes)

    def describe(self) -> str:
        """The job's torus in words, and who chose it."""
        shape = "×".join(str(s) for s in self._box)
        if self.given:
            return f"the job's {len(self._box)}-D torus {shape} as given (network.job_shape)"
        return (f"the job's {shape} box of the machine's "
                f"{'×'.join(str(d) for d in self.network.dims)} torus, chosen by llmsim "
                "(give network.job_shape to set it)")

    @functools.cached_property
    def _closes(self) -> np.ndarray:
        """Per dimension, whether the job's box closes it into a ring (the job holds all
        of it and it has 3 or more nodes)."""
        return np.array([extent == full and full >= 3
                         for extent, full in zip(self._box, self.dims, strict=True)])

    def names(self) -> list[str]:
        """A label per dimension: Tofu-D's names for a 6-D torus, the job manager's X, Y,
        Z for a shape the user gave, else the index."""
        dims = self.dims
        if self.given:
            return list(TOFU_NAMES[:len(dims)])
        return list(TOFU_NAMES) if len(dims) == 6 else [str(i) for i in range(len(dims))]

    def coords(self, node: int) -> list[int]:
        """Coordinates of a node of the job in its box (last dimension fastest)."""
        out = []
        for extent in reversed(self._box):
            node, c = divmod(node, extent)
            out.append(c)
        return out[::-1]

    def _coords_of(self, nodes: np.ndarray) -> np.ndarray:
        """:meth:`coords` of each of ``nodes`` (one row per node)."""
        return np.stack(np.unravel_index(nodes, self._box), axis=1)

    def distance(self, a: int, b: int) -> int:
        """Hops between two nodes of the job by dimension-order routing (wrap-around
        links only in the dimensions that close)."""
        return int(self._distances(np.array([a]), np.array([b]))[0])

    def hops(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """:meth:`distance` of each pair of nodes ``a[i]``, ``b[i]`` (0 where they are one
        node)."""
        return self._distances(a, b)

    def _distances(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """:meth:`distance` of each pair of nodes ``a[i]``, ``b[i]``."""
        step = np.abs(self._coords_of(a) - self._coords_of(b))
        wrapped = np.minimum(step, np.array(self._box) - step)
        return np.where(self._closes, wrapped, step).sum(axis=1)

    def dimensions_of(self, nodes: list[int]) -> tuple[TorusDimension, ...] | None:
        """The dimensions a set of nodes spans when it is a box of the job's torus
        (consecutive coordinates along each), innermost first; None when it is not."""
        return self._dimensions_of(np.unique(np.asarray(nodes)))

    def _dimensions_of(self, distinct: np.ndarray) -> tuple[TorusDimension, ...] | None:
        """:meth:`dimensions_of` of the sorted distinct nodes ``distinct``."""
        coords = self._coords_of(distinct)
        out, count = [], 1
        names = self.names()
        for i in reversed(range(len(self._box))):
            values = np.flatnonzero(np.bincount(coords[:, i], minlength=self._box[i]))
            if len(values) > 1:
                if values[-1] - values[0] != len(values) - 1:
                    return None
                wraps = len(values) == self._box[i] == self.dims[i] >= 3
                out.append(TorusDimension(names[i], len(values), wraps))
            count *= len(values)
        return tuple(out) if count == len(distinct) else None

    def route(self, plan: Plan, placement: GroupPlacement) -> Route:
        """The worst route among (up to 64 of) the axis's groups: the one that keeps the
        least of its line rate, then the longest steps. Groups of one axis can differ on a
        torus: a degree that does not divide the Tofu unit cuts some groups across it."""
        firsts = plan.group_first_ranks(placement.axis)
        # A group is the first's translated by its first rank (Plan.members: the ranks
        # that differ from it only along the group's axes).
        offsets = np.asarray(plan.members(placement.axis, 0))
        dpn = plan.system.node.devices_per_node
        routes = [self._route_of((first + offsets) // dpn, placement.axis)
                  for first in firsts]
        worst = min(range(len(routes)), key=lambda i: (
            routes[i].bandwidth_fraction * routes[i].ring_links, -routes[i].hops,
            len(routes[i].dims)))
        route = routes[worst]
        concurrent = tuple(a for a in concurrent_axes(plan.parallelism, placement.axis)
                           if plan.degrees[a] > 1)
        others = tuple(a for a in concurrent if not self._apart(plan, route, a))
        share, crossed = (self.cross_axis_share(plan, placement.axis, firsts[worst], others)
                          if others else (1.0, []))
        injected, driving = self.injection_share(plan, placement.axis, route, concurrent)
        if min(share, injected) >= 1.0:
            return route
        detail = route.detail
        if share < 1.0:
            kind = "transfers" if any(is_alltoall(a) for a in crossed) else "rings"
            detail += (f"; {'/'.join(crossed)} {kind} run at once on its links: "
                       f"{100 * share:.0f} % of them")
        if injected < share:
            detail += (f"; with the {'/'.join(driving)} transfers at once the node's "
                       f"{plan.system.node.nics_per_node} network interfaces leave it "
                       f"{100 * injected:.0f} %")
        return replace(route, bandwidth_fraction=route.bandwidth_fraction
                       * min(share, injected), detail=detail)

    def driven_links(self, axis: str, route: Route) -> int:
        """Links a node drives per direction for ``axis``'s group on ``route``: one ring
        per dimension of a box at once (each dimension's :attr:`TorusDimension.links`),
        else its ring's links; one for the pipeline's chain (a stage sends to the next);
        none inside a node."""
        if route.hops == 0:
            return 0
        if is_chain(axis):
            return 1
        return sum(d.links for d in route.dims) if route.dims else route.ring_links

    def injection_share(self, plan: Plan, axis: str, route: Route,
                        concurrent: tuple[str, ...]) -> tuple[float, list[str]]:
        """The share of its links' rate the group of ``axis`` on ``route`` keeps when the
        ``concurrent`` axes' transfers leave the same nodes at once, and those axes.

        A node injects through its network interfaces (Tofu-D: 6 TNIs of 6.8 GB/s each,
        Ajima et al., "The Tofu Interconnect D", IEEE Cluster 2018), whichever links the
        data then take: the axes' demands (:meth:`driven_links` of each axis's group, each
        at most the interfaces, times a link's rate) share the node's injection
        (``nics_per_node × nic_gbit``) by max-min fairness of equal link flows, each keeping
        ``min(1, injection / total demand)`` (:func:`~llmsim.costs.topology.base.shared_share`).
        Axes along different dimensions use different links but the same interfaces, so
        this holds where the links' sharing does not.
        """
        node, link = plan.system.node, self.network.link_gbps_per_direction * 1e9
        mine = min(self.driven_links(axis, route), node.nics_per_node)
        if mine == 0:
            return 1.0, []
        demand, driving = mine * link, []
        for other in concurrent:
            theirs = self.group_route(plan, other, plan.placement(other).first_rank)
            links = min(self.driven_links(other, theirs), node.nics_per_node)
            if links:
                demand += links * link
                driving.append(other)
        return shared_share(node.injection_bytes_per_s, 1, demand), driving

    def _apart(self, plan: Plan, route: Route, other: str) -> bool:
        """Whether ``route``, a box, and (up to 8 of) the groups of ``other``, boxes too,
        lie along different dimensions: their rings then use different links."""
        if not route.dims:
            return False
        mine = {d.name for d in route.dims}
        for first in plan.group_first_ranks(other, limit=8):
            theirs = self.group_route(plan, other, first)
            if theirs.hops and (not theirs.dims or mine & {d.name for d in theirs.dims}):
                return False
        return True

    def node_at(self, coords: list[int]) -> int:
        """The node of the job at ``coords`` (the inverse of :meth:`coords`)."""
        node = 0
        for c, extent in zip(coords, self._box, strict=True):
            node = node * extent + c
        return node

    def links_between(self, a: int, b: int) -> list[tuple[int, int]]:
        """The directed links (node, next node) a message from node ``a`` to node ``b``
        crosses by dimension-order routing, first dimension first, the short way round
        where a dimension closes into a ring (each dimension's run of hops at once, so a
        route of many hops, as on a long 1-D torus, costs one array per dimension)."""
        here, there = self.coords(a), self.coords(b)
        node = self.node_at(here)
        links: list[tuple[int, int]] = []
        stride = 1
        strides = []
        for extent in reversed(self._box):
            strides.append(stride)
            stride *= extent
        for i, (extent, full, step_size) in enumerate(zip(
                self._box, self.dims, reversed(strides), strict=True)):
            if here[i] == there[i]:
                continue
            if extent == full and full >= 3:  # a ring: the short way round
                forward = (there[i] - here[i]) % extent
                step, hops = (1, forward) if forward <= extent - forward else (-1, extent - forward)
            else:
                step, hops = (1 if there[i] > here[i] else -1), abs(there[i] - here[i])
            coords = (here[i] + step * np.arange(hops + 1)) % extent
            nodes = (node + (coords - here[i]) * step_size).tolist()
            links += pairwise(nodes)
            node = nodes[-1]
        return links

    def _flows(self, plan: Plan, axis: str, near: list[int], used: list[Link]) -> list[float]:
        """Ring (or chain) flows of the groups of ``axis`` on each of the ``used`` links,
        from the steps that start or end on one of the ``near`` nodes."""
        dpn = plan.system.node.devices_per_node
        close = np.asarray(near)
        loads = LinkLoads(self._box, self._closes.tolist(), used, self.coords)
        for group in groups_touching(plan, axis, near):
            a, b = ring_steps(np.asarray(group) // dpn, closed=not is_chain(axis))
            for i in np.flatnonzero(np.isin(a, close) | np.isin(b, close)):
                loads.add(int(a[i]), int(b[i]))
        return [float(n) for n in loads.loads()]

    def _alltoall_flows(self, plan: Plan, axis: str, near: list[int],
                        used: list[Link]) -> list[float]:
        """All-to-all flows of the groups of ``axis`` on each of the ``used`` links, from
        the transfers that start or end on one of the ``near`` nodes (as :meth:`_flows`):
        each member sends ``1/(n − 1)`` of its rate to every other member, routed by
        dimension order (the groups of an axis are of one size)."""
        dpn = plan.system.node.devices_per_node
        close = set(near)
        loads = LinkLoads(self._box, self._closes.tolist(), used, self.coords)
        weight = 0.0
        for group in groups_touching(plan, axis, near):
            weight = 1 / (len(group) - 1) if len(group) > 1 else 0.0
            nodes = [r // dpn for r in group]
            for a in nodes:
                for b in nodes:
                    if b != a and (a in close or b in close):
                        loads.add(a, b)
        return [n * weight for n in loads.loads()]

    def cross_axis_share(self, plan: Plan, axis: str, first_rank: int,
                         others: tuple[str, ...]) -> tuple[float, list[str]]:
        """The part of its links the group of ``axis`` holding ``first_rank`` keeps when
        the ``others`` axes' rings run at once: over its links, the least of its axis's
        flows over all flows; and the other axes that cross them. The flows are counted
        on those links alone (:class:`~llmsim.costs.topology.torus_links.LinkLoads`)."""
        dpn = plan.system.node.devices_per_node
        nodes = np.asarray(plan.members(axis, first_rank)) // dpn
        firsts, nexts = ring_steps(nodes, closed=not is_chain(axis))
        used: set[Link] = set()
        for a, b in zip(firsts[:CROSS_AXIS_STEPS].tolist(), nexts[:CROSS_AXIS_STEPS].tolist(),
                        strict=True):
            used.update(self.links_between(a, b))
        if not used:
            return 1.0, []
        links = sorted(used)
        near = sorted({n for link in links for n in link})
        own = self._flows(plan, axis, near, links)
        crossed: list[str] = []
        foreign = [0.0] * len(links)
        for other in others:
            load = (self._alltoall_flows(plan, other, near, links) if is_alltoall(other)
                    else self._flows(plan, other, near, links))
            if any(load):
                crossed.append(other)
                foreign = [f + x for f, x in zip(foreign, load, strict=True)]
        share = min([1.0] + [o / (o + f) for o, f in zip(own, foreign, strict=True)])
        return share, crossed

    def group_route(self, plan: Plan, axis: str, first_rank: int) -> Route:
        """The group of ``axis`` holding ``first_rank``: its dimensions, its ring's links
        and hops, and its share of them."""
        dpn = plan.system.node.devices_per_node
        return self._route_of(np.asarray(plan.members(axis, first_rank)) // dpn, axis)

    def _route_of(self, nodes: np.ndarray, axis: str) -> Route:
        """:meth:`group_route` of the group of ``axis`` whose members sit on ``nodes``."""
        a, b = ring_steps(nodes, closed=not is_chain(axis))
        if not len(a):  # a group inside one node: no torus link
            return Route("one node", 0, 1.0, ring_links=2, detail="all on one node")
        ascending = bool(np.all(nodes[1:] >= nodes[:-1]))
        dims = self._dimensions_of(
            nodes[np.concatenate(([True], nodes[1:] != nodes[:-1]))] if ascending
            else np.unique(nodes))
        shape = "×".join(str(s) for s in self._box)
        if dims is not None:
            links = 2 if len(dims) > 1 or dims[0].wraps else 1
            hops = max(d.hops for d in dims) if len(dims) == 1 else 1
            along = " × ".join(f"{d.name}:{d.size}{' ring' if d.wraps else ' line'}"
                               for d in dims)
            detail = (f"box {along} of the job's {shape} torus; one ring through it takes "
                      f"{hops}-hop steps on {links} link(s) per direction")
            return Route("torus links", hops, 1.0, ring_links=links, dims=dims, detail=detail)
        steps = self._distances(a, b)
        hops, mean = int(steps.max()), int(steps.sum()) / len(steps)
        detail = (f"not a box of the job's {shape} torus: ring steps of {mean:.1f} hops on "
                  f"average (up to {hops}), each link shared by as many flows")
        return Route("torus links", hops, 1.0 / mean, ring_links=1, detail=detail)
