"""A collective library's own tuning model (``network.collectives``, a
:class:`~llmsim.specs.CollectiveLibrary`): its algorithms and protocols priced as its tuner
prices them."""

from __future__ import annotations

import math

from llmsim.costs.collectives.algorithms import ring_steps, volume_factor
from llmsim.costs.paths import (
    GroupPath,
)
from llmsim.ops import Collective
from llmsim.specs import CollectiveLibrary
from llmsim.specs.collectives import Protocol


def library_ring_s(collective: Collective, nbytes: float, path: GroupPath,
                   library: CollectiveLibrary, protocol: Protocol) -> float:
    """A ring with ``protocol`` as the library's tuner prices it.

    ``base + (steps(n) − steps(N))·α_fabric + steps(N)·(α_network + hops)`` plus
    ``f(n)·S / (B·fraction)``: the protocol's share of the bus bandwidth ``B`` (LL's
    8-byte stores carry 4 bytes of data beside a flag, LL128's 128-byte lines 120 bytes;
    LL's capped where the library caps it, LL128's at its per-channel ceiling times the
    ring graph's channels where both are known), the plateau factor on the latency of a large
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
    if n_nodes > 1 and library.ring_network_post_us is not None:
        fabric = max(fabric, library.ring_network_post_us.of(protocol))
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
    if protocol == "ll128":
        bandwidth = min(bandwidth, library.ring_ll128_cap_bytes_per_s(collective,
                                                                       path.ring_channels))
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
