"""Which all-reduce algorithm an MPI library's rules give a call, and its time.

Fujitsu MPI's decision tree (``fjmpi-dectree.conf`` from a Fugaku node,
HLC-Lab/bine_trees_fugaku 0755a2eb, ``allreduce``) as ``network.mpi`` holds it:

* up to ``ring_max_ranks`` (32) processes: the ring from ``ring_min_bytes_per_rank``
  (8 KiB) a process (:mod:`~llmsim.costs.collectives.mpi_ring`), recursive doubling below
  (``recursive_doubling``, or ``rdbc, recursive_doubling``: the Tofu barrier interface's
  variant, ``rdbc``, is not modelled; :mod:`~llmsim.costs.collectives.mpi_doubling`);
* from there up to ``tree_max_ranks`` (3,840): recursive doubling up to
  ``doubling_max_bytes`` (96 KiB), Trinaryx3 above
  (:mod:`~llmsim.costs.collectives.mpi_trinary`; the ring the rules list after it is the
  fallback where Trinaryx3 cannot run, not modelled);
* more processes, or a library without the eager cost (``eager_overhead_us``): only the
  ring's rule holds, and the other calls get llmsim's own algorithms.

Recursive doubling and Trinaryx3 need where the group's members sit: a
:class:`GroupGeometry` (their nodes, the hops between two nodes on the job's topology).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from llmsim.costs.collectives.mpi_doubling import Hops, doubling_hops, doubling_s
from llmsim.costs.collectives.mpi_ring import mpi_ring_s, runs_ring
from llmsim.costs.collectives.mpi_trinary import trinary_s
from llmsim.costs.paths import GroupPath
from llmsim.costs.topology import TorusTopology, topology_of
from llmsim.ops import Collective
from llmsim.plan import Plan
from llmsim.specs.mpi import MpiCollectives


@dataclass(frozen=True)
class GroupGeometry:
    """Where one group's members sit: their nodes in group order, the hops between nodes
    and the node a spanning tree of them is rooted at."""

    nodes: np.ndarray
    """Node of each member, in the group's rank order."""
    hops: Hops
    """Hops between the nodes of each pair of equal-length arrays (0 on one node)."""
    hop_s: float
    """Latency of one hop, seconds."""
    root: int
    """The group's node nearest its centre (:func:`group_geometry`)."""

    @functools.cached_property
    def depth(self) -> int:
        """Hops from :attr:`root` to the farthest member's node: the depth of a spanning
        tree rooted there (``Σ ⌊k_i / 2⌋`` on a box of ``k_1 × … × k_d``)."""
        return int(self.hops(np.full(len(self.nodes), self.root), self.nodes).max())


def group_geometry(plan: Plan, axis: str, first_rank: int) -> GroupGeometry:
    """The :class:`GroupGeometry` of the group of ``axis`` holding ``first_rank``. On a
    torus: hops by dimension-order routing (:meth:`TorusTopology.hops`), and the root the
    group's node nearest the node at the median coordinate of its nodes along every
    dimension (a box's centre). On a switched network: one hop between any two nodes, the
    root the first member's node."""
    dpn = plan.system.node.devices_per_node
    nodes = np.asarray(plan.members(axis, first_rank)) // dpn
    topology = topology_of(plan.system, plan.nodes)
    hop_s = plan.system.network.hop_latency_us * 1e-6
    if not isinstance(topology, TorusTopology):
        def hops(a: np.ndarray, b: np.ndarray) -> np.ndarray:
            return (a != b).astype(int)
        return GroupGeometry(nodes, hops, hop_s, int(nodes[0]))
    distinct = np.unique(nodes)
    coords = np.stack([topology.coords(int(n)) for n in distinct])
    centre = topology.node_at([int(c) for c in np.sort(coords, axis=0)[len(distinct) // 2]])
    nearest = distinct[int(np.argmin(topology.hops(np.full(len(distinct), centre), distinct)))]
    return GroupGeometry(nodes, topology.hops, hop_s, int(nearest))


def mpi_all_reduce_s(mpi: MpiCollectives, collective: Collective, nbytes: float,
                     path: GroupPath, geometry: Callable[[], GroupGeometry]) -> float | None:
    """Seconds of ``collective`` of ``nbytes`` on ``path`` as the library's rules run it,
    without the call's launch; None where the rules give it no modelled algorithm (then
    llmsim's own algorithms price it). ``geometry`` is asked only where needed."""
    if collective != "all_reduce" or path.ranks < 2:
        return None
    if runs_ring(mpi, collective, path.ranks, nbytes):
        return mpi_ring_s(nbytes, path, mpi)
    if mpi.eager_overhead_us is None:
        return None
    if path.ranks > mpi.ring_max_ranks:
        if mpi.tree_max_ranks is None or path.ranks > mpi.tree_max_ranks:
            return None
        if nbytes > (mpi.doubling_max_bytes or 0):
            where = geometry()
            return trinary_s(nbytes, path, mpi, where.depth)
    where = geometry()
    return doubling_s(nbytes, path, mpi, doubling_hops(where.nodes, where.hops), where.hop_s)
