"""System spec: a machine is a number of identical nodes on one network."""

from __future__ import annotations

import math

from pydantic import Field, PositiveFloat, PositiveInt, model_validator

from llmsim.specs._base import Spec
from llmsim.specs.network import Network, Torus
from llmsim.specs.node import Node
from llmsim.specs.power import Facility
from llmsim.specs.reliability import Reliability
from llmsim.specs.storage import Storage


class System(Spec):
    """A supercomputer partition: node count, node design and network."""

    name: str
    """Catalog name, e.g. ``frontier``."""
    description: str = ""
    """Human-readable name and site."""
    nodes: PositiveInt
    """Compute nodes in the partition."""
    node: Node
    """The node design."""
    network: Network
    """The inter-node network."""
    power_mw: PositiveFloat | None = None
    """System power, MW."""
    reliability: Reliability = Field(default_factory=Reliability)
    """Failure rates of its parts and the restart time (default: the Llama 3 log)."""
    storage: Storage | None = None
    """The file system checkpoints go to; None: not in the catalog (each node writes at
    its injection bandwidth, nothing else limits it)."""
    facility: Facility = Field(default_factory=Facility)
    """Node and network power beside the accelerators, and the PUE (default: none)."""
    sources: dict[str, str] = Field(default_factory=dict)
    """Where each number comes from: field name → citation."""
    notes: str = ""
    """Caveats, in prose."""

    @model_validator(mode="after")
    def _torus_holds_the_nodes(self) -> System:
        if isinstance(self.network, Torus) and math.prod(self.network.dims) < self.nodes:
            raise ValueError(
                f"system {self.name!r}: network.dims {self.network.dims} hold "
                f"{math.prod(self.network.dims)} nodes, fewer than nodes={self.nodes}; "
                "enlarge the dimensions"
            )
        return self

    @model_validator(mode="after")
    def _library_channels_are_known(self) -> System:
        library = self.network.collectives
        if library is not None and library.per_channel and not self.node.collective_units:
            raise ValueError(
                f"system {self.name!r}: network.collectives {library.name!r} prices "
                "collectives per channel but node.collective_units is 0; give the node's "
                "channel count there"
            )
        return self

    @property
    def devices(self) -> int:
        """Accelerators in the whole system."""
        return self.nodes * self.node.devices_per_node
