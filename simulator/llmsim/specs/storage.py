"""Storage spec: the file system a system writes its checkpoints to."""

from __future__ import annotations

from pydantic import PositiveFloat

from llmsim.specs._base import Name, Spec


class Storage(Spec):
    """The parallel file system (or object store) that holds checkpoints."""

    name: Name = ""
    """What it is: ``Orion (Lustre)``, ``DAOS`` ..."""
    write_gbps: PositiveFloat
    """Aggregate write bandwidth of the tier that large files land on, GB/s."""
    read_gbps: PositiveFloat
    """Aggregate read bandwidth of that tier, GB/s."""
    client_gbps_per_node: PositiveFloat | None = None
    """The most one node writes or reads, GB/s; None: its network injection bandwidth."""

    @property
    def write_bytes_per_s(self) -> float:
        """Aggregate write bandwidth, bytes/s."""
        return self.write_gbps * 1e9

    @property
    def read_bytes_per_s(self) -> float:
        """Aggregate read bandwidth, bytes/s."""
        return self.read_gbps * 1e9
