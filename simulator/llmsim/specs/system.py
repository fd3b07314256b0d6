"""System spec: a machine is a number of identical nodes on one network, or several
such node groups (ABCI's A100 nodes and V100 nodes) on one fabric."""

from __future__ import annotations

import math
import reprlib
from typing import Any

from pydantic import Field, PositiveFloat, PositiveInt, model_validator

from llmsim.specs._base import Name, Spec
from llmsim.specs.network import Network, Torus
from llmsim.specs.node import Node
from llmsim.specs.power import Facility
from llmsim.specs.reliability import Reliability
from llmsim.specs.storage import Storage


class System(Spec):
    """A supercomputer partition: node count, node design and network."""

    name: Name
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
    retention_state: bool = False
    """Whether the job lets an idle core drop to its retention state (Fugaku's power knob
    ``retention_state``, 1 by default for jobs of up to 9,216 nodes; each wake-up costs the
    accelerator's ``retention_wake_ms``, :mod:`llmsim.costs.retention`); False: cores stay
    ready (the knob at 0)."""
    sources: dict[str, str] = Field(default_factory=dict)
    """Where each number comes from: field name → citation."""
    notes: str = ""
    """Caveats, in prose."""
    groups: list[NodeGroup] = Field(default_factory=list)
    """The node groups of a heterogeneous machine, each a homogeneous system of its own
    (docs/heterogeneous.md); the first one's ``nodes``, ``node`` and ``network`` are the
    system's own, what a scenario without a ``placement`` runs on. Empty: one group, the
    system itself."""

    @model_validator(mode="before")
    @classmethod
    def _first_group_is_the_system(cls, data: Any) -> Any:
        """A system that lists groups and no node of its own is its first group's nodes."""
        groups = data.get("groups") if isinstance(data, dict) else None
        if groups is not None and not isinstance(groups, list):
            raise ValueError(f"system.groups = {reprlib.repr(groups)} is not a list; give a "
                             "list of node groups (docs/heterogeneous.md), or remove it")
        if isinstance(data, dict) and isinstance(data.get("groups"), list) and data["groups"] \
                and "node" not in data:
            first = data["groups"][0]
            inner = first.get("system") if isinstance(first, dict) else None
            if isinstance(inner, System):
                inner = inner.model_dump()
            if isinstance(inner, dict):
                data = dict(data)
                for key in ("nodes", "node", "network"):
                    if key in inner:
                        data.setdefault(key, inner[key])
        return data

    @model_validator(mode="after")
    def _groups_are_named_once(self) -> System:
        names = [g.name for g in self.groups]
        for g in self.groups:
            if g.system.groups:
                raise ValueError(
                    f"system {self.name!r}: group {g.name!r} has groups of its own; give it "
                    "a system of one node design"
                )
        if len(set(names)) != len(names):
            raise ValueError(
                f"system {self.name!r}: groups are named {names}; give each a different name"
            )
        first = self.groups[0].system if self.groups else self
        if (self.nodes, self.node, self.network) != (first.nodes, first.node, first.network):
            raise ValueError(
                f"system {self.name!r}: its nodes, node and network differ from its first "
                f"group's ({self.groups[0].name!r}); leave them out, a system of groups "
                "takes its first group's"
            )
        return self

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
        """Accelerators of the system's own (first) node group."""
        return self.nodes * self.node.devices_per_node

    @property
    def all_devices(self) -> int:
        """Accelerators in the whole system, every node group's."""
        if not self.groups:
            return self.devices
        return sum(g.system.devices for g in self.groups)

    def group(self, name: str) -> System:
        """The node group ``name`` as a system of its own (the whole system when it has no
        groups and ``name`` is its own name); raises ``ValueError`` naming the groups."""
        for g in self.groups:
            if g.name == name:
                return g.system
        if not self.groups and name == self.name:
            return self
        have = [g.name for g in self.groups] or [self.name]
        raise ValueError(f"no node group {name!r} in system {self.name!r}; use one of "
                         f"{', '.join(have)}")


class NodeGroup(Spec):
    """One node group of a heterogeneous system: nodes of one design on their own network,
    joined to the other groups' on a common fabric."""

    name: Name
    """How a scenario's ``placement`` names it, e.g. ``a100``."""
    system: System
    """Its nodes, node design and network (a catalog system name or inline)."""


System.model_rebuild()
