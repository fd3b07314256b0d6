"""All-to-all cost model: each rank sends a different block to every other rank.

Mixture-of-experts layers dispatch their tokens to the experts and combine the results
with two all-to-alls over the expert-parallel group (Lepikhin et al. 2021, GShard §2.2;
Megatron-Core ``MoEAlltoAllTokenDispatcher``). Unlike a ring, an all-to-all cannot
keep its traffic on neighbour links: of a rank's buffer ``S`` (nccl-tests' size
convention for ``alltoall_perf``: ``S/n`` to each of the ``n`` ranks, itself included),
``S·(k−1)/n`` goes to the ``k − 1`` other members on its node over the fabric and
``S·(n−k)/n`` leaves the node. NCCL runs it as ``n`` concurrent send/recv pairs
(``ncclGroupStart``/``ncclSend``/``ncclRecv``, nccl-tests ``alltoall.cu``), so the two
parts move at once and the slower sets the time:

    t = max(α_intra + S·(k−1)/n / B_intra,  α_inter + k·S·(n−k)/n / B_node)

where ``B_intra`` is the fabric bandwidth per device and ``B_node`` what the group's
``k`` members on a node get of its network (the :class:`GroupPath`). What the topology
gives decides ``B_node``:

* fat-tree and dragonfly: full injection for peers in the same leaf switch / group, the
  tapered share (``1/oversubscription``, ``1/global_taper``) for the traffic that
  crosses to other leaves / groups — for a group spread evenly over ``D`` such domains
  that is ``(D − 1)/D`` of it; both parts share the NICs, so
  ``t_network = max(all / B_node, crossing / (B_node·fraction))``;
* torus: no switch, the traffic crosses the mesh. Uniform all-to-all among ``N`` nodes
  is bounded by the bisection (Dally & Towles 2004, *Principles and Practices of
  Interconnection Networks* §3.3): ``N²/4`` node pairs' messages each way over
  ``L`` links, so a node sends at most ``4·L·B_link/N``; a compact sub-block whose
  longest side ``d`` is shorter than the torus's dimension is a mesh there,
  ``L = N/d`` (``2N/d`` when it wraps around), giving ``4·B_link/d`` (``8·B_link/d``).

A launch (kernel) cost is added as for every collective.

DeepSeek's dispatch and combine (``parallelism.moe_dispatcher: deepep``; DeepSeek-V3
report §3.2.2, DeepEP) send a token across the network once per destination node, to
the GPU of the same index there, which forwards it over NVLink to the GPUs of its
experts; the combine runs the same path back, summing on the node before the network.
The network part then carries ``D`` copies of each token instead of its
``top_k·(n−k)/n`` rows that leave the node, ``D`` the expected number of other nodes
its experts are on (:func:`remote_nodes_per_token`), and the fabric part every routed
row that is not already on its expert's GPU, ``S·(k−1)/k`` (the rows that arrive over
the network are forwarded once more inside the node). That traffic is a floor: the
dispatcher's kernels are priced at the rates DeepEP measured (:mod:`llmsim.costs.deepep`),
and an all-to-all takes the longer of the two.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from llmsim.costs.collectives import INF, GroupPath, group_path
from llmsim.costs.deepep import DeepEPKernels, deepep_kernel_s, is_combine
from llmsim.plan import GroupPlacement, Plan
from llmsim.specs import Model, Parallelism, System, Torus


@dataclass(frozen=True)
class TokenDispatch:
    """A MoE layer's token all-to-alls forwarded DeepEP's way
    (``parallelism.moe_dispatcher: deepep``): the experts each token is routed to, and
    the nodes they may be on (``parallelism.moe_max_nodes``; None: any)."""

    top_k: int
    """Routed experts per token (``model.moe.top_k``)."""
    max_nodes: int | None = None
    """Node-limited routing's bound on the nodes of one token's experts."""
    kernels: DeepEPKernels | None = None
    """DeepEP's kernels whose measured rates price it (:mod:`llmsim.costs.deepep`);
    None: only the traffic on the links."""

    @classmethod
    def of(cls, model: Model, par: Parallelism) -> TokenDispatch | None:
        """The dispatch of a layout, None for a dense model or the plain all-to-all
        (Megatron-Core's or DeepSpeed's)."""
        if model.moe is None or par.moe_dispatcher in ("alltoall", "deepspeed"):
            return None
        kernels: DeepEPKernels = {"deepep_low_latency": "low_latency",
                                  "hybridep": "hybridep"}.get(par.moe_dispatcher, "normal")
        return cls(model.moe.top_k, par.moe_max_nodes, kernels)


def remote_nodes_per_token(top_k: int, nodes: int, max_nodes: int | None = None) -> float:
    """Expected number of nodes other than its own that one token's ``top_k`` experts are
    on, the experts spread over ``nodes`` nodes and each token limited to ``max_nodes``
    of them (node-limited routing; None: all).

    The token's experts fall on ``M = min(max_nodes, nodes)`` nodes, each of the
    ``top_k`` equally likely on any of them (balanced routing), so
    ``M·(1 − (1 − 1/M)^top_k)`` of them hold at least one (balls in bins); any node is
    the token's own with probability ``1/nodes``, leaving ``(nodes − 1)/nodes`` of them
    across the network. DeepSeek-V3 (top 8, 8 nodes, M = 4): 3.15 against 7 routed rows
    that leave the node without forwarding (4.59 without the node limit).
    """
    if nodes <= 1:
        return 0.0
    m = nodes if max_nodes is None else min(max_nodes, nodes)
    return m * (1.0 - (1.0 - 1.0 / m) ** top_k) * (nodes - 1) / nodes


def all_to_all_s(nbytes: float, path: GroupPath, crossing_share: float = 0.0,
                 crossing_bytes_per_s: float = INF,
                 dispatch: TokenDispatch | None = None) -> float:
    """Time of one all-to-all of ``nbytes`` per rank on ``path``, seconds (no launch).

    ``crossing_share`` of the traffic that leaves a node crosses a tapered level at
    ``crossing_bytes_per_s`` for the group's members on one node (see the module
    docstring); the rest moves at ``path.inter_bytes_per_s``. With a forwarding
    ``dispatch`` (DeepEP) the network carries each token to each of its other nodes once
    and the fabric forwards the rows that arrive (module docstring); DeepEP's
    low-latency kernels forward nothing (each row goes straight to its expert's GPU).
    """
    n, k, nodes = path.ranks, path.per_node, path.nodes
    if n <= 1 or nbytes <= 0:
        return 0.0
    forwarded = dispatch is not None and dispatch.kernels != "low_latency" and nodes > 1
    fabric_s = 0.0
    if k > 1:
        inside = nbytes * (k - 1) / k if forwarded else nbytes * (k - 1) / n
        fabric_s = path.intra_latency_s + inside / path.intra_bytes_per_s
    network_s = 0.0
    if nodes > 1:
        leaving = k * nbytes * (n - k) / n
        if forwarded:  # D copies of a token instead of its top_k·(n − k)/n rows
            assert dispatch is not None
            rows = dispatch.top_k * (n - k) / n
            leaving *= remote_nodes_per_token(dispatch.top_k, nodes, dispatch.max_nodes) / rows
        network_s = path.inter_latency_s + max(
            leaving / path.inter_bytes_per_s,
            leaving * crossing_share / crossing_bytes_per_s if crossing_share else 0.0)
    return max(fabric_s, network_s)


def torus_sub_block(torus: Torus, nodes: int) -> list[int]:
    """Sides of the most compact sub-block of ``torus`` holding ``nodes`` nodes: the
    shortest side grows first, each at most its dimension (of the job's shape where the
    user gives it, ``Torus.job_dims``)."""
    dims = torus.job_dims
    sides = [1] * len(dims)
    while math.prod(sides) < nodes:
        growable = [i for i, d in enumerate(dims) if sides[i] < d]
        if not growable:
            break
        i = min(growable, key=lambda j: sides[j])
        sides[i] += 1
    return sides


def torus_all_to_all_node_bytes_per_s(torus: Torus, nodes: int, injection_bytes_per_s: float,
                                      ) -> float:
    """Line rate at which one node of an all-to-all among ``nodes`` nodes of a torus can
    send: its injection, at most the bisection's share ``4·L·B_link/N`` of the
    sub-block (module docstring)."""
    if nodes <= 1:
        return injection_bytes_per_s
    sides = torus_sub_block(torus, nodes)
    longest = max(sides)
    dim = max(d for d, s in zip(torus.job_dims, sides, strict=True) if s == longest)
    links = (2 if longest == dim else 1) * nodes / longest
    bisection = 4.0 * links * torus.link_gbps_per_direction * 1e9 / nodes
    return min(injection_bytes_per_s, bisection)


class AllToAllModel:
    """Prices the all-to-alls of a plan on a system (memoised per axis and size)."""

    def __init__(self, system: System, plan: Plan, launch_s: float = 0.0,
                 dispatch: TokenDispatch | None = None) -> None:
        self.system, self.plan, self.launch_s = system, plan, launch_s
        self.dispatch = dispatch
        self._shapes: dict[str, tuple[GroupPath, float, float] | None] = {}
        self._cache: dict[tuple[str, float, bool], float] = {}
        self.nic_bytes_per_s = (system.node.injection_bytes_per_s
                                / system.node.devices_per_node)
        """Line rate of one device's way out of its node (DeepEP's RDMA rates scale
        with it)."""

    def _shape(self, axis: str) -> tuple[GroupPath, float, float] | None:
        """(path without taper, share of the network traffic that crosses a tapered
        level, bandwidth of the group's members on one node there)."""
        if axis not in self._shapes:
            placement = self.plan.placement(axis)
            self._shapes[axis] = (None if placement.size <= 1
                                  else self._shape_of(placement))
        return self._shapes[axis]

    def _shape_of(self, placement: GroupPlacement) -> tuple[GroupPath, float, float]:
        system, network = self.system, self.system.network
        path = group_path(system, placement)
        if isinstance(network, Torus) and placement.nodes_spanned > 1:
            node_bw = torus_all_to_all_node_bytes_per_s(
                network, placement.nodes_spanned, system.node.injection_bytes_per_s)
            share = min(1.0, placement.members_per_node / system.node.devices_per_node)
            return replace(path, inter_bytes_per_s=node_bw * network.efficiency * share), \
                0.0, INF
        domains = placement.domains_spanned
        if domains <= 1:
            return path, 0.0, INF
        # group_path tapers the whole group; only the crossing share pays the taper here.
        fraction = network.bandwidth_fraction(system.nodes, system.nodes)
        flat = replace(path, inter_bytes_per_s=path.inter_bytes_per_s / fraction,
                       link_bytes_per_s=path.link_bytes_per_s / fraction)
        return flat, (domains - 1) / domains, path.inter_bytes_per_s

    def comm_s(self, axis: str, nbytes: float, name: str = "") -> float:
        """Duration of an all-to-all ``name`` of ``nbytes`` per rank over ``axis``'s
        group, seconds (0 for a one-rank group or an empty buffer). With DeepEP's kernels
        the longer of the links' time and the kernel's at its measured rate (the name
        says whether it runs the dispatch or the combine kernel)."""
        combine = is_combine(name)
        key = (axis, nbytes, combine)
        if key not in self._cache:
            shape = self._shape(axis)
            if shape is None or nbytes <= 0:
                self._cache[key] = 0.0
            else:
                path, share, crossing = shape
                links_s = all_to_all_s(nbytes, path, share, crossing, self.dispatch)
                self._cache[key] = max(links_s, self._kernel_s(nbytes, path, combine)
                                       ) + self.launch_s
        return self._cache[key]

    def _kernel_s(self, nbytes: float, path: GroupPath, combine: bool) -> float:
        """DeepEP's kernel time at its measured rate (0 without DeepEP's kernels)."""
        d = self.dispatch
        if d is None or d.kernels is None:
            return 0.0
        return deepep_kernel_s(nbytes, path, d.top_k, d.kernels, combine,
                               self.nic_bytes_per_s,
                               remote_nodes_per_token(d.top_k, path.nodes, d.max_nodes))
