"""Network specs: fat-tree, dragonfly and torus, as a union discriminated by ``kind``."""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import Field, PositiveFloat, PositiveInt, model_validator

from llmsim.specs._base import Name, Spec
from llmsim.specs.collectives import CollectiveLibrary, ProtocolValues
from llmsim.specs.mpi import MpiCollectives

AlgorithmName = Literal["ring", "hierarchical", "tree", "point_to_point", "torus"]
"""An α–β algorithm of :data:`llmsim.costs.collectives.ALGORITHMS`."""
LibraryCollective = Literal["all_reduce", "all_gather", "reduce_scatter", "send_recv",
                            "all_to_all"]
"""A collective whose algorithms ``collective_algorithms`` can restrict."""


class RingStepFloor(Spec):
    """The least time one step of the library's ring takes, hidden behind the step's
    transfer rather than added to it: a ring's time is ``max(f(n)·S/B + steps·α,
    steps·floor)`` (:func:`llmsim.costs.collectives.ring_s`). RCCL's ring on MI250X
    nodes shows one (docs/cost-models.md, "RCCL's step floor")."""

    fabric_us: PositiveFloat
    """Floor of a step of a ring on one node, microseconds."""
    network_us: PositiveFloat
    """Floor of a step of a ring that spans nodes, microseconds (every step of it, the
    ring's steps going in lockstep at the pace of its slowest)."""
    from_bytes: PositiveInt
    """Smallest message the floor holds for, bytes: the smallest size it was measured at.
    Below it the library's low-latency protocol runs (RCCL's 16-GCD all-reduces and
    all-gathers of 8 B-8 KB take 25-35 us, ROCm/rccl pull requests 929 and 930) and the
    ring is the α–β sum alone."""


class _NetworkBase(Spec):
    name: Name = ""
    """Product name (InfiniBand HDR, Slingshot-11, Tofu-D ...)."""
    hop_latency_us: float = Field(default=1.0, ge=0)
    """Latency of one switch traversal between nodes, microseconds."""
    step_latency_us: float = Field(default=0.0, ge=0)
    """Fixed cost of one collective-algorithm step between nodes at the endpoints
    (NIC, library proxy, completion), microseconds; the step pays it plus the hops."""
    efficiency: float = Field(default=0.9, gt=0, le=1)
    """Achieved fraction of line rate for large messages between nodes."""
    p2p_channels_per_net_peer: PositiveInt = 2
    """Channels NCCL gives a send/recv with a peer on another node
    (``NCCL_NCHANNELS_PER_NET_PEER``, default 2: two per NIC, ``src/graph/paths.cc``; the
    paths.cc from before NCCL's Ampere support used 1). Each peer of a
    communicator gets the fewest channels any of its peers needs, rounded up to a power of
    two (``ncclTopoComputeP2pChannels``), so in a group that spans nodes a send between
    two members on one node also runs on this many channels; the fabric tier's
    ``link_gbps`` says what they carry. Each channel is a thread block that holds an SM
    while the operation is posted, where the node's ``p2p_kernels_hold_units`` says so."""
    ring_graph_channels: PositiveInt | None = None
    """Channels of the ring graph NCCL's topology search finds for a communicator that
    spans nodes (``graph->nChannels``, before the runtime doubles them): the tuner's
    per-channel caps multiply it (``ring_ll128_max_bus_gbps_per_channel`` of
    ``collectives``). None: not known, no such cap."""
    ring_post_us: ProtocolValues | None = None
    """Least a fabric step of a library ring that spans nodes costs on this system's
    hosts, microseconds per protocol: the host's cost of posting a network operation,
    which every step of such a ring pays (NCCL ``getNetOverhead``: 1 µs on Intel x86,
    2 on AMD, ×3 for Simple). Replaces ``collectives``' ``ring_network_post_us`` (so it
    needs ``collectives``: an error without it); None: the library's own."""
    collectives: CollectiveLibrary | None = None
    """The collective library's own cost model (a ``hardware/collectives`` entry, e.g.
    ``nccl-2021``): collectives are then priced per algorithm and protocol as that
    library predicts them. Without it every collective is a Simple-protocol α–β ring,
    tree or two-level algorithm with ``step_latency_us`` and the fabric's latency."""
    collective_algorithms: dict[LibraryCollective, list[AlgorithmName]] | None = None
    """The α–β algorithms the collective library's tuner considers, per collective,
    where it offers fewer than llmsim's: RCCL runs an all-gather or reduce-scatter only
    as a ring, never two-level (``hardware/systems/frontier.yaml``). A collective not
    listed, or None, may take any applicable algorithm. An error with ``collectives``."""
    ring_step_floor: RingStepFloor | None = None
    """The least time a step of the α–β ring takes where the library pipelines its slices so
    that a step's latency overlaps its transfer (RCCL on ``frontier`` and ``lumi``); None:
    no floor, the ring is the α–β sum alone. An error with ``collectives``."""
    mpi: MpiCollectives | None = None
    """The MPI library's all-reduce on a CPU machine (Fujitsu MPI on Fugaku): an
    all-reduce its rules give to the ring, recursive doubling or Trinaryx3 is priced as
    that algorithm (:mod:`llmsim.costs.collectives.mpi_rules`), the rest as without it."""

    @model_validator(mode="after")
    def _check_library_fields(self) -> _NetworkBase:
        """Fields that only mean something with, or only without, a collective library's
        own cost model: refuse them where they would be silently ignored."""
        if self.collectives is None and self.ring_post_us is not None:
            raise ValueError(
                "network.ring_post_us is set without network.collectives: it replaces the "
                "collective library's ring step floor, so name the library (e.g. "
                "collectives: nccl-2021) or remove ring_post_us")
        if self.collectives is not None:
            for field in ("collective_algorithms", "ring_step_floor"):
                if getattr(self, field) is not None:
                    raise ValueError(
                        f"network.{field} is set together with network.collectives: it "
                        "shapes the α–β algorithms used without a library cost model, and "
                        f"the library's own model prices every call — remove {field} or "
                        "collectives")
        return self


class FatTree(_NetworkBase):
    """A (possibly tapered) fat-tree: full bisection under a leaf, taper above it."""

    kind: Literal["fat_tree"] = "fat_tree"
    nodes_per_leaf: PositiveInt
    """Nodes connected at full bisection bandwidth (a rack or scalable unit)."""
    oversubscription: float = Field(default=1.0, ge=1)
    """Taper above the leaf level: downlink over uplink bandwidth (1 = non-blocking)."""
    rail_optimized: bool = False
    """Whether NIC i of every node sits on rail switch i (DGX SuperPOD style)."""

    def bandwidth_fraction(self, nodes_spanned: int, nodes_total: int) -> float:
        """Share of injection bandwidth a job gets across ``nodes_spanned`` nodes."""
        if nodes_spanned <= self.nodes_per_leaf:
            return 1.0
        return 1.0 / self.oversubscription

    def hops(self, nodes_spanned: int, nodes_total: int) -> int:
        """Switch traversals on the longest path among ``nodes_spanned`` nodes."""
        return 1 if nodes_spanned <= self.nodes_per_leaf else 3


class Dragonfly(_NetworkBase):
    """A dragonfly: all-to-all groups joined by global links (Slingshot)."""

    kind: Literal["dragonfly"] = "dragonfly"
    nodes_per_group: PositiveInt
    """Nodes in one dragonfly group (a cabinet on Frontier, a rack on Aurora)."""
    global_taper: float = Field(default=1.0, ge=1)
    """Injection bandwidth of a group over its global bandwidth (1.75 on Frontier)."""
    global_links_per_group_pair: PositiveInt | None = None
    """Global links joining one pair of groups, each at ``node.nic_gbit`` (4 on Frontier);
    unset: only the taper of all of a group's global links limits traffic between groups."""
    routing: Literal["minimal", "adaptive"] = "adaptive"
    """``minimal``: traffic to another group uses only the links joining the pair;
    ``adaptive`` (UGAL, Slingshot's default): also through intermediate groups."""
    job_placement: Literal["packed", "scattered"] = "packed"
    """How a job's nodes lie in the dragonfly groups: ``packed``, consecutive nodes fill
    one group before the next (an empty machine, or a scheduler that keeps jobs in as few
    groups as it can); ``scattered``, node i in group i mod G with G the machine's groups
    or the job's nodes if fewer (a busy machine handing out free nodes wherever they
    are): every ring step between consecutive nodes then leaves its group, and the job
    has only its own nodes' share of each group's global links
    (:mod:`llmsim.costs.topology.dragonfly`). A stride of a multiple of G stays in one
    group: the round robin is a stand-in for a scheduler's scatter, not a measured one."""

    def job_groups(self, job_nodes: int, machine_nodes: int) -> int:
        """G: the dragonfly groups a scattered job of ``job_nodes`` nodes goes round on a
        machine of ``machine_nodes`` nodes (its groups, or the job's nodes if fewer)."""
        machine = -(-max(machine_nodes, job_nodes) // self.nodes_per_group)
        return max(1, min(machine, job_nodes))

    def group_of(self, node: int, job_nodes: int, machine_nodes: int) -> int:
        """The dragonfly group of the job's node ``node`` under ``job_placement``."""
        if self.job_placement == "scattered":
            return node % self.job_groups(job_nodes, machine_nodes)
        return node // self.nodes_per_group

    def bandwidth_fraction(self, nodes_spanned: int, nodes_total: int) -> float:
        """Share of injection bandwidth across groups: the global links' taper."""
        if nodes_spanned <= self.nodes_per_group:
            return 1.0
        return 1.0 / self.global_taper

    def hops(self, nodes_spanned: int, nodes_total: int) -> int:
        """Switch hops: 1 within a switch... 3 across groups (minimal routing)."""
        return 2 if nodes_spanned <= self.nodes_per_group else 3


class Torus(_NetworkBase):
    """A multi-dimensional mesh/torus with direct node links (Tofu-D is 6-D)."""

    kind: Literal["torus"] = "torus"
    dims: list[PositiveInt]
    """Size of each dimension; their product is the node count."""
    link_gbps_per_direction: PositiveFloat
    """Bandwidth of one link per direction, GB/s."""
    job_shape: list[PositiveInt] | None = None
    """The job's torus as the user asks the job manager for it, 1 to 3 node extents
    (Fugaku: ``pjsub -L "node=16:torus"`` is ``[16]``, ``"node=4x6x16:torus"`` is
    ``[4, 6, 16]``), the first extent the slowest-varying one of the rank order
    (``rank-map-bynode``). The job is then priced on that torus: each extent a ring
    where it has 3 or more nodes, neighbouring coordinates one link apart (Tofu's
    virtual torus, docs/cost-models.md "The job's shape"). None: llmsim picks the box of
    ``dims`` itself (:func:`llmsim.costs.topology.job_shape`)."""

    @model_validator(mode="after")
    def _job_shape_fits(self) -> Torus:
        """A given job shape has at most 3 extents (or as many as ``dims``, if fewer),
        each fitting the machine (:func:`job_shape_fits`)."""
        shape = self.job_shape
        if shape is None:
            return self
        most = min(3, len(self.dims))
        if len(shape) > most:
            raise ValueError(
                f"network.job_shape {shape} has {len(shape)} extents; a job asks for a "
                f"1-D to {most}-D shape, so give at most {most}")
        if not job_shape_fits(shape, self.virtual_dims):
            raise ValueError(
                f"network.job_shape {shape} does not fit the machine's torus "
                f"{'×'.join(str(d) for d in self.virtual_dims)} (network.dims {self.dims}"
                f"{' taken in pairs X·a, Y·b, Z·c' if len(self.dims) == 6 else ''}); "
                f"make each extent at most the dimensions it lies along (a 1-D shape at "
                f"most the machine's {math.prod(self.dims)} nodes)")
        return self

    @property
    def virtual_dims(self) -> list[int]:
        """The machine's torus as a job shape sees it: on a 6-D torus (Tofu) the
        pairs X·a, Y·b, Z·c, each a ring through both dimensions (Ajima et al., "Tofu: A
        6D Mesh/Torus Interconnect for Exascale Computers", IEEE Computer 42(11), 2009:
        the 3-D torus view a job is given); otherwise ``dims``."""
        if len(self.dims) == 6:
            return [self.dims[i] * self.dims[i + 3] for i in range(3)]
        return list(self.dims)

    @property
    def job_dims(self) -> list[int]:
        """The torus a job's placement and costs run on: ``job_shape`` where given, else
        the machine's ``dims`` (of which llmsim takes a box)."""
        return list(self.job_shape) if self.job_shape is not None else list(self.dims)

    def bandwidth_fraction(self, nodes_spanned: int, nodes_total: int) -> float:
        """A ring embedded along the torus uses direct links: no taper."""
        return 1.0

    def hops(self, nodes_spanned: int, nodes_total: int) -> int:
        """Neighbour hops of a ring step embedded in the torus."""
        return 1

    @property
    def diameter(self) -> int:
        """Worst-case hop count between two nodes."""
        return sum(math.floor(d / 2) for d in self.dims)


def job_shape_fits(shape: list[int], machine: list[int]) -> bool:
    """Whether a job shape of extents ``shape`` fits a torus of dimensions ``machine``:
    each machine dimension is given to one extent (the job manager may swap axes, RIKEN's
    Fugaku user guide §3.4.1, and a 1-D or 2-D shape folds several dimensions into one
    extent), every extent gets at least one and is at most the product of its own."""
    k = len(shape)

    def fits(i: int, sizes: list[int]) -> bool:
        if i == len(machine):
            return all(size >= extent for size, extent in zip(sizes, shape, strict=True))
        return any(fits(i + 1, [*sizes[:j], sizes[j] * machine[i], *sizes[j + 1:]])
                   for j in range(k))

    return k <= len(machine) and fits(0, [1] * k)


Network = Annotated[FatTree | Dragonfly | Torus, Field(discriminator="kind")]
