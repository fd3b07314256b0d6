"""Collective cost model: α–β algorithms on the path a group actually uses.

A group of ``n`` ranks has ``k`` members on each of ``N`` nodes (from the Plan's
:class:`~llmsim.plan.GroupPlacement`). Its traffic uses two kinds of link:

* inside a node, the fabric tier that holds its ``span_devices`` consecutive devices:
  ``B_intra = gbps_per_direction × efficiency`` per device, step latency ``α_intra``;
* between nodes, its share of the node's network injection (a send/recv between two
  stages: see :attr:`GroupPath.sender_inter_bytes_per_s`; neighbours on one node use the
  fabric, at most what NCCL's channels for the pair carry, :func:`pair_fabric_bytes_per_s`):
  every group of the axis on
  the node runs at the same time, so a device owns ``1/devices_per_node`` of it and the
  group ``B_inter = node_bw × network.efficiency × taper × k/devices_per_node``, with step
  latency ``α_inter = step_latency + hop_latency × hops``. ``node_bw`` is the NIC
  injection bandwidth, on a torus the links the group's ring drives; ``taper`` and
  ``hops`` are the network topology's route of the group (:mod:`llmsim.costs.topology`),
  and a torus group spanning several dimensions can also run one ring per dimension
  (:func:`torus_s`). The path is built in :mod:`llmsim.costs.paths`. The step latencies
  of NVIDIA systems are NCCL's own tuning model (``tuning.cc`` ``hwLat``, Ring with the
  Simple protocol that carries large messages).

Each algorithm gives a time; like NCCL's tuner (``src/graph/tuning.cc``,
``ncclTopoTuneModel``/``ncclTopoGetAlgoTime``), the fastest is taken per call, plus one
kernel launch. A system that names its library's own model (``network.collectives``, a
:class:`~llmsim.specs.CollectiveLibrary`) gets that tuner's algorithms and protocols
instead (:func:`library_times_s`). A measured nccl-tests table replaces the model
(:class:`CollectiveTable`).
See ``docs/cost-models.md`` for the derivations.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import replace

import numpy as np

from llmsim.calibration import CollectivePoint, bus_factor
from llmsim.costs.multidim import multidim_ring_s
from llmsim.costs.paths import (
    INF,
    NCCL_P2P_NVL_CHUNK_BYTES,
    GroupPath,
    device_link_bytes_per_s,
    group_path,
    net_peer_channels,
    node_network_bytes_per_s,
    pair_fabric_bytes_per_s,
    pair_p2p_channels,
    posted_p2p_units,
)
from llmsim.ops import Collective, CommOp
from llmsim.plan import Plan
from llmsim.specs import CollectiveLibrary, System
from llmsim.specs.collectives import Protocol

__all__ = [
    "ALGORITHMS",
    "NCCL_P2P_NVL_CHUNK_BYTES",
    "CollectiveModel",
    "CollectiveTable",
    "GroupPath",
    "algorithm_times_s",
    "device_link_bytes_per_s",
    "group_path",
    "net_peer_channels",
    "node_network_bytes_per_s",
    "pair_fabric_bytes_per_s",
    "pair_p2p_channels",
    "posted_p2p_units",
]

# -- algorithms ---------------------------------------------------------------------------


def volume_factor(collective: Collective, ranks: int) -> float:
    """Bytes each rank sends per byte of S: 2(n−1)/n all-reduce, (n−1)/n RS/AG.

    nccl-tests ``doc/PERFORMANCE.md``: the bus-bandwidth factors are these optimal
    per-rank volumes (ring all-reduce = reduce-scatter + all-gather).
    """
    return bus_factor(collective, ranks)


def ring_steps(collective: Collective, ranks: int) -> int:
    """Latency steps of a ring: 2(n−1) for all-reduce, n−1 for RS/AG."""
    return 2 * (ranks - 1) if collective == "all_reduce" else ranks - 1


def ring_s(collective: Collective, nbytes: float, path: GroupPath) -> float | None:
    """Ring (NCCL's default): f(n)·S/B + (steps(n) − steps(N))·α_intra + steps(N)·α_inter.

    Reference time 2(n−1)/n·S/B + 2(n−1)·α for an all-reduce (Patarasuk & Yuan 2009;
    nccl-tests PERFORMANCE.md). Across nodes the ring threads the k local members and
    leaves each node once per channel; with k rotated channels a node sends
    f(n)·S through its NICs while each device sends at most f(n)·S over the fabric, and
    chunks are pipelined through both, so B = min(B_intra, B_inter) (NCCL's tuner: bus
    bandwidth = channels × graph speed, the speed the slowest hop sustains). Of the
    steps, 2(N−1) (all-reduce) or N−1 cross the network (tuning.cc ``nInterSteps``).
    """
    if collective == "send_recv":
        return None
    n, n_nodes = path.ranks, path.nodes
    inter_steps = ring_steps(collective, n_nodes)
    latency = (ring_steps(collective, n) - inter_steps) * path.intra_latency_s
    latency += inter_steps * path.inter_latency_s
    return volume_factor(collective, n) * nbytes / path.bottleneck_bytes_per_s + latency


def hierarchical_s(collective: Collective, nbytes: float, path: GroupPath) -> float | None:
    """Two-level: intra-node phase on the fabric, then an inter-node phase, in sequence.

    All-reduce = reduce-scatter among the k local members, all-reduce of the S/k shard
    among the N nodes (k such rings side by side, one per local index, each on a device's
    network share), all-gather among the k; reduce-scatter and all-gather keep only
    their half. Time f(k)·S/B_intra + steps(k)·α_intra + f(N)·S/B_inter + steps(N)·α_inter
    (the k inter-node rings move f(N)·S/k each over B_inter/k). It moves less data over
    the network than the flat ring, f(N)·S instead of f(n)·S, and wins when the fabric is
    much faster than the network share.
    """
    if collective == "send_recv" or path.nodes < 2 or path.per_node < 2:
        return None
    k, n_nodes = path.per_node, path.nodes
    intra = volume_factor(collective, k) * nbytes / path.intra_bytes_per_s
    intra += ring_steps(collective, k) * path.intra_latency_s
    inter = volume_factor(collective, n_nodes) * nbytes / path.inter_bytes_per_s
    inter += ring_steps(collective, n_nodes) * path.inter_latency_s
    return intra + inter


def tree_s(collective: Collective, nbytes: float, path: GroupPath) -> float | None:
    """NCCL double binary tree all-reduce across nodes (Sanders, Speck & Träff 2009).

    NCCL's tuner prices it with algorithm bandwidth = ½ bus bandwidth, i.e. 2·S/B, and
    latency 2·((k−1)·α_intra + log2(N)·α_inter): a chain inside each node and a tree of
    depth log2 N between nodes (tuning.cc). Fewer latency steps than the ring make it the
    choice for small messages on many nodes.
    """
    if collective != "all_reduce" or path.nodes < 2:
        return None
    latency = 2 * (
        (path.per_node - 1) * path.intra_latency_s
        + math.ceil(math.log2(path.nodes)) * path.inter_latency_s
    )
    return 2.0 * nbytes / path.bottleneck_bytes_per_s + latency


def point_to_point_s(collective: Collective, nbytes: float, path: GroupPath) -> float | None:
    """send/recv between neighbouring ranks: α + S/B.

    Across nodes B is :attr:`GroupPath.sender_inter_bytes_per_s` (the devices of a stage
    that sit on one node send their slices at the same time and share its network, each
    on its own link); inside a node it is the fabric per device, at most what the
    library's channels for the pair carry (:attr:`GroupPath.pair_intra_bytes_per_s`).
    """
    if collective != "send_recv":
        return None
    if path.nodes > 1:
        return path.inter_latency_s + nbytes / path.sender_inter_bytes_per_s
    bandwidth = min(path.intra_bytes_per_s, path.pair_intra_bytes_per_s)
    return path.intra_latency_s + nbytes / bandwidth


def torus_s(collective: Collective, nbytes: float, path: GroupPath) -> float | None:
    """One ring per torus dimension, run at once (:func:`multidim_ring_s`); for a group of
    one device per node spanning two or more dimensions of a torus."""
    if collective == "send_recv" or len(path.dims) < 2 or path.per_node > 1:
        return None
    return multidim_ring_s(collective, nbytes, path.ranks, path.dims,
                           path.multidim_bytes_per_s)


Algorithm = Callable[[Collective, float, GroupPath], "float | None"]
ALGORITHMS: dict[str, Algorithm] = {
    "ring": ring_s,
    "hierarchical": hierarchical_s,
    "tree": tree_s,
    "point_to_point": point_to_point_s,
    "torus": torus_s,
}
"""Registered algorithms; each returns None where it does not apply."""


def algorithm_times_s(collective: Collective, nbytes: float, path: GroupPath,
                      library: CollectiveLibrary | None = None) -> dict[str, float]:
    """Time of every applicable algorithm (without the launch cost), by name.

    With a ``library`` the collectives are its own algorithms and protocols
    (:func:`library_times_s`, named ``ring/ll128`` and so on); a send/recv is always
    :func:`point_to_point_s`.
    """
    if library is not None and collective != "send_recv":
        return library_times_s(collective, nbytes, path, library)
    times = {name: algo(collective, nbytes, path) for name, algo in ALGORITHMS.items()}
    return {name: t for name, t in times.items() if t is not None}


# -- a collective library's own model ---------------------------------------------------------


def library_ring_s(collective: Collective, nbytes: float, path: GroupPath,
                   library: CollectiveLibrary, protocol: Protocol) -> float:
    """A ring with ``protocol`` as the library's tuner prices it.

    ``base + (steps(n) − steps(N))·α_fabric + steps(N)·(α_network + hops)`` plus
    ``f(n)·S / (B·fraction)``: the protocol's share of the bus bandwidth ``B`` (LL's
    8-byte stores carry 4 bytes of data beside a flag, LL128's 128-byte lines 120 bytes;
    LL's capped where the library caps it), the plateau factor on the latency of a large
    Simple all-reduce across nodes, and, across nodes, a fabric step never cheaper than
    the library's network floor (NCCL ``tuning.cc``).
    """
    n, n_nodes, k = path.ranks, path.nodes, path.per_node
    fraction = library.ring_bandwidth_fraction.of(protocol)
    if protocol == "ll" and n_nodes == 1 and collective != "all_reduce":
        fraction = library.ring_ll_one_node_gather_fraction
    if protocol == "ll128" and k < 2:
        fraction = library.ring_ll128_one_per_node_fraction
    fabric = library.step_latency_us.fabric.of("ring", protocol)
    if protocol == "ll" and n_nodes > 1:
        fabric *= library.ll_fabric_step_factor_across_nodes
    if n_nodes > 1 and library.ring_network_step_floor_us is not None:
        fabric = max(fabric, library.ring_network_step_floor_us.of(protocol))
    network = library.step_latency_us.network.of("ring", protocol) + path.hop_latency_s * 1e6
    inter_steps = ring_steps(collective, n_nodes)
    if (collective == "all_reduce" and n_nodes > 1
            and library.all_reduce_network_steps == "2N"):
        inter_steps = 2 * n_nodes
    latency_us = library.base_latency_us.of("ring", protocol)
    latency_us += (ring_steps(collective, n) - inter_steps) * fabric + inter_steps * network
    if protocol == "simple" and collective == "all_reduce" and n_nodes > 1:
        per_rank = library.ring_plateau_bytes_per_rank_channel
        plateau_bytes = n / 16 * 65536 if per_rank is None else per_rank * path.channels * n
        if nbytes >= plateau_bytes:
            latency_us *= library.ring_plateau_latency_factor
    bandwidth = library.ll_capped(protocol, n_nodes, path.bottleneck_bytes_per_s * fraction)
    return latency_us * 1e-6 + volume_factor(collective, n) * nbytes / bandwidth


def library_tree_s(nbytes: float, path: GroupPath, library: CollectiveLibrary,
                   protocol: Protocol) -> float:
    """A double binary tree all-reduce across nodes as the library's tuner prices it.

    Latency ``base + 2·((k−1)·α_fabric + ⌊log2 N⌋·(α_network + hops))``; algorithm
    bandwidth half the bus bandwidth ``min(B·tree_bus_fraction, cap(N))`` times the
    protocol's fraction (LL's capped where the library caps it) and, below the table's
    end, the tree correction of the message's size class (64 B · 2^i ≤ S < 64 B ·
    2^(i+1)). Where the correction rises from one class to the next the tuner's time
    drops; like a measured table, the time is held at the largest it reached for a
    smaller message, so a bigger message never takes less.
    """
    n_nodes, k = path.nodes, path.per_node
    fabric = library.step_latency_us.fabric.of("tree", protocol)
    if protocol == "ll":
        fabric *= library.ll_fabric_step_factor_across_nodes
    network = library.step_latency_us.network.of("tree", protocol) + path.hop_latency_s * 1e6
    levels = int(math.log2(n_nodes))
    latency_us = library.base_latency_us.of("tree", protocol)
    latency_us += 2 * ((k - 1) * fabric + levels * network)
    cap = library.tree_cap_bytes_per_s(protocol, n_nodes, path.channels)
    bus = min(path.bottleneck_bytes_per_s * library.tree_bus_fraction, cap)
    bus = library.ll_capped(protocol, n_nodes, bus * library.tree_protocol_fraction.of(protocol))
    corrections = library.tree_correction[protocol]
    size_class = max(int(nbytes) // 64, 1).bit_length() - 1
    corrected_bytes = nbytes / (corrections[size_class] if size_class < len(corrections) else 1)
    for i in range(min(size_class, len(corrections))):  # each smaller class's largest message
        corrected_bytes = max(corrected_bytes, 64.0 * 2 ** (i + 1) / corrections[i])
    return latency_us * 1e-6 + 2.0 * corrected_bytes / bus


def library_times_s(collective: Collective, nbytes: float, path: GroupPath,
                    library: CollectiveLibrary) -> dict[str, float]:
    """Every (algorithm, protocol) the library would consider for this call.

    Rings for every collective; the tree for an all-reduce across nodes (on one node the
    tree, a chain through the node, is not modelled: NCCL's tuner rarely picks it there).
    """
    times = {}
    for protocol in library.protocols:
        times[f"ring/{protocol}"] = library_ring_s(collective, nbytes, path, library, protocol)
        if collective == "all_reduce" and path.nodes > 1:
            times[f"tree/{protocol}"] = library_tree_s(nbytes, path, library, protocol)
    return times


# -- measured tables ------------------------------------------------------------------------


class _Series:
    """busbw(size) of one (collective, ranks, nodes), sorted by size."""

    def __init__(self, ranks: int, nodes: int, sizes: dict[int, list[float]]) -> None:
        self.ranks, self.nodes = ranks, nodes
        self.sizes = np.array(sorted(sizes), dtype=float)
        self.busbw = np.array([sum(sizes[s]) / len(sizes[s]) for s in sorted(sizes)]) * 1e9
        self.log_sizes = np.log(self.sizes)

    def time_s(self, collective: Collective, ranks: int, nbytes: float) -> float:
        """t = S / algbw, algbw = busbw(S) / factor(n), busbw interpolated in log S.

        Below the smallest measured size the smallest size's time is used (latency
        bound); above the largest, its busbw. Measured times are made monotone by a
        running maximum, so a bigger message never takes less time even when the
        measured busbw jumps (protocol switches).
        """
        factor = bus_factor(collective, ranks)
        measured = np.maximum.accumulate(self.sizes * factor / self.busbw)
        if nbytes <= self.sizes[0]:
            return float(measured[0])
        i = int(np.searchsorted(self.sizes, nbytes, side="right")) - 1
        busbw = float(np.interp(math.log(nbytes), self.log_sizes, self.busbw))
        return max(float(measured[i]), nbytes * factor / busbw)


class CollectiveTable:
    """Measured nccl-tests bus bandwidths, looked up for a group's shape.

    For a group of n ranks on N nodes, the measured series of that collective closest
    in shape is used: smallest |log(k_meas/k)| + |log(N_meas/N)| (k = ranks per node),
    then closest rank count, then fewer ranks. With single-node sweeps this is the
    closest measured rank count.
    """

    def __init__(self, points: Iterable[CollectivePoint]) -> None:
        grouped: dict[tuple[str, int, int], dict[int, list[float]]] = defaultdict(
            lambda: defaultdict(list)
        )
        for p in points:
            grouped[(p.collective, p.ranks, p.nodes)][p.bytes].append(p.busbw_gbps)
        self._series: dict[str, list[_Series]] = defaultdict(list)
        for (collective, ranks, nodes), sizes in sorted(grouped.items()):
            self._series[collective].append(_Series(ranks, nodes, sizes))

    def covers(self, collective: Collective) -> bool:
        """Whether ``collective`` was measured."""
        return bool(self._series.get(collective))

    def series_for(self, collective: Collective, ranks: int, nodes: int) -> _Series:
        """The measured series closest to a group of ``ranks`` on ``nodes``."""
        per_node = ranks / nodes

        def distance(s: _Series) -> tuple[float, float, int]:
            shape = abs(math.log(s.ranks / s.nodes / per_node)) + abs(math.log(s.nodes / nodes))
            return (round(shape, 12), abs(math.log(s.ranks / ranks)), s.ranks)

        return min(self._series[collective], key=distance)

    def time_s(self, collective: Collective, ranks: int, nodes: int, nbytes: float) -> float:
        """Measured time of ``collective`` on ``ranks`` over ``nodes`` (must be covered)."""
        return self.series_for(collective, ranks, nodes).time_s(collective, ranks, nbytes)


# -- the model ------------------------------------------------------------------------------


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
        self._paths: dict[str, GroupPath | None] = {}
        self._cache: dict[tuple[str, str, float], float] = {}

    def path(self, axis: str) -> GroupPath | None:
        """The path of ``axis``'s groups, or None when the axis has one rank."""
        if axis not in self._paths:
            placement = self.plan.placements.get(axis) or self.plan.placement(axis)
            self._paths[axis] = (group_path(self.system, placement, self.plan)
                                 if placement is not None and placement.size > 1 else None)
        return self._paths[axis]

    def comm_s(self, op: CommOp) -> float:
        """Duration of ``op`` in seconds (0 for a one-rank group or an empty message)."""
        key = (op.collective, op.axis, op.bytes, op.within_node, op.two_rank)
        cached = self._cache.get(key)
        if cached is None:
            cached = self._cache[key] = self._price(op.collective, op.axis, op.bytes,
                                                    op.within_node, op.two_rank)
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
        library = self.system.network.collectives
        return min(algorithm_times_s(collective, nbytes, path, library).values()) + self.launch_s
