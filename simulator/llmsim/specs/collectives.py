"""A collective library's own cost model: latency and bandwidth per algorithm and protocol.

NCCL chooses, for every call, the algorithm (ring, tree) and the protocol (LL, LL128,
Simple) its tuner predicts to be fastest (``src/graph/tuning.cc``: ``ncclTopoTuneModel``
builds the table, ``ncclTopoGetAlgoTime`` prices a call). A :class:`CollectiveLibrary`
holds that model's constants for one version of the library; a system names it as
``network.collectives`` and llmsim then prices its collectives the way that library
predicts them (:mod:`llmsim.costs.collectives`).
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, PositiveFloat, model_validator

from llmsim.specs._base import Name, Spec

Protocol = Literal["ll", "ll128", "simple"]
LibraryAlgorithm = Literal["ring", "tree"]
RingCapCollective = Literal["all_gather", "reduce_scatter", "all_reduce"]


class ProtocolValues(Spec):
    """One number per protocol."""

    ll: float = Field(ge=0)
    ll128: float = Field(ge=0)
    simple: float = Field(ge=0)

    def of(self, protocol: Protocol) -> float:
        """The value for ``protocol``."""
        return float(getattr(self, protocol))


class AlgorithmValues(Spec):
    """One number per algorithm and protocol."""

    ring: ProtocolValues
    tree: ProtocolValues

    def of(self, algorithm: LibraryAlgorithm, protocol: Protocol) -> float:
        """The value for ``algorithm`` with ``protocol``."""
        return getattr(self, algorithm).of(protocol)


class StepLatencies(Spec):
    """Latency of one algorithm step by the link it crosses, microseconds."""

    fabric: AlgorithmValues
    """A step between two devices of one node (NVLink)."""
    network: AlgorithmValues
    """A step between nodes, at the endpoints; llmsim adds the switch hops."""


class BusCap(Spec):
    """Most bus bandwidth an algorithm reaches, GB/s, by how many nodes it spans."""

    one_node: PositiveFloat | None = None
    """On one node (where the cap applies there)."""
    two_nodes: PositiveFloat
    """On two nodes (and on one where ``one_node`` is not given)."""
    more_nodes: PositiveFloat
    """On more than two nodes."""

    def at(self, nodes: int) -> float:
        """The cap for a group over ``nodes`` nodes, GB/s."""
        if nodes <= 1 and self.one_node is not None:
            return self.one_node
        return self.two_nodes if nodes <= 2 else self.more_nodes


class CollectiveLibrary(Spec):
    """A collective library's tuning model (NCCL's ``tuning.cc`` of one version).

    A call of ``S`` bytes with algorithm ``a`` and protocol ``p`` takes
    ``latency(a, p) + S / algorithm_bandwidth(a, p)``, and the library picks the
    fastest pair. Bandwidths start from the bus bandwidth ``B`` llmsim derives from the
    links (the ring's ``min(B_intra, B_inter)``) and apply the library's protocol and
    tree refinements; latencies are the base latency plus one step latency per ring
    step, or per tree level.
    """

    name: Name
    """Catalog name, e.g. ``nccl-2021``."""
    description: str = ""
    """Library and version the numbers come from."""
    protocols: list[Protocol] = Field(default_factory=lambda: ["ll", "ll128", "simple"])
    """Protocols the library uses on the systems that name this model."""
    base_latency_us: AlgorithmValues
    """Fixed latency of one call, microseconds (``baseLat``)."""
    step_latency_us: StepLatencies
    """Latency of one step, microseconds (``hwLat``)."""
    ll_fabric_step_factor_across_nodes: PositiveFloat = 1.0
    """Multiplies LL's fabric step latency when the group spans nodes."""
    ring_bandwidth_fraction: ProtocolValues
    """Ring bus bandwidth per protocol as a fraction of ``B``: LL across nodes or for an
    all-reduce, LL128 with two or more members per node."""
    ring_ll_one_node_gather_fraction: PositiveFloat = 1.0
    """LL's fraction for a reduce-scatter or all-gather on one node."""
    ring_ll128_one_per_node_fraction: PositiveFloat = 1.0
    """LL128's fraction when the group has one member per node (``ppn < 2``)."""
    ll_max_bus_gbps: BusCap | None = None
    """LL's most bus bandwidth after its fraction, ring and tree alike (``llMaxBws``);
    None: no such cap."""
    ring_ll128_max_bus_gbps_per_channel: dict[RingCapCollective, PositiveFloat] | None = None
    """LL128's most ring bus bandwidth per channel of the ring graph, by collective, GB/s
    (``ll128MaxBwPerCh``): times the network's ``ring_graph_channels`` it caps the ring's
    LL128 bandwidth after its fraction; not applied where the channels are unknown or the
    collective is not listed."""
    ring_network_post_us: ProtocolValues | None = None
    """Least a fabric step of a ring that spans nodes costs, per protocol: the host's
    cost of posting a network operation, which every step of such a ring pays
    (``getNetOverhead``); None: no floor."""
    ring_network_post_tuned: bool = True
    """Whether the library's tuner counts that floor when it picks an algorithm and
    protocol (NCCL 2.18 on). False: it picks without it, and the ring it picks pays the
    floor all the same (NCCL 2.7–2.17, whose proxy posted every step of a ring across
    nodes but whose tuner did not count it)."""
    all_reduce_network_steps: Literal["2(N-1)", "2N"] = "2(N-1)"
    """Network steps the tuner counts for a ring all-reduce over N > 1 nodes."""
    tree_bus_fraction: PositiveFloat
    """The tree's bus bandwidth as a fraction of ``B`` before its cap."""
    tree_max_bus_gbps: dict[Protocol, BusCap] | None = None
    """The tree's bus bandwidth cap per protocol, GB/s (one of this and
    ``tree_max_bus_gbps_per_channel``)."""
    tree_max_bus_gbps_per_channel: BusCap | None = None
    """The tree's bus bandwidth cap per channel, every protocol, GB/s: times the node's
    channel count (``node.collective_units``) it caps the tree (``perChMaxTreeBws``)."""
    tree_protocol_fraction: ProtocolValues
    """Applied to the capped tree bandwidth per protocol."""
    tree_correction: dict[Protocol, list[PositiveFloat]]
    """Tree bandwidth multipliers for message sizes 64 B · 2^i (i = 0 … len − 1); larger
    messages get none (``treeCorrectionFactor``)."""
    ring_plateau_latency_factor: PositiveFloat = 1.0
    """Multiplies the latency of a Simple ring all-reduce across nodes of at least
    ``n/16 × 64 KiB`` (the ring's plateau), or of ``ring_plateau_bytes_per_rank_channel``
    per rank and channel where that is given."""
    ring_plateau_bytes_per_rank_channel: PositiveFloat | None = None
    """Where given, the plateau starts at this many bytes per rank and channel."""
    sources: dict[str, str] = Field(default_factory=dict)
    """Where each number comes from: field name → citation."""

    @model_validator(mode="after")
    def _every_protocol_has_a_tree_cap(self) -> CollectiveLibrary:
        if (self.tree_max_bus_gbps is None) == (self.tree_max_bus_gbps_per_channel is None):
            raise ValueError(
                f"collective library {self.name!r}: give the tree's cap either per protocol "
                "(tree_max_bus_gbps) or per channel (tree_max_bus_gbps_per_channel), not "
                "both or neither"
            )
        caps = self.tree_max_bus_gbps
        missing = [p for p in self.protocols if (caps is not None and p not in caps)
                   or p not in self.tree_correction]
        if missing:
            raise ValueError(
                f"collective library {self.name!r}: tree_max_bus_gbps and tree_correction "
                f"need an entry for protocol(s) {', '.join(missing)}; add them"
            )
        return self

    @model_validator(mode="after")
    def _bandwidth_fractions_positive(self) -> CollectiveLibrary:
        for field in ("ring_bandwidth_fraction", "tree_protocol_fraction"):
            for protocol in ("ll", "ll128", "simple"):
                value = getattr(self, field).of(protocol)
                if value <= 0:  # the bytes are divided by the bandwidth it scales
                    raise ValueError(
                        f"collective library {self.name!r}: {field}.{protocol} is {value}, "
                        "and a bandwidth fraction must be above 0; give the library's own"
                    )
        return self

    @property
    def per_channel(self) -> bool:
        """Whether the model needs the node's channel count (``node.collective_units``)."""
        return (self.tree_max_bus_gbps_per_channel is not None
                or self.ring_plateau_bytes_per_rank_channel is not None)

    def ll_capped(self, protocol: Protocol, nodes: int, bus_bytes_per_s: float) -> float:
        """``bus_bytes_per_s`` under LL's cap over ``nodes`` nodes (``ll_max_bus_gbps``);
        unchanged for the other protocols or without a cap."""
        if protocol != "ll" or self.ll_max_bus_gbps is None:
            return bus_bytes_per_s
        return min(bus_bytes_per_s, self.ll_max_bus_gbps.at(nodes) * 1e9)

    def ring_ll128_cap_bytes_per_s(self, collective: str, ring_channels: int) -> float:
        """LL128's ring bus bandwidth cap for ``collective`` over a ring graph of
        ``ring_channels`` channels, bytes/s; inf where not known (no channels, no entry)."""
        caps = self.ring_ll128_max_bus_gbps_per_channel
        if not ring_channels or caps is None or collective not in caps:
            return math.inf
        return caps[collective] * ring_channels * 1e9

    def tree_cap_bytes_per_s(self, protocol: Protocol, nodes: int, channels: int) -> float:
        """The tree's bus bandwidth cap for ``protocol`` over ``nodes`` nodes, bytes/s."""
        if self.tree_max_bus_gbps is not None:
            return self.tree_max_bus_gbps[protocol].at(nodes) * 1e9
        assert self.tree_max_bus_gbps_per_channel is not None
        return self.tree_max_bus_gbps_per_channel.at(nodes) * channels * 1e9
