"""The interface every network topology implements: the route of a group's traffic.

A :class:`Route` says, for the worst group of one parallel axis (its
:class:`~llmsim.plan.GroupPlacement`), what its traffic between nodes crosses: the widest
level, the hops of one algorithm step, and the share of its line rate it keeps when every
group of its axis runs at once and their ring flows share links (contention). On a torus
it also lists the dimensions the group runs along, so a collective can build one ring per
dimension (:mod:`llmsim.costs.topology.torus`). Collective algorithms price over this
interface, whatever the network kind (design §13; the split of ASTRA-sim's network API
from its collective algorithms).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from llmsim.plan import GroupPlacement, Plan
from llmsim.specs import Parallelism


@dataclass(frozen=True, slots=True)
class TorusDimension:
    """One dimension of a torus along which a group's members lie."""

    name: str
    """The dimension's label (X, Y, Z, a, b, c on Tofu-D, or its index)."""
    size: int
    """Members of the group along it."""
    wraps: bool
    """Whether the members close a ring over wrap-around links (the job holds the whole
    dimension, of 3 or more nodes); otherwise they lie on a line (mesh)."""

    @property
    def links(self) -> int:
        """Links per direction a node drives for a ring along this dimension: two on a
        closed ring (one ring each way), one on a line, where a ring runs out and back and
        each direction of each link carries it once."""
        return 2 if self.wraps else 1

    @property
    def hops(self) -> int:
        """Hops of the ring's longest step: one on a closed ring or a pair, two on a line
        of three or more (the ring visits every other node out and the rest back)."""
        return 1 if self.wraps or self.size <= 2 else 2


@dataclass(frozen=True, slots=True)
class Route:
    """What one group's traffic between nodes crosses on a topology."""

    level: str
    """Widest network level crossed, in words (``leaf switch``, ``fat-tree spine`` ...)."""
    hops: int
    """Switch or link traversals of one algorithm step between two nodes of the group."""
    bandwidth_fraction: float
    """Share (0, 1] of the group's line rate it keeps when every group of its axis runs
    at once: the busiest shared link's capacity over the flows on it, at most 1."""
    ring_links: int = 1
    """Links per direction a node drives for the group's ring: 1 behind a NIC, 1 or 2 on
    a torus (:attr:`TorusDimension.links`)."""
    dims: tuple[TorusDimension, ...] = ()
    """Torus dimensions the group spans, innermost first (empty off a torus, or where its
    members do not form a box of the job's torus)."""
    detail: str = ""
    """The placement in words, for ``llmsim run`` (leaves or groups spanned, flows on the
    busiest link, the ring's hops)."""


class Topology(Protocol):
    """A network kind's view of where groups' traffic goes."""

    def route(self, plan: Plan, placement: GroupPlacement) -> Route:
        """The route of the worst group of ``placement.axis`` in ``plan``."""
        ...


def shared_share(capacity_bytes_per_s: float, flows: float, flow_bytes_per_s: float) -> float:
    """Share of its own rate each of ``flows`` equal flows keeps on a link of
    ``capacity_bytes_per_s``: ``min(1, capacity / (flows · rate))``. Max-min fair sharing
    of one bottleneck link (Bertsekas & Gallager, *Data Networks*, 2nd ed., §6.5.2):
    two flows that each would fill the link get half of it each."""
    demand = flows * flow_bytes_per_s
    if demand <= 0:
        return 1.0
    return min(1.0, capacity_bytes_per_s / demand)


def ring_edges(nodes: list[int], closed: bool = True) -> list[tuple[int, int]]:
    """The node-to-node steps of a ring through ``nodes`` in order (members on one node
    are consecutive and give no step; NCCL threads a node's members before leaving it);
    ``closed=False`` for a chain (the pipeline's stages), without the step back."""
    distinct = [n for i, n in enumerate(nodes) if i == 0 or n != nodes[i - 1]]
    if len(distinct) > 1 and distinct[0] == distinct[-1]:
        distinct.pop()
    if len(distinct) < 2:
        return []
    steps = len(distinct) if closed else len(distinct) - 1
    return [(distinct[i], distinct[(i + 1) % len(distinct)]) for i in range(steps)]


def is_alltoall(axis: str) -> bool:
    """Whether the groups of ``axis`` send all to all (expert parallelism's token
    dispatch and combine), not along a ring: each member sends ``1/(n − 1)`` of its data to
    every other member."""
    return axis == "ep"


def alltoall_leaving(plan: Plan, axis: str, nodes: Iterable[int],
                     domain_of: Callable[[int], int]) -> Counter[int]:
    """The all-to-all traffic of every group of ``axis`` with a member on ``nodes`` that
    leaves those nodes' domain (leaf switch, dragonfly group), in flows at a member's full
    rate, by the domain it goes to: each member on ``nodes`` sends ``1/(n − 1)`` of its
    rate to each of the group's other members, and what goes to a member in another
    domain leaves (the pattern of :func:`is_alltoall`)."""
    dpn = plan.system.node.devices_per_node
    mine = set(nodes)
    home = {domain_of(n) for n in mine}
    out: Counter[int] = Counter()
    for group in groups_touching(plan, axis, mine):
        if len(group) < 2:
            continue
        where = Counter(domain_of(r // dpn) for r in group)
        senders = sum(1 for r in group if r // dpn in mine)
        for domain, members in where.items():
            if domain not in home:
                out[domain] += senders * members / (len(group) - 1)
    return out


def is_chain(axis: str) -> bool:
    """Whether the groups of ``axis`` send along a chain, not a ring: the pipeline's
    stages pass activations forward and gradients back, with no step from last to first."""
    return axis == "pp"


def groups_touching(plan: Plan, axis: str, nodes: Iterable[int]) -> list[list[int]]:
    """Every group of ``axis`` with a member on one of ``nodes``, each as its ranks."""
    dpn = plan.system.node.devices_per_node
    seen: set[int] = set()
    out = []
    for node in nodes:
        for rank in range(node * dpn, min((node + 1) * dpn, plan.devices)):
            first = plan.group_first(axis, rank)
            if first not in seen:  # listed once, not once per member on these nodes
                seen.add(first)
                out.append(plan.members(axis, first))
    return out


def rank_steps(plan: Plan, group: list[int], chain: bool = False) -> list[tuple[int, int]]:
    """The ring (or chain) steps of ``group`` between nodes, as (from rank, to rank)."""
    dpn = plan.system.node.devices_per_node
    first_on = {}
    last_on = {}
    for r in group:
        first_on.setdefault(r // dpn, r)
        last_on[r // dpn] = r
    return [(last_on[a], first_on[b])
            for a, b in ring_edges([r // dpn for r in group], closed=not chain)]


def concurrent_axes(parallelism: Parallelism, axis: str) -> tuple[str, ...]:
    """The other axes whose traffic runs while ``axis``'s does, by the schedule's switches.

    The gradient reduction overlapped with the backward (``overlap_dp_comm``) runs while
    the backward's TP collectives, context-parallel ring passes (the attention's keys and
    values, Megatron's ring attention), expert all-to-alls and pipeline sends do; pipeline
    sends overlapped with compute (``overlap_pp_comm``) run while the TP collectives, ring
    passes and all-to-alls of the next pass do. With neither switch the axes' transfers
    take turns with the compute that waits for them, and share no link in time. TP, CP
    and EP transfers of one layer come one after another (the TP collectives around the
    attention and the MLP, the ring passes inside the attention, the all-to-alls around
    the experts), so they are not taken to run at once.
    """
    dp, pp = parallelism.overlap_dp_comm, parallelism.overlap_pp_comm
    pairs = {("dp", "tp"): dp, ("dp", "pp"): dp, ("pp", "tp"): pp,
             ("cp", "dp"): dp, ("dp", "ep"): dp, ("cp", "pp"): pp, ("ep", "pp"): pp}
    out = [b if a == axis else a for (a, b), on in pairs.items() if on and axis in (a, b)]
    return tuple(out)
