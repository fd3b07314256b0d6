"""Recursive doubling all-reduce of an MPI library on a CPU machine (``network.mpi``).

Open MPI's ``ompi_coll_base_allreduce_intra_recursivedoubling`` (which Fujitsu MPI keeps
and its decision tree picks for small messages; Thakur, Rabenseifner & Gropp,
"Optimization of Collective Communication Operations in MPICH", IJHPCA 19(1), 2005, §4.4):
with ``p'`` the largest power of two ≤ ``p`` and ``e = p − p'`` extra processes, the first
``2e`` ranks pair up (each even one sends its whole message to the odd one above it,
which adds it in and stands for both), then in ``log2 p'`` steps every remaining process
swaps its whole message with the one whose new rank differs in one bit, lowest bit first,
and adds the received one in; at the end each odd rank of the first ``2e`` sends the
result back. A step of ``S`` bytes between nodes ``h`` hops apart costs

    α(S) + (h − 1) · t_hop + h · S / B + 3 S / R

with ``α`` the library's per-message overhead (eager below ``network.mpi.eager_max_bytes``,
the rendezvous handshake above, each measured between neighbours: hop included),
``t_hop`` a hop's latency, ``B`` one link's achieved bandwidth and ``R`` the reducing
core's memory rate (two reads and a write per element). The ``h`` factor is the sharing
of the busiest link: every pair of the step swaps at once, and by dimension-order routing
a shift of ``h`` hops along a line puts ``h`` flows on each of its links (the rule
:mod:`llmsim.costs.topology.torus` applies to rings that are not boxes). A step between
two processes of one node runs on the fabric: its latency plus ``S`` over the fabric's
bandwidth plus the reduction. The step's ``h`` is its largest over the group's pairs.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from llmsim.costs.paths import INF, GroupPath
from llmsim.specs.mpi import MpiCollectives

Hops = Callable[[np.ndarray, np.ndarray], np.ndarray]
"""Hops between the nodes of each pair ``(a[i], b[i])`` (0 where both are one node)."""


def doubling_pairs(ranks: int) -> list[tuple[np.ndarray, np.ndarray, bool]]:
    """Open MPI's schedule for ``ranks`` processes: per step, the (sender, receiver) group
    indices of every transfer and whether the receiver reduces what it gets (the module's
    steps: the pairing of the extra ranks, ``log2 p'`` swaps, the result sent back)."""
    if ranks < 2:
        return []
    adjusted = 1 << (ranks.bit_length() - 1)
    extra = ranks - adjusted
    new = np.arange(adjusted)
    # the old rank that stands for each new rank: odd ranks below 2e, then the rest
    old = np.where(new < extra, 2 * new + 1, new + extra)
    steps = []
    if extra:
        evens = np.arange(0, 2 * extra, 2)
        steps.append((evens, evens + 1, True))
    distance = 1
    while distance < adjusted:
        steps.append((old, old[new ^ distance], True))
        distance <<= 1
    if extra:
        odds = np.arange(1, 2 * extra, 2)
        steps.append((odds, odds - 1, False))
    return steps


def doubling_hops(nodes: np.ndarray, hops: Hops) -> list[tuple[int, bool]]:
    """Per step of :func:`doubling_pairs` over a group whose members sit on ``nodes`` (in
    group order): the hops of its longest transfer (0: all inside nodes) and whether it
    reduces."""
    out = []
    for a, b, reduces in doubling_pairs(len(nodes)):
        out.append((int(hops(nodes[a], nodes[b]).max()), reduces))
    return out


def message_overhead_s(mpi: MpiCollectives, nbytes: float) -> float:
    """The library's per-message cost beyond the link (module docstring's ``α``): eager
    up to ``eager_max_bytes``, the rendezvous handshake above."""
    if mpi.eager_overhead_us is not None and nbytes <= mpi.eager_max_bytes:
        return mpi.eager_overhead_us * 1e-6
    return mpi.step_overhead_us * 1e-6


def doubling_s(nbytes: float, path: GroupPath, mpi: MpiCollectives,
               steps: list[tuple[int, bool]], hop_s: float) -> float:
    """Seconds of the library's recursive doubling all-reduce of ``nbytes`` on ``path``
    whose steps have the hops ``steps`` (:func:`doubling_hops`), a hop taking ``hop_s``,
    without the call's launch: the sum of the module's step costs."""
    link = path.link_bytes_per_s if path.link_bytes_per_s < INF else path.inter_bytes_per_s
    reduce_s = 3 * nbytes / (mpi.reduce_gbps * 1e9)
    alpha = message_overhead_s(mpi, nbytes)
    total = 0.0
    for hops, reduces in steps:
        if hops == 0:
            step = path.intra_latency_s + nbytes / path.intra_bytes_per_s
        else:
            step = alpha + (hops - 1) * hop_s + hops * nbytes / link
        total += step + (reduce_s if reduces else 0.0)
    return total

