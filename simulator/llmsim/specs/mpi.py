"""An MPI library's all-reduce as its decision rules run it on a CPU machine.

An MPI library picks its collective algorithm from fixed rules on the process count and
the message size (Open MPI's ``coll/tuned`` decision functions; Fujitsu MPI's decision
tree, ``fjmpi-dectree.conf``), not the fastest the topology allows, and a CPU process
reduces each received block itself, on the calling core. ``network.mpi`` holds the rule
under which the library runs its ring all-reduce and the two costs of a ring step the
topology does not give; :mod:`llmsim.costs.collectives.mpi_ring` prices it.
"""

from __future__ import annotations

from pydantic import Field, PositiveFloat, PositiveInt

from llmsim.specs._base import Spec


class MpiCollectives(Spec):
    """The ring all-reduce of an MPI library (Fujitsu MPI on Fugaku): when the library
    picks it and what a step costs beyond the link."""

    name: str = ""
    """The library and the rules' version (Fujitsu MPI, tcsds ...)."""
    ring_max_ranks: PositiveInt
    """An all-reduce among at most this many processes runs the ring (above it the
    library's other algorithms, not modelled here), processes."""
    ring_min_bytes_per_rank: PositiveInt
    """... when the message is at least this many bytes per process (below it recursive
    doubling), bytes."""
    step_overhead_us: float = Field(ge=0)
    """A ring step's cost between nodes beyond its block's time on the link: the MPI
    library's per-message overhead of the rendezvous protocol the blocks travel in, hop
    included, microseconds."""
    reduce_gbps: PositiveFloat
    """Memory rate of the one core that reduces a received block into the local one (two
    reads and a write per element, all three counted), GB/s."""
