"""DeepEP's dispatch and combine kernels, priced at the rates DeepEP measured.

DeepEP (deepseek-ai/DeepEP, the V1 kernels DeepSeek-V3 trained with; their
measurements are in the repository's ``docs/legacy.md`` at commit dd758ca, first
published in its README at ebfe47e, 2025-02-24) times its kernels on H800 GPUs
(NVLink "~160 GB/s maximum", one 400 Gb/s ConnectX-7 InfiniBand NIC a GPU, "~50 GB/s
maximum") at DeepSeek-V3's shapes (hidden 7,168, top-8 experts, FP8 dispatch, BF16
combine) and reports a *bottleneck bandwidth*: the bytes its test counts over the
kernel's time. What the test counts (``tests/test_intranode.py``,
``test_internode.py``, ``test_low_latency.py`` at ebfe47e):

* **normal kernels, one node** (EP 8; 4,096 tokens a rank): the rows each rank
  receives, a token once per rank its experts are on, its own rank included
  (``recv_x.numel()``) — per token ``n·(1 − (1 − 1/n)^top_k)`` rows on ``n`` ranks;
* **normal kernels, several nodes** (EP 16, 32, 64 over 2, 4, 8 nodes; top-4 node
  groups, ``min(nodes, 4)``): the tokens sent to each node its experts are on, its own
  node included (``num_rdma_token_sent``) — the ``D·N/(N − 1)`` copies of a token whose
  ``D`` remote ones cross the network (:func:`llmsim.costs.alltoall.remote_nodes_per_token`);
* **low-latency kernels** (pure RDMA, 128 tokens a rank, EP 8 to 256): one row per
  token and expert (``num_selections``), the kernel's time including its latency.

Each kernel's time is then the bytes it counts over the rate it reached, scaled to the
machine's own links: the NVLink rates as a share of the H800's 160 GB/s (the fabric's
achieved rate per device, ``GroupPath.intra_bytes_per_s``), the RDMA rates as a share of
the NIC's 50 GB/s line rate (the node's injection per device). The price is never below
what the links themselves allow for the same traffic (:func:`llmsim.costs.alltoall.all_to_all_s`
with the forwarding dispatch), so a machine whose network is tapered keeps its taper.
Sizes between the measured ones take the rate of the nearest measured size below
(normal kernels; more than 8 nodes: EP 64's, DeepEP's V2 README expects "the kernel to
continue saturating hardware bandwidth at scale") or the rate interpolated in log2 of the
group size (low-latency kernels, ends held).

**HybridEP** (NVIDIA's kernels on DeepEP's ``hybrid-ep`` branch, Megatron-Core's flex
dispatcher ``hybridep`` backend): the same hierarchical path (a token over InfiniBand to
its peer GPU on each node its experts are on, then NVLink), counted the same way
(``count_rdma_send_from_routing_map`` in its ``tests/utils.py``: "to align with the
implementation in the DeepEP, we do not set the local node map to zeros"), measured on
H100 (``docs/README_Hybrid-EP.md`` at branch commit 94a9f8f, first in 7febc6e,
2026-02-09: 4,096 tokens, hidden 7,168, top 8, uniform random routing, the "Torch API"
figures, the kernels on 16 SMs as Megatron-Bridge's Qwen3 recipes run them). Its README
has no one-node H100 figure; on one node HybridEP takes the normal kernels' NVLink rates.

Measured rates (GB/s; dispatch, combine):

* normal, EP 8 (one node), NVLink: 153, 158;
* normal, EP 16 / 32 / 64, RDMA: 43 / 58 / 51, 43 / 57 / 50;
* low-latency, EP 8 / 16 / 32 / 64 / 128 / 256, RDMA: 98 / 63 / 48 / 43 / 39 / 39,
  127 / 74 / 53 / 46 / 39 / 40
* HybridEP on H100, 16 SMs, EP 16 / 32 / 64, RDMA: BF16 dispatch 54.47 / 47.36 / 41.24,
  combine 53.35 / 52.53 / 46.57 (FP8 dispatch 48.26 / 42.10 / 35.01, not used: llmsim's
  rows travel in BF16 unless DeepSeek's FP8 cache is on, and HybridEP is not DeepSeek's)

(low-latency latencies: dispatch 77 / 118 / 155 / 173 / 192 / 194 µs, combine 114 / 195
/ 273 / 314 / 369 / 360 µs for 128 tokens.) Not priced: the SMs the kernels hold
(``parallelism.moe_comm_units``) and their quantisation kernels; the bytes are the
rows llmsim sends (FP8 ones with ``training.fp8_activation_cache``, :mod:`llmsim.moe`).
"""

from __future__ import annotations

import itertools
import math
from typing import Literal

from llmsim.costs.paths import GroupPath

DeepEPKernels = Literal["normal", "low_latency", "hybridep"]

H800_NVLINK_BYTES_PER_S = 160e9
"""NVLink bandwidth of the H800 DeepEP measured on, per direction ("~160 GB/s NVLink
maximum bandwidth", DeepEP docs/legacy.md)."""
H800_NIC_BYTES_PER_S = 50e9
"""Line rate of the 400 Gb/s ConnectX-7 NIC each H800 had ("~50 GB/s maximum
bandwidth", DeepEP docs/legacy.md)."""

NORMAL_INTRANODE_BYTES_PER_S = (153e9, 158e9)
"""Normal kernels on one node (EP 8): dispatch and combine over NVLink, bytes/s."""
NORMAL_INTERNODE_BYTES_PER_S = {2: (43e9, 43e9), 4: (58e9, 57e9), 8: (51e9, 50e9)}
"""Normal kernels across nodes, by node count (EP 16, 32, 64 of 8 GPUs a node):
dispatch and combine over RDMA, bytes/s."""
LOW_LATENCY_BYTES_PER_S = {
    8: (98e9, 127e9), 16: (63e9, 74e9), 32: (48e9, 53e9),
    64: (43e9, 46e9), 128: (39e9, 39e9), 256: (39e9, 40e9),
}
"""Low-latency kernels by EP size: dispatch and combine over RDMA, bytes/s."""

HYBRIDEP_H100_BYTES_PER_S = {2: (54.47e9, 53.35e9), 4: (47.36e9, 52.53e9),
                             8: (41.24e9, 46.57e9)}
"""HybridEP across nodes on H100 (16 SMs, BF16 dispatch), by node count (EP 16, 32, 64):
dispatch and combine over RDMA, bytes/s."""

COMBINE_LIKE = frozenset({"moe_combine", "moe_dispatch_bwd"})
"""All-to-alls that run DeepEP's combine kernel: the forward combine and the dispatch's
backward (the gradients return the way the tokens came); the others run dispatch."""


def is_combine(name: str) -> bool:
    """Whether the all-to-all op ``name`` runs DeepEP's combine kernel."""
    return name in COMBINE_LIKE


def normal_internode_rate(nodes: int, combine: bool,
                          table: dict[int, tuple[float, float]] = NORMAL_INTERNODE_BYTES_PER_S,
                          ) -> float:
    """Measured RDMA rate of the normal (or HybridEP's, ``table``) kernels across
    ``nodes`` nodes: the nearest measured node count at or below, EP 64's beyond it,
    bytes/s."""
    measured = sorted(table)
    at = max([n for n in measured if n <= nodes], default=measured[0])
    return table[at][combine]


def low_latency_rate(ranks: int, combine: bool) -> float:
    """Measured RDMA rate of the low-latency kernels for ``ranks`` EP ranks, interpolated
    in log2 of the size between the measured ones (ends held), bytes/s."""
    sizes = sorted(LOW_LATENCY_BYTES_PER_S)
    x = min(max(math.log2(ranks), math.log2(sizes[0])), math.log2(sizes[-1]))
    for lo, hi in itertools.pairwise(sizes):
        if x <= math.log2(hi):
            f = (x - math.log2(lo)) / (math.log2(hi) - math.log2(lo))
            a, b = LOW_LATENCY_BYTES_PER_S[lo][combine], LOW_LATENCY_BYTES_PER_S[hi][combine]
            return a + f * (b - a)
    return LOW_LATENCY_BYTES_PER_S[sizes[-1]][combine]


def distinct_of(top_k: int, bins: int) -> float:
    """Expected number of ``bins`` holding at least one of ``top_k`` balls dropped
    uniformly (balanced routing): ``bins·(1 − (1 − 1/bins)^top_k)``."""
    return bins * (1.0 - (1.0 - 1.0 / bins) ** top_k)


def deepep_kernel_s(nbytes: float, path: GroupPath, top_k: int, kernels: DeepEPKernels,
                    combine: bool, nic_bytes_per_s: float,
                    remote_nodes: float) -> float:
    """Time of one DeepEP kernel moving a rank's ``nbytes`` of routed rows (``top_k`` a
    token) over ``path``, at DeepEP's measured rate for its size (module docstring),
    seconds. ``nic_bytes_per_s`` is the line rate of one device's way out of its node;
    ``remote_nodes`` the other nodes one token's experts are on (``D``). DeepEP's and
    HybridEP's NICs were both 400 Gb/s (50 GB/s) ConnectX-7s."""
    n, nodes = path.ranks, path.nodes
    if n <= 1 or nbytes <= 0:
        return 0.0
    nic_scale = nic_bytes_per_s / H800_NIC_BYTES_PER_S
    if kernels == "low_latency":
        return nbytes / (low_latency_rate(n, combine) * nic_scale)
    per_token = nbytes / top_k
    if nodes <= 1:
        rate = NORMAL_INTRANODE_BYTES_PER_S[combine] * (
            path.intra_bytes_per_s / H800_NVLINK_BYTES_PER_S)
        return path.intra_latency_s + per_token * distinct_of(top_k, n) / rate
    counted = per_token * remote_nodes * nodes / (nodes - 1)
    table = HYBRIDEP_H100_BYTES_PER_S if kernels == "hybridep" else NORMAL_INTERNODE_BYTES_PER_S
    return path.inter_latency_s + counted / (normal_internode_rate(nodes, combine, table)
                                             * nic_scale)
