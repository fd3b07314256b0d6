"""Multi-dimensional ring collectives on a torus: one ring per dimension.

An all-reduce over a box of ``k_1 × … × k_d`` nodes reduce-scatters along the first
dimension (rings of k_1), then along the second on the 1/k_1 shard, and so on, and
all-gathers back in reverse (Mikami et al., "Massively Distributed SGD: ImageNet/ResNet-50
Training in a Flash", arXiv:1811.05233, 2-D torus all-reduce; Ying et al., "Image
Classification at Supercomputer Scale", arXiv:1811.06992, on TPU's 2-D torus). The bytes
a node sends telescope to those of one flat ring, ``2(n−1)/n · S``; run as d concurrent
instances on slices of the data, each starting at a different dimension, every
dimension's links carry traffic at once, so the volume moves at the links of all the
dimensions together, up to what the node's injection interfaces drive (Tofu-D: 6 TNIs
over 10 ports, Ajima et al., IEEE Cluster 2018). The latency is that of the rings along
each dimension, ``Σ steps(k_i) · α_i``, instead of ``steps(n) · α`` of one flat ring.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmsim.calibration import bus_factor
from llmsim.ops import Collective


@dataclass(frozen=True, slots=True)
class RingDimension:
    """One dimension of a torus a group's ring runs along, in SI units."""

    size: int
    """Members along the dimension."""
    bytes_per_s: float
    """Achieved bandwidth of the ring along it per direction (its links, after sharing)."""
    step_latency_s: float
    """Latency of one step of that ring (endpoint step cost plus its hops)."""


def ring_steps(collective: Collective, ranks: int) -> int:
    """Latency steps of a ring: 2(n−1) for all-reduce, n−1 for RS/AG."""
    return 2 * (ranks - 1) if collective == "all_reduce" else ranks - 1


def multidim_ring_s(collective: Collective, nbytes: float, ranks: int,
                    dims: tuple[RingDimension, ...], bytes_per_s: float) -> float:
    """Time of ``collective`` of ``nbytes`` over ``ranks`` members as one ring per
    dimension: ``f(n) · S / B + Σ_i steps(k_i) · α_i``, with ``f`` the ring's bus factor
    (2(n−1)/n all-reduce, (n−1)/n reduce-scatter and all-gather) and ``B`` the links of
    all dimensions driven at once (``bytes_per_s``)."""
    latency = sum(ring_steps(collective, d.size) * d.step_latency_s for d in dims)
    return bus_factor(collective, ranks) * nbytes / bytes_per_s + latency
