"""The ring all-reduce of an MPI library on a CPU machine (``network.mpi``).

Open MPI's ring all-reduce (``ompi_coll_base_allreduce_intra_ring``, which Fujitsu MPI
keeps and its decision tree picks for small process counts) cuts the message of ``S``
bytes into ``n`` blocks and runs ``2(n − 1)`` steps: in each, every rank sends one block
to the next rank and receives one from the previous; in the first ``n − 1`` (the
reduce-scatter) the calling core then adds the received block into its own, in the last
``n − 1`` (the all-gather) it keeps it. The steps go in lockstep, so a step lasts as long
as its slowest transfer: the one that crosses to another node, over that node's one link
towards the next rank, or, on one node, the fabric. So

    t = 2(n − 1) · (α + (S/n) / B) + (n − 1) · 3 (S/n) / R

with ``α`` the library's per-message overhead (``network.mpi.step_overhead_us``; on one
node the fabric tier's latency), ``B`` one link's achieved bandwidth (one node: the fabric
per device) and ``R`` the reducing core's memory rate (``network.mpi.reduce_gbps``),
which the two reads and the write of each element share.
"""

from __future__ import annotations

from llmsim.costs.paths import INF, GroupPath
from llmsim.ops import Collective
from llmsim.specs.mpi import MpiCollectives


def runs_ring(mpi: MpiCollectives, collective: Collective, ranks: int, nbytes: float) -> bool:
    """Whether the library's rules give this call to its ring: an all-reduce among at most
    ``ring_max_ranks`` processes of at least ``ring_min_bytes_per_rank`` bytes per
    process (Fujitsu MPI's ``fjmpi-dectree.conf``: ``proc_count`` 0–32, ``msg_size /
    proc_count`` ≥ 8,192)."""
    return (collective == "all_reduce" and 1 < ranks <= mpi.ring_max_ranks
            and nbytes / ranks >= mpi.ring_min_bytes_per_rank)


def mpi_ring_s(nbytes: float, path: GroupPath, mpi: MpiCollectives) -> float:
    """Seconds of the library's ring all-reduce of ``nbytes`` on ``path`` (the module's
    formula), without the call's launch."""
    n = path.ranks
    block = nbytes / n
    if path.nodes > 1:
        link = path.link_bytes_per_s if path.link_bytes_per_s < INF else path.inter_bytes_per_s
        step_s = mpi.step_overhead_us * 1e-6 + block / link
    else:
        step_s = path.intra_latency_s + block / path.intra_bytes_per_s
    reduce_s = 3 * block / (mpi.reduce_gbps * 1e9)
    return 2 * (n - 1) * step_s + (n - 1) * reduce_s
