"""Flows counted on chosen links of a torus, route by route, without listing each route's
links.

:meth:`~llmsim.costs.topology.torus.TorusTopology.cross_axis_share` needs, on each link of a
group's first ring steps, how many flows of its own and the concurrent axes cross it. A
flow goes by dimension-order routing: one run of hops along each dimension in turn, on
the line of nodes that share every other coordinate, the short way round where the
dimension closes into a ring. So a flow covers, on one line and in one direction, a range
of consecutive link positions (split in two where it wraps). :class:`LinkLoads` keeps a
difference array per (dimension, line, direction) that holds one of the chosen links and
adds one at the start of each run's range and takes one off past its end (integers: the
counts are exact): a route costs a few operations per
dimension however many hops it takes (a 1-D torus of 158,976 nodes routes runs of tens of
thousands of hops), and the loads are the arrays' prefix sums at the chosen links. The
result equals counting every link of every route (``tests/test_torus_fast.py``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

Link = tuple[int, int]
"""A directed link: (node, next node)."""


class LinkLoads:
    """Flows on ``links`` of a job's torus box ``box`` (``closes[i]``: dimension ``i`` is a
    ring; ``coords``: a node's coordinates in the box), added route by route (:meth:`add`),
    counted with :meth:`loads`."""

    def __init__(self, box: tuple[int, ...], closes: list[bool], links: list[Link],
                 coords: Callable[[int], list[int]]) -> None:
        self._box, self._closes, self._coords = box, closes, coords
        self._strides = [int(np.prod(box[i + 1:], dtype=np.int64)) for i in range(len(box))]
        self._lines: dict[tuple[int, int, int], np.ndarray] = {}
        self._where: list[tuple[tuple[int, int, int], int]] = []
        for u, v in links:
            here, there = self._coords(u), self._coords(v)
            i = next(d for d in range(len(box)) if here[d] != there[d])
            forward = (there[i] == (here[i] + 1) % box[i]) if closes[i] else there[i] > here[i]
            step = 1 if forward else -1
            key = (i, u - here[i] * self._strides[i], step)
            if key not in self._lines:
                self._lines[key] = np.zeros(box[i] + 1, dtype=np.int64)
            self._where.append((key, here[i]))

    def add(self, a: int, b: int) -> None:
        """One flow from node ``a`` to node ``b``, routed by dimension order
        (as :meth:`~llmsim.costs.topology.torus.TorusTopology.links_between`)."""
        here, there = self._coords(a), self._coords(b)
        node = a
        for i, extent in enumerate(self._box):
            if here[i] == there[i]:
                continue
            if self._closes[i]:
                forward = (there[i] - here[i]) % extent
                step, hops = (1, forward) if forward <= extent - forward else (-1, extent - forward)
            else:
                step, hops = (1 if there[i] > here[i] else -1), abs(there[i] - here[i])
            base = node - here[i] * self._strides[i]
            line = self._lines.get((i, base, step))
            if line is not None:  # the link at position q leaves node q of the line
                low = here[i] if step > 0 else here[i] - hops + 1
                self._range(line, low % extent, hops, extent)
            node = base + there[i] * self._strides[i]
            here[i] = there[i]

    @staticmethod
    def _range(line: np.ndarray, low: int, hops: int, extent: int) -> None:
        high = low + hops
        line[low] += 1
        if high <= extent:
            line[high] -= 1
        else:  # round the ring's end
            line[extent] -= 1
            line[0] += 1
            line[high - extent] -= 1

    def loads(self) -> list[int]:
        """The flows on each of the links, in the order given."""
        sums = {key: np.cumsum(line) for key, line in self._lines.items()}
        return [int(sums[key][position]) for key, position in self._where]


def ring_steps(nodes: np.ndarray, closed: bool) -> tuple[np.ndarray, np.ndarray]:
    """:func:`~llmsim.costs.topology.base.ring_edges` of ``nodes`` as two arrays, the
    steps' first nodes and their next ones."""
    if len(nodes) == 0:
        return nodes, nodes
    distinct = nodes[np.concatenate(([True], nodes[1:] != nodes[:-1]))]
    if len(distinct) > 1 and distinct[0] == distinct[-1]:
        distinct = distinct[:-1]
    if len(distinct) < 2:
        return distinct[:0], distinct[:0]
    if closed:
        return distinct, np.roll(distinct, -1)
    return distinct[:-1], distinct[1:]
