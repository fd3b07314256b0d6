"""An MPI library's all-reduce as its decision rules run it on a CPU machine.

An MPI library picks its collective algorithm from fixed rules on the process count and
the message size (Open MPI's ``coll/tuned`` decision functions; Fujitsu MPI's decision
tree, ``fjmpi-dectree.conf``), not the fastest the topology allows, and a CPU process
reduces each received block itself, on the calling core. ``network.mpi`` holds the rules
under which the library runs its all-reduce algorithms and the costs of a step the
topology does not give: the ring (:mod:`llmsim.costs.collectives.mpi_ring`), recursive
doubling (:mod:`llmsim.costs.collectives.mpi_doubling`) and, above the ring's process
count, Fujitsu's Trinaryx3 (:mod:`llmsim.costs.collectives.mpi_trinary`); which one a call
gets is :func:`llmsim.costs.collectives.mpi_rules.mpi_all_reduce_s`.
"""

from __future__ import annotations

from pydantic import Field, PositiveFloat, PositiveInt, model_validator

from llmsim.specs._base import Name, Spec


class MpiCollectives(Spec):
    """The all-reduce algorithms of an MPI library (Fujitsu MPI on Fugaku): when the
    library picks each and what a step costs beyond the link."""

    name: Name = ""
    """The library and the rules' version (Fujitsu MPI, tcsds ...)."""
    ring_max_ranks: PositiveInt
    """An all-reduce among at most this many processes runs the ring (above it the
    ``tree_*`` rules below), processes."""
    ring_min_bytes_per_rank: PositiveInt
    """... when the message is at least this many bytes per process (below it recursive
    doubling, where ``eager_overhead_us`` is given), bytes."""
    step_overhead_us: float = Field(ge=0)
    """A ring step's cost between nodes beyond its block's time on the link: the MPI
    library's per-message overhead of the rendezvous protocol the blocks travel in, hop
    included, microseconds."""
    reduce_gbps: PositiveFloat
    """Memory rate of the one core that reduces a received block into the local one (two
    reads and a write per element, all three counted), GB/s."""
    eager_overhead_us: float | None = Field(default=None, ge=0)
    """A message's cost between neighbouring nodes beyond its time on the link when it is
    at most ``eager_max_bytes`` (the eager protocol: no handshake), hop included,
    microseconds; also the cost of posting one segment of Trinaryx3. None: recursive
    doubling and Trinaryx3 are not modelled and those calls get llmsim's own algorithms."""
    eager_max_bytes: PositiveInt = 8192
    """Largest message that pays ``eager_overhead_us``; larger ones pay
    ``step_overhead_us`` (the rendezvous handshake), bytes."""
    tree_max_ranks: PositiveInt | None = None
    """Above ``ring_max_ranks`` and up to this many processes, an all-reduce runs
    recursive doubling up to ``doubling_max_bytes`` and Trinaryx3 above it (more processes:
    the library's other rules, not modelled), processes."""
    doubling_max_bytes: PositiveInt | None = None
    """Largest all-reduce that runs recursive doubling between ``ring_max_ranks`` and
    ``tree_max_ranks`` processes, bytes."""

    @model_validator(mode="after")
    def _tree_rules_come_together(self) -> MpiCollectives:
        """The Trinaryx3 rules need all three of their fields."""
        given = {"eager_overhead_us": self.eager_overhead_us,
                 "tree_max_ranks": self.tree_max_ranks,
                 "doubling_max_bytes": self.doubling_max_bytes}
        if self.tree_max_ranks is not None or self.doubling_max_bytes is not None:
            missing = [name for name, value in given.items() if value is None]
            if missing:
                raise ValueError(
                    f"network.mpi: {', '.join(missing)} is not set but the rules above "
                    f"ring_max_ranks need eager_overhead_us, tree_max_ranks and "
                    f"doubling_max_bytes together; give all three or none")
        if self.tree_max_ranks is not None and self.tree_max_ranks <= self.ring_max_ranks:
            raise ValueError(
                f"network.mpi.tree_max_ranks = {self.tree_max_ranks} is not above "
                f"ring_max_ranks = {self.ring_max_ranks}; give a larger process count")
        return self
