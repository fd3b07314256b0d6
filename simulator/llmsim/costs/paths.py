"""The path a group's traffic uses: its links, their achieved bandwidth and step latency.

A group of ``n`` ranks has ``k`` members on each of ``N`` nodes (the Plan's
:class:`~llmsim.plan.GroupPlacement`). Inside a node it uses the fabric tier that holds its
devices; between nodes its share of the node's network, as the network's topology routes
it (:mod:`llmsim.costs.topology`): the hops of a step and the share of line rate left when
every group of its axis runs at once. :func:`group_path` turns that into a
:class:`GroupPath` the collective algorithms of :mod:`llmsim.costs.collectives` price
over; the rest of this module is what a send/recv between two devices gets from NCCL's
channels. See ``docs/cost-models.md`` ("The path").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llmsim.costs.multidim import RingDimension
from llmsim.costs.topology import Route, topology_of
from llmsim.plan import GroupPlacement, Plan
from llmsim.specs import FabricTier, System, Torus

INF = math.inf


@dataclass(frozen=True, slots=True)
class GroupPath:
    """What one communicator's traffic crosses, in SI units."""

    ranks: int
    """n: ranks in the group."""
    nodes: int
    """N: nodes holding them."""
    per_node: int
    """k: members on one node."""
    intra_bytes_per_s: float
    """Achieved fabric bandwidth per device per direction (inf when k = 1)."""
    intra_latency_s: float
    """Latency of one algorithm step inside a node."""
    inter_bytes_per_s: float
    """Achieved network bandwidth of the whole group per direction (inf when N = 1)."""
    inter_latency_s: float
    """Latency of one algorithm step between nodes."""
    link_bytes_per_s: float = INF
    """Achieved bandwidth of one device's own way out of the node (one NIC, or one direct
    link on a torus): the most a single transfer between two nodes can use."""
    pair_intra_bytes_per_s: float = INF
    """What the library's channels for one pair carry on the fabric: in a group that spans
    nodes NCCL gives every peer the network peers' channels, each half a link
    (:func:`pair_fabric_bytes_per_s`); inf when no such limit applies. A send between two
    members on one node runs at the lower of this and ``intra_bytes_per_s``."""
    hop_latency_s: float = 0.0
    """The switch hops' share of ``inter_latency_s`` (what a library's own step latency
    between nodes does not include)."""
    channels: int = 0
    """The library's channels for a collective (``node.collective_units``; 0: unknown)."""
    ring_channels: int = 0
    """Channels of the library's ring graph across nodes (``network.ring_graph_channels``;
    0: unknown or on one node)."""
    dims: tuple[RingDimension, ...] = ()
    """On a torus, the dimensions the group spans with each one's ring bandwidth and step
    latency (:mod:`llmsim.costs.multidim`); empty elsewhere."""
    multidim_bytes_per_s: float = INF
    """On a torus, the bandwidth of one ring per dimension run at once: the links of
    every dimension, at most the node's injection interfaces (:func:`multidim_ring_s`)."""
    ring_step_floor_s: float = 0.0
    """The least time one ring step takes, hidden behind its transfer
    (``network.ring_step_floor``: the fabric's on one node, the network's across nodes;
    0: none)."""
    ring_step_floor_from_bytes: float = INF
    """Smallest message ``ring_step_floor_s`` holds for, bytes (inf: none)."""

    @property
    def bottleneck_bytes_per_s(self) -> float:
        """Slowest link a pipelined ring or tree crosses: min(B_intra, B_inter)."""
        return min(self.intra_bytes_per_s, self.inter_bytes_per_s)

    @property
    def sender_inter_bytes_per_s(self) -> float:
        """Network bandwidth of one member's send to a member on another node.

        Only the node's devices that hold the sending member's position in the group (its
        stage, for the pipeline axis) send across the network at once:
        ``devices_per_node / k`` of them, which share the node's network, so each gets the
        group's ``B_inter``; one device never gets more than its own link.
        """
        return min(self.inter_bytes_per_s, self.link_bytes_per_s)


def node_network_bytes_per_s(system: System) -> float:
    """Line-rate network bandwidth of a node per direction.

    NIC injection, except on a torus with direct node links (Tofu-D), where a ring
    embedded along the torus sends to both of its neighbours at once: two links, capped
    by what the node can inject.
    """
    injection = system.node.injection_bytes_per_s
    network = system.network
    if isinstance(network, Torus):
        return min(2.0 * network.link_gbps_per_direction * 1e9, injection)
    return injection


def device_link_bytes_per_s(system: System) -> float:
    """Line rate of one device's own way out of the node per direction: one NIC, or on a
    torus one direct link, never more than the node injects."""
    network = system.network
    if isinstance(network, Torus):
        link = network.link_gbps_per_direction * 1e9
    else:
        link = system.node.nic_gbit * 1e9 / 8
    return min(link, system.node.injection_bytes_per_s)


def pair_fabric_bytes_per_s(system: System, tier: FabricTier, spans_nodes: bool) -> float:
    """Most a send/recv between two devices of ``tier`` moves per second.

    NCCL runs a send/recv on ``p2pnChannelsPerPeer`` channels, the fewest any pair of the
    communicator's ranks needs, rounded up to a power of two (``ncclTopoComputeP2pChannels``
    in ``src/graph/paths.cc``): two per NVLink of the path for peers on the node, the
    network's ``p2p_channels_per_net_peer`` for peers on other nodes. It budgets two
    channels per link, so ``c`` channels carry ``c/2`` of the tier's ``link_gbps``. On one
    node that is every link of the path (no limit); in a group that spans nodes it is
    the network's few channels for every peer, the neighbour on the same node included.
    """
    if not spans_nodes or tier.link_gbps is None:
        return INF
    return net_peer_channels(system) / 2 * tier.link_gbps * 1e9


def net_peer_channels(system: System) -> int:
    """NCCL's send/recv channels for a peer on another node: ``p2p_channels_per_net_peer``
    rounded up to a power of two (``ncclTopoComputeP2pChannels``)."""
    return 1 << (system.network.p2p_channels_per_net_peer - 1).bit_length()


NCCL_P2P_NVL_CHUNK_BYTES = 512 * 1024
"""NCCL's step of a send/recv between two GPUs on NVLink (``NCCL_P2P_NVL_CHUNKSIZE``; a
debug log of a two-rank communicator on two A100-SXM4-80GB, NCCL 2.20.5, reads "P2P
Chunksize set to 524288")."""


def posted_p2p_units(system: System, nbytes: float, within_node: bool) -> int:
    """Compute units one posted send or receive of ``nbytes`` holds: its thread blocks
    (:func:`pair_p2p_channels`) where the node's library kernels hold their units while
    posted (``node.p2p_kernels_hold_units``), else 0."""
    if not system.node.p2p_kernels_hold_units:
        return 0
    return pair_p2p_channels(system, nbytes, within_node)


def pair_p2p_channels(system: System, nbytes: float, within_node: bool) -> int:
    """Thread blocks (channels) NCCL runs one send or receive of ``nbytes`` on, on the
    two-rank communicator PyTorch uses for a single ``isend``/``irecv``; 0 where the
    node's channels per peer are not known.

    A peer on another node gets the network's ``p2p_channels_per_net_peer`` (rounded up to
    a power of two). A peer on the node gets the node's ``p2p_channels_per_peer``
    (NCCL's ``p2pnChannelsPerPeer``), split as ``scheduleP2pTasksToPlan`` in
    ``src/enqueue.cc`` splits it (NCCL 2.18–2.20): an operation starts on as many channels
    as each rank of the communicator can have at once, ``p2pnChannelsPerPeer / 2`` for
    two ranks, in chunks of at least ``NCCL_P2P_NVL_CHUNK_BYTES / 8``, and doubles them
    while a chunk would exceed 32 steps of ``NCCL_P2P_NVL_CHUNK_BYTES``
    (``calcP2pChunkSize``); one block per chunk.
    """
    if not within_node:
        return net_peer_channels(system)
    per_peer = system.node.p2p_channels_per_peer
    if per_peer == 0 or nbytes <= 0:
        return 0
    step = NCCL_P2P_NVL_CHUNK_BYTES
    channels = max(1, per_peer // 2)
    chunk = max(step // 8, math.ceil(nbytes / channels))
    while chunk > 32 * step and channels <= per_peer // 2:
        channels *= 2
        chunk = math.ceil(nbytes / channels)
    chunk = math.ceil(chunk / (step // 8)) * (step // 8)
    return min(channels, math.ceil(nbytes / chunk))


def group_path(system: System, placement: GroupPlacement,
               plan: Plan | None = None) -> GroupPath:
    """The links and latencies of one group on ``system`` (see the module docstring).

    Between nodes the network's topology routes the group (:mod:`llmsim.costs.topology`,
    given the ``plan``): its hops, and the share of line rate it keeps when every group of
    its axis runs at once and their flows share links (a tapered spine, a dragonfly's
    global links, a torus link several shifted rings cross). On a torus a node drives one
    link per direction of each ring it runs (2 on a closed ring), and the dimensions the
    group spans let it run one ring per dimension at once (:func:`multidim_ring_s`).
    Without a plan the network spec's own taper applies to a group whose nodes lie in more
    than one leaf switch / dragonfly group, evaluated at the whole system's node count.
    """
    node, network = system.node, system.network
    k, n_nodes = placement.members_per_node, placement.nodes_spanned
    if k > 1 and node.fabric:
        tier = node.tier_for(placement.span_devices)
        intra_bw = tier.gbps_per_direction * 1e9 * tier.efficiency
        intra_lat = tier.latency_us * 1e-6
        pair_bw = pair_fabric_bytes_per_s(system, tier, n_nodes > 1)
    else:
        intra_bw, intra_lat, pair_bw = INF, 0.0, INF
    dims: tuple[RingDimension, ...] = ()
    multidim_bw = INF
    if n_nodes > 1:
        route = (topology_of(system, plan.nodes).route(plan, placement) if plan is not None
                 else _spec_route(system, placement))
        share = min(1.0, k / node.devices_per_node)
        node_bw = node_network_bytes_per_s(system)
        if isinstance(network, Torus):
            link = network.link_gbps_per_direction * 1e9
            node_bw = min(route.ring_links * link, node.injection_bytes_per_s)
            step_s = network.step_latency_us * 1e-6
            dims = tuple(
                RingDimension(d.size, min(d.links * link, node.injection_bytes_per_s)
                              * network.efficiency * route.bandwidth_fraction * share,
                              step_s + network.hop_latency_us * d.hops * 1e-6)
                for d in route.dims)
            if dims:
                driven = min(sum(d.links for d in route.dims), node.nics_per_node)
                multidim_bw = (min(driven * link, node.injection_bytes_per_s)
                               * network.efficiency * route.bandwidth_fraction * share)
        inter_bw = node_bw * network.efficiency * route.bandwidth_fraction * share
        hop_lat = network.hop_latency_us * route.hops * 1e-6
        inter_lat = network.step_latency_us * 1e-6 + hop_lat
        link_bw = device_link_bytes_per_s(system) * network.efficiency * route.bandwidth_fraction
    else:
        inter_bw, inter_lat, link_bw, hop_lat = INF, 0.0, INF, 0.0
    ring_channels = (network.ring_graph_channels or 0) if n_nodes > 1 else 0
    floor = network.ring_step_floor
    floor_s = 0.0 if floor is None else (
        floor.network_us if n_nodes > 1 else floor.fabric_us) * 1e-6
    floor_from = INF if floor is None else float(floor.from_bytes)
    return GroupPath(placement.size, n_nodes, k, intra_bw, intra_lat, inter_bw, inter_lat,
                     link_bw, pair_bw, hop_lat, node.collective_units, ring_channels, dims,
                     multidim_bw, floor_s, floor_from)


def _spec_route(system: System, placement: GroupPlacement) -> Route:
    """The route the network spec alone gives a group: its taper and hops once it spans
    more than one leaf / dragonfly group, at the whole system's node count."""
    network = system.network
    span = system.nodes if placement.domains_spanned > 1 else placement.nodes_spanned
    links = 2 if isinstance(network, Torus) else 1
    return Route(placement.level, network.hops(span, system.nodes),
                 network.bandwidth_fraction(span, system.nodes), ring_links=links)
