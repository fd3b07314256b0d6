"""The collective cost model: the fastest applicable algorithm on the path a group uses
(:func:`algorithm_times_s`, like NCCL's tuner), plus a launch; a measured table where one
covers the collective; an MPI library's all-reduce as its rules pick it (``network.mpi``,
:mod:`~llmsim.costs.collectives.mpi_rules`)."""

from __future__ import annotations

from dataclasses import replace

from llmsim.costs.collectives.algorithms import ALGORITHMS
from llmsim.costs.collectives.library import library_times_s
from llmsim.costs.collectives.mpi_rules import GroupGeometry, group_geometry, mpi_all_reduce_s
from llmsim.costs.collectives.table import CollectiveTable
from llmsim.costs.collectives.wait_poll import polled_s
from llmsim.costs.paths import (
    INF,
    GroupPath,
    group_path,
    pair_p2p_channels,
)
from llmsim.errors import UserError
from llmsim.ops import Collective, CommOp
from llmsim.plan import Plan
from llmsim.specs import CollectiveLibrary, System


def algorithm_times_s(collective: Collective, nbytes: float, path: GroupPath,
                      library: CollectiveLibrary | None = None,
                      offered: dict[str, list[str]] | None = None) -> dict[str, float]:
    """Time of every applicable algorithm (without the launch cost), by name.

    With a ``library`` the collectives are its own algorithms and protocols
    (:func:`library_times_s`, named ``ring/ll128`` and so on); a send/recv is always
    :func:`point_to_point_s`. Otherwise ``offered`` (``network.collective_algorithms``)
    keeps, for a collective it lists, only the algorithms the library's tuner considers.
    """
    if library is not None and collective != "send_recv":
        return library_times_s(collective, nbytes, path, library)
    names = (offered or {}).get(collective, ALGORITHMS)
    times = {name: ALGORITHMS[name](collective, nbytes, path) for name in names}
    applicable = {name: t for name, t in times.items() if t is not None}
    if not applicable:
        raise UserError(
            f"network.collective_algorithms gives {collective} {list(names)}, none of which "
            f"can run this {collective}: list one that applies to it (e.g. ring)")
    return applicable


class CollectiveModel:
    """Prices communication ops of a plan on a system (memoised per op)."""

    def __init__(
        self,
        system: System,
        plan: Plan,
        launch_s: float = 0.0,
        table: CollectiveTable | None = None,
    ) -> None:
        self.system, self.plan, self.launch_s, self.table = system, plan, launch_s, table
        self.library, self.tuner_library = _libraries(system)
        self._paths: dict[str, GroupPath | None] = {}
        self._geometry: dict[str, GroupGeometry] = {}
        self._cache: dict[tuple[str, str, float], float] = {}
        self.wait_poll_s = plan.parallelism.collective_wait_poll_ms * 1e-3
        """The host's poll period of a collective it waits on (:func:`polled_s`), s."""

    def path(self, axis: str) -> GroupPath | None:
        """The path of ``axis``'s groups, or None when the axis has one rank."""
        if axis not in self._paths:
            placement = self.plan.placements.get(axis) or self.plan.placement(axis)
            self._paths[axis] = (group_path(self.system, placement, self.plan)
                                 if placement is not None and placement.size > 1 else None)
        return self._paths[axis]

    def geometry(self, axis: str) -> GroupGeometry:
        """Where the members of ``axis``'s worst group sit (an MPI library's recursive
        doubling and Trinaryx3 price over it), worked out once per axis."""
        if axis not in self._geometry:
            placement = self.plan.placements.get(axis) or self.plan.placement(axis)
            self._geometry[axis] = group_geometry(self.plan, axis, placement.first_rank)
        return self._geometry[axis]

    def comm_s(self, op: CommOp) -> float:
        """Duration of ``op`` in seconds (0 for a one-rank group or an empty message), as
        the host sees it when it polls the wait (``collective_wait_poll_ms``)."""
        key = (op.collective, op.axis, op.bytes, op.within_node, op.two_rank)
        cached = self._cache.get(key)
        if cached is None:
            cached = self._cache[key] = polled_s(
                self._price(op.collective, op.axis, op.bytes, op.within_node, op.two_rank),
                self.wait_poll_s)
        return cached

    def _pair_bytes_per_s(self, nbytes: float) -> float:
        """What a two-rank communicator's channels carry between two devices of a node."""
        node = self.system.node
        tier = node.tier_for(2) if node.fabric else None
        channels = pair_p2p_channels(self.system, nbytes, within_node=True)
        if tier is None or tier.link_gbps is None or channels == 0:
            return INF
        return channels / 2 * tier.link_gbps * 1e9

    def _price(self, collective: Collective, axis: str, nbytes: float,
               within_node: bool = False, two_rank: bool = False) -> float:
        path = self.path(axis)
        if path is None or nbytes <= 0:
            return 0.0
        if within_node and collective == "send_recv" and path.per_node > 1:
            path = replace(path, ranks=2, nodes=1)
            if two_rank:  # the pair's own channels, c/2 links of the fabric
                path = replace(path, pair_intra_bytes_per_s=self._pair_bytes_per_s(nbytes))
        if self.table is not None and self.table.covers(collective):
            if collective == "send_recv":  # a pair of neighbours, on one node or two
                return self.table.time_s(collective, 2, min(path.nodes, 2), nbytes)
            return self.table.time_s(collective, path.ranks, path.nodes, nbytes)
        mpi = self.system.network.mpi
        if mpi is not None:
            mpi_s = mpi_all_reduce_s(mpi, collective, nbytes, path, lambda: self.geometry(axis))
            if mpi_s is not None:
                return mpi_s + self.launch_s
        offered = self.system.network.collective_algorithms
        times = algorithm_times_s(collective, nbytes, path, self.tuner_library, offered)
        if self.tuner_library is not self.library:  # the tuner's pick pays what it left out
            chosen = min(times, key=times.__getitem__)
            return algorithm_times_s(collective, nbytes, path, self.library,
                                     offered)[chosen] + self.launch_s
        return min(times.values()) + self.launch_s


def _libraries(system: System) -> tuple[CollectiveLibrary | None, CollectiveLibrary | None]:
    """The system's collective library as it prices a call, and as its tuner picks one.

    The system's ``network.ring_post_us`` (its hosts' cost of posting a network
    operation) replaces the library's ring step floor; a library whose tuner does not
    count the floor (``ring_network_post_tuned: false``) picks the algorithm and
    protocol without it, and the pick is priced with it.
    """
    network = system.network
    library = network.collectives
    if library is None:
        return None, None
    if network.ring_post_us is not None:
        library = library.model_copy(
            update={"ring_network_post_us": network.ring_post_us})
    if library.ring_network_post_tuned or library.ring_network_post_us is None:
        return library, library
    return library, library.model_copy(update={"ring_network_post_us": None})
