"""The job's box on the machine's torus, when the user gives no shape.

A job of N nodes that does not name its shape (``network.job_shape``) gets the box
:func:`job_shape` works out: the machine's dimensions filled from the last to the first,
each with the largest divisor of the nodes left that fits it (Fujitsu's job manager
allocates such boxes: Ajima et al., "The Tofu Interconnect D", IEEE Cluster 2018).
:class:`~llmsim.costs.topology.torus.TorusTopology` places and prices the job on it.
"""

from __future__ import annotations

import functools

__all__ = ["job_box", "job_shape"]


def job_shape(dims: list[int], nodes: int) -> list[int]:
    """The extent of a job of ``nodes`` nodes along each of ``dims`` (same order).

    Dimensions fill from the last to the first, each with the largest divisor of the
    nodes left that fits it. Nodes left over that no dimension divides (a prime larger
    than any dimension) widen the outermost dimensions with room, rounding up, so the box
    holds at least ``nodes``. Worked out once per (dims, nodes): the placement asks for
    it for every rank.
    """
    return list(job_box(tuple(dims), nodes))


@functools.lru_cache(maxsize=4096)
def job_box(dims: tuple[int, ...], nodes: int) -> tuple[int, ...]:
    """:func:`job_shape` as a tuple, memoised on (dims, nodes)."""
    shape = [1] * len(dims)
    left = nodes
    for i in reversed(range(len(dims))):
        fit = max(d for d in range(1, min(dims[i], left) + 1) if left % d == 0)
        shape[i], left = fit, left // fit
    for i in range(len(dims)):
        if left <= 1:
            break
        wider = min(dims[i], shape[i] * left)
        left = -(-left * shape[i] // wider)
        shape[i] = wider
    return tuple(shape)
