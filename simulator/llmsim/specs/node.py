"""Node spec: devices per node, the intra-node fabric and the network interfaces."""

from __future__ import annotations

from pydantic import Field, PositiveFloat, PositiveInt, model_validator

from llmsim.specs._base import Spec
from llmsim.specs.accelerator import Accelerator


class FabricTier(Spec):
    """One level of the intra-node fabric.

    Tiers are ordered from the tightest group outward. A collective among devices that
    fit in an aligned group of ``devices`` runs at this tier's per-device bandwidth: on an
    MI250X node a GCD pair in one package has 200 GB/s, a ring over all eight GCDs only
    the cross-package links (50 GB/s); an NVSwitch node is one tier.
    """

    devices: PositiveInt
    """Size of the aligned device group this tier connects."""
    gbps_per_direction: PositiveFloat
    """Link bandwidth per device per direction inside such a group, GB/s."""
    efficiency: float = Field(gt=0, le=1)
    """Achieved fraction of that bandwidth by collectives (nccl-tests busbw / link)."""
    latency_us: float = Field(default=2.0, ge=0)
    """Per-step latency of a collective algorithm step on this tier, microseconds."""
    link_gbps: PositiveFloat | None = None
    """Bandwidth of one link of the tier as the communication library budgets it, GB/s
    (NCCL ``src/graph/topo.h``: 20.0 per NVLink3, 20.6 per NVLink4). NCCL gives a
    send/recv two channels per link of the path, so a peer with ``c`` channels moves
    ``c/2`` links' worth; a communicator with peers on other nodes gives every peer the
    network's few channels (the network's ``p2p_channels_per_net_peer``).
    None: no such limit (a send between two devices of the tier runs at the tier's rate)."""


class Node(Spec):
    """A compute node: the accelerators, how they are wired and the NICs."""

    accelerator: Accelerator
    """The device (catalog name or inline spec)."""
    devices_per_node: PositiveInt
    """OS-visible devices per node (8 GCDs on a Frontier node, 12 stacks on Aurora)."""
    fabric_name: str = ""
    """Name of the intra-node fabric (NVLink3 + NVSwitch, Infinity Fabric, Xe Link ...)."""
    fabric: list[FabricTier] = Field(default_factory=list)
    """Intra-node tiers from tightest to widest; empty for one device per node."""
    nics_per_node: PositiveInt
    """Network interfaces per node."""
    nic_gbit: PositiveFloat
    """Line rate of one NIC per direction, Gb/s (bits)."""
    host_memory_gb: PositiveFloat | None = None
    """CPU memory per node, GB."""
    collective_units: int = Field(default=0, ge=0)
    """Compute units (SMs) the collective library's kernels hold on a device while a
    data-parallel collective runs beside the compute: NCCL runs one thread block per
    channel for as long as the collective lasts, and the GEMM and attention kernels of
    that time run on the units left (:attr:`~llmsim.ops.ComputeOp.reserved_units`).
    0: not modelled (the collectives cost the compute nothing)."""
    p2p_kernels_hold_units: bool = False
    """Whether the communication library runs a send or receive as a kernel of one thread
    block per channel that holds its compute unit while the operation is posted (NCCL):
    an overlapped interleaved pipeline posts its receives a pass ahead, and each holds
    its units until the peer's send has come (``docs/engine.md``): the network's
    ``p2p_channels_per_net_peer`` with a peer on another node, a share of
    ``p2p_channels_per_peer`` with one on this node. False: not modelled (MPI progressed
    on assistant cores, copy-engine transfers, or not known)."""
    p2p_channels_per_peer: int = Field(default=0, ge=0, le=64)
    """Channels NCCL gives a send/recv peer on this node (``p2pnChannelsPerPeer`` of a
    two-rank communicator: two per NVLink of the path, rounded up to a power of two, at
    most the communicator's p2p channels); one operation runs on half of them for a
    message of 1 MiB to 256 MiB (:func:`llmsim.costs.collectives.posted_p2p_units`).
    0: not modelled (a posted operation with a peer on the node holds nothing)."""

    @model_validator(mode="after")
    def _tiers_cover_the_node(self) -> Node:
        if self.devices_per_node > 1 and not self.fabric:
            raise ValueError(
                f"node.fabric is empty but devices_per_node is {self.devices_per_node}; "
                "add at least one tier covering all devices of the node"
            )
        sizes = [t.devices for t in self.fabric]
        if sizes != sorted(sizes) or (sizes and sizes[-1] != self.devices_per_node):
            raise ValueError(
                f"node.fabric tiers have devices {sizes}; they must grow and the last must "
                f"equal devices_per_node ({self.devices_per_node})"
            )
        return self

    @model_validator(mode="after")
    def _collectives_leave_compute_units(self) -> Node:
        units = self.accelerator.gemm.compute_units
        if self.collective_units >= units:
            raise ValueError(
                f"node.collective_units is {self.collective_units} but "
                f"{self.accelerator.name} has {units} compute units; give fewer"
            )
        return self

    @property
    def injection_bytes_per_s(self) -> float:
        """Line-rate injection bandwidth of the node per direction, bytes/s."""
        return self.nics_per_node * self.nic_gbit * 1e9 / 8

    def tier_for(self, group_span: int) -> FabricTier:
        """The tightest tier whose groups hold ``group_span`` consecutive devices."""
        for tier in self.fabric:
            if group_span <= tier.devices:
                return tier
        return self.fabric[-1]
