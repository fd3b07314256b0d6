"""The α–β collective algorithms: ring, hierarchical, tree, point-to-point and torus, each a
time on a group's path (:class:`~llmsim.costs.paths.GroupPath`), registered by name in
:data:`ALGORITHMS` (None where an algorithm does not apply); docs/cost-models.md derives
them."""

from __future__ import annotations

import math
from collections.abc import Callable

from llmsim.calibration import bus_factor
from llmsim.costs.multidim import multidim_ring_s
from llmsim.costs.paths import (
    GroupPath,
)
from llmsim.ops import Collective


def volume_factor(collective: Collective, ranks: int) -> float:
    """Bytes each rank sends per byte of S: 2(n−1)/n all-reduce, (n−1)/n RS/AG.

    nccl-tests ``doc/PERFORMANCE.md``: the bus-bandwidth factors are these optimal
    per-rank volumes (ring all-reduce = reduce-scatter + all-gather).
    """
    return bus_factor(collective, ranks)


def ring_steps(collective: Collective, ranks: int) -> int:
    """Latency steps of a ring: 2(n−1) for all-reduce, n−1 for RS/AG and for a broadcast
    (the chain from the root through the ring's n−1 hops, its message pipelined: NCCL's
    ring broadcast, bus factor 1 in nccl-tests ``doc/PERFORMANCE.md``; NCCL's tuner counts
    n steps for it, ``tuning.cc``)."""
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

    With a step floor φ (``network.ring_step_floor``, :attr:`GroupPath.ring_step_floor_s`)
    a message of at least its ``from_bytes`` takes at least steps(n)·φ, and the floor
    overlaps the transfer instead of adding to it: ``max(α–β time, steps(n)·φ)``. A ring
    step's slices are pipelined through the library's ``NCCL_STEPS`` buffer slots, so a
    step's fixed cost runs while other slices move; RCCL's measured rings on Frontier have
    this shape (docs/cost-models.md, "RCCL's step floor").
    """
    if collective == "send_recv":
        return None
    n, n_nodes = path.ranks, path.nodes
    inter_steps = ring_steps(collective, n_nodes)
    latency = (ring_steps(collective, n) - inter_steps) * path.intra_latency_s
    latency += inter_steps * path.inter_latency_s
    alpha_beta = volume_factor(collective, n) * nbytes / path.bottleneck_bytes_per_s + latency
    if nbytes < path.ring_step_floor_from_bytes:
        return alpha_beta
    return max(alpha_beta, ring_steps(collective, n) * path.ring_step_floor_s)


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
