"""The torus's routes by numpy equal the straightforward ones, node by node.

:class:`~llmsim.costs.topology.torus.TorusTopology` works out a group's coordinates, ring
steps, hops and box with numpy over all its nodes at once (a layout search of Fugaku
routes groups of thousands of nodes, 64 groups an axis). :class:`Reference` below is the
plain Python it replaced, one node and one step at a time; every route, of every axis,
on a grid of torus shapes, job sizes and layouts, must be the same to the last bit
(hops, links, the share of the line rate, the dimensions and the words).
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_topology import system, torus

from llmsim.costs.topology.base import (
    Route,
    TorusDimension,
    groups_touching,
    is_chain,
    ring_edges,
)
from llmsim.costs.topology.torus import CROSS_AXIS_STEPS, TorusTopology
from llmsim.costs.topology.torus_links import LinkLoads
from llmsim.plan import Plan
from llmsim.specs import Parallelism


class Reference(TorusTopology):
    """The straightforward torus routes: coordinates by divmod, one ring step at a time."""

    def coords(self, node: int) -> list[int]:
        out = []
        for extent in reversed(self.shape):
            node, c = divmod(node, extent)
            out.append(c)
        return out[::-1]

    def distance(self, a: int, b: int) -> int:
        hops = 0
        for ca, cb, extent, full in zip(self.coords(a), self.coords(b), self.shape,
                                        self.network.dims, strict=True):
            step = abs(ca - cb)
            hops += min(step, extent - step) if extent == full and full >= 3 else step
        return hops

    def links_between(self, a: int, b: int) -> list[tuple[int, int]]:
        here, there = self.coords(a), self.coords(b)
        links = []
        for i, (extent, full) in enumerate(zip(self.shape, self.network.dims, strict=True)):
            closes = extent == full and full >= 3
            while here[i] != there[i]:
                if closes:
                    forward = (there[i] - here[i]) % extent
                    step = 1 if forward <= extent - forward else -1
                else:
                    step = 1 if there[i] > here[i] else -1
                before = self.node_at(here)
                here[i] = (here[i] + step) % extent
                links.append((before, self.node_at(here)))
        return links

    def dimensions_of(self, nodes: list[int]) -> tuple[TorusDimension, ...] | None:
        coords = [self.coords(n) for n in set(nodes)]
        out, count = [], 1
        names = self.names()
        for i in reversed(range(len(self.shape))):
            values = sorted({c[i] for c in coords})
            if len(values) > 1:
                if values[-1] - values[0] != len(values) - 1:
                    return None
                wraps = len(values) == self.shape[i] == self.network.dims[i] >= 3
                out.append(TorusDimension(names[i], len(values), wraps))
            count *= len(values)
        return tuple(out) if count == len(coords) else None

    def _flows(self, plan: Plan, axis: str, near: list[int]) -> Counter[tuple[int, int]]:
        dpn = plan.system.node.devices_per_node
        close = set(near)
        load: Counter[tuple[int, int]] = Counter()
        for group in groups_touching(plan, axis, near):
            for a, b in ring_edges([r // dpn for r in group], closed=not is_chain(axis)):
                if a in close or b in close:
                    load.update(self.links_between(a, b))
        return load

    def cross_axis_share(self, plan: Plan, axis: str, first_rank: int,
                         others: tuple[str, ...]) -> tuple[float, list[str]]:
        dpn = plan.system.node.devices_per_node
        nodes = [r // dpn for r in plan.members(axis, first_rank)]
        used = set()
        for a, b in ring_edges(nodes, closed=not is_chain(axis))[:CROSS_AXIS_STEPS]:
            used.update(self.links_between(a, b))
        if not used:
            return 1.0, []
        near = sorted({n for link in used for n in link})
        own = self._flows(plan, axis, near)
        share, crossed = 1.0, []
        foreign: Counter[tuple[int, int]] = Counter()
        for other in others:
            load = self._flows(plan, other, near)
            if any(load[link] for link in used):
                crossed.append(other)
                foreign.update(load)
        for link in used:
            share = min(share, own[link] / (own[link] + foreign[link]))
        return share, crossed

    def group_route(self, plan: Plan, axis: str, first_rank: int) -> Route:
        dpn = plan.system.node.devices_per_node
        nodes = [r // dpn for r in plan.members(axis, first_rank)]
        edges = ring_edges(nodes, closed=not is_chain(axis))
        if not edges:
            return Route("one node", 0, 1.0, ring_links=2, detail="all on one node")
        dims = self.dimensions_of(nodes)
        shape = "×".join(str(s) for s in self.shape)
        if dims is not None:
            links = 2 if len(dims) > 1 or dims[0].wraps else 1
            hops = max(d.hops for d in dims) if len(dims) == 1 else 1
            along = " × ".join(f"{d.name}:{d.size}{' ring' if d.wraps else ' line'}"
                               for d in dims)
            detail = (f"box {along} of the job's {shape} torus; one ring through it takes "
                      f"{hops}-hop steps on {links} link(s) per direction")
            return Route("torus links", hops, 1.0, ring_links=links, dims=dims, detail=detail)
        steps = [self.distance(a, b) for a, b in edges]
        hops, mean = max(steps), sum(steps) / len(steps)
        detail = (f"not a box of the job's {shape} torus: ring steps of {mean:.1f} hops on "
                  f"average (up to {hops}), each link shared by as many flows")
        return Route("torus links", hops, 1.0 / mean, ring_links=1, detail=detail)


GRID = [
    # (torus dims, job nodes, devices per node, tp, pp)
    ([8], 8, 1, 2, 1),
    ([8], 6, 1, 2, 3),
    ([16], 16, 2, 4, 2),
    ([4, 2], 8, 1, 2, 2),
    ([4, 3, 2], 24, 1, 4, 3),
    ([4, 3, 2], 24, 1, 6, 2),
    ([3, 4, 3], 36, 1, 3, 4),
    ([5, 4, 3], 50, 2, 4, 5),
    ([2, 3, 2], 12, 4, 8, 3),
    ([6, 5, 2, 3, 2], 180, 1, 12, 5),
    ([6, 5, 2, 3, 2], 168, 1, 8, 7),
    ([24, 23, 24, 2, 3, 2], 1_152, 1, 12, 24),
    ([24, 23, 24, 2, 3, 2], 1_104, 1, 16, 3),
    ([24, 23, 24, 2, 3, 2], 1_440, 2, 8, 10),
]


@pytest.mark.parametrize(("dims", "nodes", "per_node", "tp", "pp"), GRID)
@pytest.mark.parametrize("overlap", [(True, False), (True, True), (False, False)])
def test_every_route_equals_the_straightforward_one(dims: list[int], nodes: int,
                                                    per_node: int, tp: int, pp: int,
                                                    overlap: tuple[bool, bool]) -> None:
    sysm = system(torus(dims), nodes, devices=per_node)
    dp = nodes * per_node // (tp * pp)
    assert tp * pp * dp == nodes * per_node
    for order in (["tp", "cp", "dp", "ep", "pp"], ["tp", "pp", "cp", "dp", "ep"]):
        par = Parallelism(tp=tp, pp=pp, dp=dp, rank_order=order, overlap_dp_comm=overlap[0],
                          overlap_pp_comm=overlap[1],
                          schedule="interleaved-1f1b" if overlap[1] and pp > 1 else "1f1b",
                          virtual_stages=2 if overlap[1] and pp > 1 else 1)
        plan = Plan(sysm, nodes, par, dp)
        fast, plain = TorusTopology(sysm.network, nodes), Reference(sysm.network, nodes)
        assert fast.shape == plain.shape
        for axis in ("tp", "pp", "dp", "stage"):
            placement = plan.placement(axis)
            assert fast.route(plan, placement) == plain.route(plan, placement), (axis, order)
            for first in plan.group_first_ranks(axis, limit=8):
                assert fast.group_route(plan, axis, first) == plain.group_route(
                    plan, axis, first)
        nodes_seen = list(range(0, nodes, max(1, nodes // 40)))
        for a in nodes_seen:
            for b in nodes_seen[::3]:
                assert fast.distance(a, b) == plain.distance(a, b)
        for first in plan.group_first_ranks("dp", limit=4):
            members = [r // per_node for r in plan.members("dp", first)]
            assert fast.dimensions_of(members) == plain.dimensions_of(members)


@settings(max_examples=200, deadline=None)
@given(dims=st.lists(st.integers(1, 9), min_size=1, max_size=6), data=st.data())
def test_links_between_equals_the_hop_by_hop_walk(dims: list[int], data: st.DataObject) -> None:
    """A route's links, each dimension's run of hops made at once, are the hop-by-hop
    walk's, in order, on any torus shape and job size (open and closed dimensions)."""
    total = 1
    for d in dims:
        total *= d
    nodes = data.draw(st.integers(1, total))
    net = system(torus(dims), nodes).network
    fast, plain = TorusTopology(net, nodes), Reference(net, nodes)
    a, b = data.draw(st.integers(0, nodes - 1)), data.draw(st.integers(0, nodes - 1))
    links = fast.links_between(a, b)
    assert links == plain.links_between(a, b)
    assert all(type(x) is int for link in links for x in link)


def test_a_long_one_dimensional_route_is_one_array() -> None:
    """Half-way round a 1-D torus of 158,976 nodes (Fugaku's nodes in one ring): 79,488
    links, the short way, ending at the far node."""
    net = system(torus([158_976]), 158_976).network
    links = TorusTopology(net, 158_976).links_between(0, 79_488)
    assert len(links) == 79_488 and links[0] == (0, 1) and links[-1] == (79_487, 79_488)
    back = TorusTopology(net, 158_976).links_between(0, 79_489)
    assert len(back) == 79_487 and back[0] == (0, 158_975)



@settings(max_examples=150, deadline=None)
@given(dims=st.lists(st.integers(1, 9), min_size=1, max_size=4), data=st.data())
def test_link_loads_equal_counting_every_link_of_every_route(dims: list[int],
                                                             data: st.DataObject) -> None:
    """The flows :class:`LinkLoads` counts on chosen links, a few operations a route, are
    the count of each route's links one by one (rings, lines, wrap-around, both ways)."""
    total = 1
    for d in dims:
        total *= d
    nodes = data.draw(st.integers(2, total)) if total > 1 else 1
    topo = TorusTopology(system(torus(dims), nodes).network, nodes)
    pair = st.tuples(st.integers(0, nodes - 1), st.integers(0, nodes - 1))
    flows = data.draw(st.lists(pair, max_size=12))
    every = Counter(link for a, b in flows for link in topo.links_between(a, b))
    chosen = sorted({link for a, b in data.draw(st.lists(pair, max_size=4))
                     for link in topo.links_between(a, b)})
    loads = LinkLoads(tuple(topo.shape), topo._closes.tolist(), chosen, topo.coords)
    for a, b in flows:
        loads.add(a, b)
    assert loads.loads() == [every[link] for link in chosen]
