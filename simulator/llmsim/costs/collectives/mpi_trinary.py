"""Fujitsu MPI's Trinaryx3 all-reduce on a Tofu torus (``network.mpi``).

Fujitsu MPI's decision tree (``fjmpi-dectree.conf`` from a Fugaku node,
HLC-Lab/bine_trees_fugaku 0755a2eb) gives an all-reduce among 33–3,840 processes of more
than 96 KiB to ``trinaryx3`` with a segment size by message size (:data:`SEGMENTS`).
Trinaryx3 was designed for the K computer's Tofu torus (Matsumoto, Adachi, Sumimoto et
al., IPSJ SACSIS 2012, "Trinaryx3 ... utilizing multiple RDMA engines"; Adachi et al.,
"The design of ultra scalable MPI collective communication on the K computer", Computer
Science – R&D 28, 2013: long messages use several RDMA interfaces at once over
neighbour links only, so that no two transfers collide). What llmsim takes from that:
the message is cut in three, each third is reduced up and broadcast down its own
spanning tree of the job's nodes, the three trees on disjoint neighbour links (one RDMA
interface each), and each third flows through its tree in segments, pipelined. A round
moves one segment of ``s`` bytes along every tree edge at once; the node's one calling
core posts the three puts and adds in the three segments it receives, so a round takes

    t_round = 3 α + s / B + 3 · 3 s / R

(``α``: the library's eager per-message cost, ``B``: one link's achieved bandwidth,
``R``: the core's memory rate, two reads and a write per element; the transfers of a
round and the core's work run one after the other, a segment being added before it is
sent on). A node is taken to add one child's segment per tree and round: a spanning
tree of N nodes has N − 1 edges; where a tree branches a node adds more (not modelled).
The whole call is the ``⌈S / 3s⌉`` rounds of the data plus the ``2 D`` rounds of filling
the reduction up a tree of depth ``D`` and the broadcast down it,

    t = (⌈S / 3s⌉ + 2 D) · t_round,

with ``D`` the largest distance in hops from the group's middle member to another (a
tree rooted at the centre of a box of ``k_1 × … × k_d`` nodes: ``Σ ⌊k_i / 2⌋``). Several
processes on a node (how Fujitsu MPI's trees take them is not published) are taken to
reduce onto one over the node's fabric before the trees and get the result back after:
``⌈log2 k⌉`` steps each way, the reducing ones adding at ``R``.

The form (the core's work in series with the round's transfers) was chosen by this
module's author after seeing Fujitsu MPI's measured all-reduces on 64 Fugaku nodes
(``FUGAKU-BINE-C-AR64-*``, which it is checked against); its constants come from the
catalog's ping-pong, link and core rate, none from those measurements.
"""

from __future__ import annotations

import math

from llmsim.costs.paths import INF, GroupPath
from llmsim.specs.mpi import MpiCollectives

SEGMENTS: tuple[tuple[float, int], ...] = ((393216, 4096), (6291456, 16384), (math.inf, 65536))
"""Trinaryx3's segment size by message size: (largest message, segment), bytes
(``fjmpi-dectree.conf``, allreduce, 33–3,840 processes: ``trinaryx3(segsize=4096)`` for
98,305–393,216 bytes, ``16384`` up to 6,291,456, ``65536`` above)."""

TREES = 3
"""Spanning trees Trinaryx3 runs at once, one third of the message each (its ``x3``)."""


def segment_bytes(nbytes: float) -> int:
    """The segment Fujitsu MPI's rules give Trinaryx3 for a message of ``nbytes``."""
    return next(segment for largest, segment in SEGMENTS if nbytes <= largest)


def round_s(segment: int, path: GroupPath, mpi: MpiCollectives) -> float:
    """Seconds of one pipelined round (the module's ``t_round``)."""
    link = path.link_bytes_per_s if path.link_bytes_per_s < INF else path.inter_bytes_per_s
    alpha = (mpi.eager_overhead_us or 0.0) * 1e-6
    return TREES * alpha + segment / link + TREES * 3 * segment / (mpi.reduce_gbps * 1e9)


def on_node_s(nbytes: float, path: GroupPath, mpi: MpiCollectives) -> float:
    """Seconds of the reduction onto one process of a node before the trees and the
    broadcast back after (0 with one process a node)."""
    if path.per_node < 2:
        return 0.0
    steps = math.ceil(math.log2(path.per_node))
    move = path.intra_latency_s + nbytes / path.intra_bytes_per_s
    return steps * (move + 3 * nbytes / (mpi.reduce_gbps * 1e9)) + steps * move


def trinary_s(nbytes: float, path: GroupPath, mpi: MpiCollectives, depth: int) -> float:
    """Seconds of Trinaryx3's all-reduce of ``nbytes`` on ``path`` over trees of ``depth``
    hops (the module's ``t``, plus the processes of a node), without the call's launch."""
    segment = segment_bytes(nbytes)
    rounds = math.ceil(nbytes / (TREES * segment)) + 2 * depth
    return rounds * round_s(segment, path, mpi) + on_node_s(nbytes, path, mpi)
