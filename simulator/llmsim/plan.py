"""Plan: where every rank lives, and what each parallel group's traffic crosses.

Ranks are numbered with ``parallelism.rank_order``'s first axis innermost (Megatron's
default: tp, then cp, ep, dp, pp). Rank r sits on node r // devices_per_node.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from llmsim.specs import Dragonfly, FatTree, Parallelism, Scenario, System, Torus

AXES = ("tp", "cp", "ep", "dp", "pp")


@dataclass(frozen=True, slots=True)
class GroupPlacement:
    """How the members of one communicator of an axis are laid out on the machine.

    All groups of an axis have the same shape when degrees align with node sizes; when
    they do not, the placement describes the worst group (most nodes spanned).
    """

    axis: str
    """Parallel axis: tp, cp, ep, dp or pp, or ``stage`` (every rank of one pipeline
    stage: Megatron's tensor-and-data-parallel group)."""
    size: int
    """Ranks in the group."""
    stride: int
    """Rank distance between consecutive members."""
    members_per_node: int
    """Members of the group on one node (the most on any node)."""
    nodes_spanned: int
    """Distinct nodes holding members."""
    domains_spanned: int
    """Distinct leaf switches / dragonfly groups (fat-tree, dragonfly) holding members."""
    groups_per_node: int
    """Groups of this axis with members on one node: they share the node's NICs."""
    span_devices: int
    """Consecutive device slots inside a node that the intra-node part covers."""
    level: str
    """Widest network level the group's traffic crosses, in words."""
    first_rank: int = 0
    """Lowest rank of the group described (the worst one): the topology routes its
    members (:mod:`llmsim.costs.topology`)."""

    @property
    def crosses_nodes(self) -> bool:
        """Whether any traffic leaves a node."""
        return self.nodes_spanned > 1


@dataclass(frozen=True)
class Plan:
    """Rank layout of a job on ``nodes`` nodes of ``system``."""

    system: System
    nodes: int
    parallelism: Parallelism
    dp: int

    @classmethod
    def from_scenario(cls, scenario: Scenario) -> Plan:
        """The plan of a validated scenario."""
        return cls(scenario.system, scenario.nodes_used, scenario.parallelism, scenario.dp)

    @cached_property
    def memo(self) -> dict[tuple[object, ...], tuple[object, object]]:
        """Values worked out once per plan by the parts that route its groups: key (the
        caller's name, then its arguments) → (the spec object it depends on, the value).
        A topology's flow counts are asked for by the route of every axis that runs
        beside another, and each walks every group touching a leaf or dragonfly group."""
        return {}

    @cached_property
    def degrees(self) -> dict[str, int]:
        """Degree of each axis (dp resolved)."""
        p = self.parallelism
        return {"tp": p.tp, "cp": p.cp, "ep": p.ep, "dp": self.dp, "pp": p.pp}

    @property
    def devices(self) -> int:
        """Devices in the job."""
        return self.nodes * self.system.node.devices_per_node

    @cached_property
    def strides(self) -> dict[str, int]:
        """Rank distance between neighbours along each axis."""
        out, stride = {}, 1
        for axis in self.parallelism.rank_order:
            out[axis] = stride
            stride *= self.degrees[axis]
        return out

    def _sub_axes(self) -> dict[str, tuple[int, int]]:
        """(stride, degree) of the two parts of the TP axis when the routed experts' TP
        degree ``e`` (``parallelism.expert_tp``) lies between 1 and tp: ``etp``, the ``e``
        adjacent TP ranks that split an expert (Megatron-Core's expert-tensor-parallel
        group), and ``xtp``, the ``tp/e`` TP ranks ``e`` apart that hold different experts
        and so join the expert-parallel group (``xtp+ep``)."""
        e, t = self.parallelism.etp, self.parallelism.tp
        stride = self.strides["tp"]
        return {"etp": (stride, e), "xtp": (stride * e, t // e)}

    def _stride(self, axis: str) -> int:
        return self.strides[axis] if axis in self.strides else self._sub_axes()[axis][0]

    def _degree(self, axis: str) -> int:
        return self.degrees[axis] if axis in self.degrees else self._sub_axes()[axis][1]

    def _coord(self, rank: int, axis: str) -> int:
        """Coordinate of ``rank`` along an axis or a part of the TP axis."""
        return (rank // self._stride(axis)) % self._degree(axis)

    def rank(self, **coords: int) -> int:
        """Global rank of the given coordinates (missing axes are 0)."""
        return sum(coords.get(a, 0) * self.strides[a] for a in AXES)

    def coords(self, rank: int) -> dict[str, int]:
        """Coordinates of a global rank."""
        return {a: (rank // self.strides[a]) % self.degrees[a] for a in AXES}

    def location(self, rank: int) -> tuple[int, int]:
        """(node, device index inside the node) of a rank."""
        return divmod(rank, self.system.node.devices_per_node)

    def axes_of(self, axis: str) -> tuple[str, ...]:
        """The axes a group spans: ``stage`` all but pp, ``cp+dp`` cp and dp, ``tp`` tp."""
        if axis == "stage":
            return tuple(a for a in AXES if a != "pp")
        return tuple(axis.split("+"))

    def members(self, axis: str, rank: int = 0) -> list[int]:
        """Ranks of the ``axis`` group that contains ``rank`` (for ``stage``: every rank
        with its pipeline coordinate; for axes joined by ``+``: every rank that differs
        from ``rank`` only along them)."""
        if axis == "stage":
            base = self.rank(pp=self.coords(rank)["pp"])
            ranks = [base]
            for a in AXES:
                if a != "pp":
                    ranks = [r + j * self.strides[a] for r in ranks
                             for j in range(self.degrees[a])]
            return sorted(ranks)
        axes = self.axes_of(axis)
        if len(axes) > 1:
            ranks = [rank - sum(self._coord(rank, a) * self._stride(a) for a in axes)]
            for a in axes:
                ranks = [r + j * self._stride(a) for r in ranks
                         for j in range(self._degree(a))]
            return sorted(ranks)
        stride, size = self._stride(axis), self._degree(axis)
        base = rank - (rank // stride) % size * stride  # its coordinate along axis, dropped
        return [base + j * stride for j in range(size)]

    def group_first(self, axis: str, rank: int) -> int:
        """Lowest rank of the ``axis`` group that contains ``rank`` (the first of
        :meth:`members`, without listing them); given a numpy array of ranks, each one's,
        element by element."""
        axes = [a for a in AXES if a != "pp"] if axis == "stage" else self.axes_of(axis)
        return rank - sum(self._coord(rank, a) * self._stride(a) for a in axes)

    def _domain(self, node: int) -> int:
        net = self.system.network
        if isinstance(net, FatTree):
            return node // net.nodes_per_leaf
        if isinstance(net, Dragonfly):
            return net.group_of(node, self.nodes, self.system.nodes)
        return 0

    def _level(self, nodes: int, domains: int, span_devices: int) -> str:
        node = self.system.node
        net = self.system.network
        if nodes <= 1:
            if span_devices <= 1:
                return "none (one device)"
            return f"intra-node ({node.fabric_name or 'node fabric'})"
        if isinstance(net, FatTree):
            return "leaf switch" if domains <= 1 else "fat-tree spine"
        if isinstance(net, Dragonfly):
            return "dragonfly group" if domains <= 1 else "dragonfly global links"
        assert isinstance(net, Torus)
        return "torus links"

    def _first_rank_of_groups(self, axis: str, limit: int = 64) -> list[int]:
        """First rank of up to ``limit`` distinct groups of ``axis``."""
        if axis == "stage":
            return [self.rank(pp=s) for s in range(min(self.degrees["pp"], limit))]
        if "+" in axis:
            spanned = self.axes_of(axis)
            others = []
            for a in AXES:
                if a == "tp" and "xtp" in spanned:  # groups start at each expert-TP rank
                    a = "etp"
                if a not in spanned and self._degree(a) > 1:
                    others.append(a)
            firsts = [0]
            for a in others:
                firsts = [r + j * self._stride(a) for r in firsts
                          for j in range(self._degree(a))]
                if len(firsts) >= limit:
                    break
            return sorted(firsts)[:limit]
        stride, size = self._stride(axis), self._degree(axis)
        out, rank = [], 0
        while rank < self.devices and len(out) < limit:
            out.append(rank)
            rank += 1
            if (rank // stride) % size:  # inside a group already seen: jump past it
                rank += stride * (size - 1)
        return out

    def group_first_ranks(self, axis: str, limit: int = 64) -> list[int]:
        """Lowest rank of each of up to ``limit`` distinct groups of ``axis``."""
        return self._first_rank_of_groups(axis, limit)

    def placement(self, axis: str) -> GroupPlacement:
        """Placement of the worst group of ``axis``.

        A group whose ranks are evenly spaced (one axis, or axes nested in the rank
        order: ``stage``, ``cp+dp``) is measured in closed form
        (:meth:`_progression_shapes`), in time independent of its size; any other is
        enumerated rank by rank (:meth:`_enumerated_shape`). Worked out once per axis
        (:attr:`memo`): the cost model and the routes of the axes beside it ask again."""
        known = self.memo.get(("placement", axis))
        if known is not None:
            return known[1]  # type: ignore[return-value]
        progression = self._progression(axis)
        firsts = self._first_rank_of_groups(axis)
        if progression is not None:  # every group's shape at once
            size = progression[1]
            shapes = list(zip(*(a.tolist() for a in
                                self._progression_shapes(firsts, *progression)), strict=True))
        else:
            groups = [self.members(axis, first) for first in firsts]
            shapes = [self._enumerated_shape(members) for members in groups]
        # the first group of the largest (nodes, domains, span); its placement made once
        i = max(range(len(firsts)), key=lambda i: (shapes[i][0], shapes[i][1], shapes[i][3]))
        first, (nodes, domains, local, span) = firsts[i], shapes[i]
        if progression is None:
            size = len(groups[i])
        dpn = self.system.node.devices_per_node
        placement = GroupPlacement(
            axis=axis,
            size=size,
            stride=min(self._stride(a) for a in self.axes_of(axis)) if "+" in axis
            else self._stride(axis) if axis != "stage" else 1,
            members_per_node=local,
            nodes_spanned=nodes,
            domains_spanned=domains,
            groups_per_node=max(1, min(dpn, math.ceil(dpn / local))) if nodes > 1 else 1,
            span_devices=span,
            level=self._level(nodes, domains, span),
            first_rank=first,
        )
        self.memo[("placement", axis)] = (self, placement)
        return placement

    def _progression(self, axis: str) -> tuple[int, int] | None:
        """(stride, size) where every group of ``axis`` is the ranks ``first + j·stride``,
        ``j < size``: one axis, or axes each of whose stride is the one before's times its
        degree (``stage`` when pp is the outermost axis); None otherwise."""
        axes = sorted((a for a in self.axes_of(axis) if self._degree(a) > 1),
                      key=self._stride)
        if not axes:
            return 1, 1
        stride = size = None
        for a in axes:
            if stride is None:
                stride, size = self._stride(a), self._degree(a)
            elif self._stride(a) == stride * size:
                size *= self._degree(a)
            else:
                return None
        return stride, size

    def _enumerated_shape(self, members: list[int]) -> tuple[int, int, int, int]:
        """(nodes spanned, domains spanned, most members on a node, widest span of
        device slots on a node) of a group, from its ranks."""
        dpn = self.system.node.devices_per_node
        per_node: dict[int, list[int]] = {}
        for m in members:
            node, slot = divmod(m, dpn)
            per_node.setdefault(node, []).append(slot)
        return (len(per_node), len({self._domain(n) for n in per_node}),
                max(len(s) for s in per_node.values()),
                max(max(s) - min(s) + 1 for s in per_node.values()))

    def _progression_shapes(self, firsts: list[int], stride: int, size: int
                            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`_enumerated_shape` of the ranks ``first + j·stride``, ``j < size``, for
        each of ``firsts``, in closed form, as numpy arrays (nodes, domains, local, span).
        Consecutive members are ``stride`` apart: with ``stride`` at least a node's
        devices each is on a node of its own, else no node between the first's and the
        last's is skipped, and the members' slots on a node repeat with the node's index
        modulo ``stride`` — so the first node, ``stride`` nodes after it and the last node
        hold every per-node count and span there is."""
        dpn = self.system.node.devices_per_node
        first = np.asarray(firsts, dtype=np.int64)
        last = first + (size - 1) * stride
        first_node, last_node = first // dpn, last // dpn
        if stride >= dpn:
            nodes, local, span = (np.full(first.size, n, dtype=np.int64) for n in (size, 1, 1))
        else:
            nodes = last_node - first_node + 1
            # per group, the sampled nodes: first_node … min(last, first + stride + 1), last
            node = first_node[:, None] + np.arange(stride + 2)
            sampled = node <= np.minimum(last_node, first_node + stride + 1)[:, None]
            node = np.hstack([node, last_node[:, None]])
            sampled = np.hstack([sampled, np.ones((first.size, 1), dtype=bool)])
            f, t = first[:, None], last[:, None]
            lo = np.maximum(f, node * dpn)  # the node's first member
            lo += (f - lo) % stride
            hi = np.minimum(t, node * dpn + dpn - 1)
            hi -= (hi - f) % stride  # … and its last
            held = sampled & (hi >= lo)
            local = np.where(held, (hi - lo) // stride + 1, 0).max(axis=1)
            span = np.where(held, hi - lo + 1, 0).max(axis=1)
        per_domain = self._nodes_per_domain()
        net = self.system.network
        if per_domain is None:
            domains = np.ones(first.size, dtype=np.int64)
        elif isinstance(net, Dragonfly) and net.job_placement == "scattered":
            domains = np.array([self._scattered_groups(r, stride, size) for r in firsts],
                               dtype=np.int64)
        elif stride >= dpn * per_domain:
            domains = np.full(first.size, size, dtype=np.int64)
        else:
            domains = last_node // per_domain - first_node // per_domain + 1
        return nodes, domains, local, span

    def _scattered_groups(self, first: int, stride: int, size: int) -> int:
        """Dragonfly groups holding the ranks ``first + j·stride``, ``j < size``, of a job
        scattered round G groups (node i in group i mod G): consecutive nodes lie in
        ``min(nodes, G)`` groups; nodes ``s`` apart in ``G / gcd(s, G)`` at most."""
        assert isinstance(self.system.network, Dragonfly)
        dpn = self.system.node.devices_per_node
        groups = self.system.network.job_groups(self.nodes, self.system.nodes)
        if stride < dpn:
            return min((first + (size - 1) * stride) // dpn - first // dpn + 1, groups)
        if stride % dpn == 0:
            return min(size, groups // math.gcd(stride // dpn, groups))
        return len({(first + j * stride) // dpn % groups for j in range(size)})

    def _nodes_per_domain(self) -> int | None:
        """Nodes under one leaf switch / in one dragonfly group (None: one domain)."""
        net = self.system.network
        if isinstance(net, FatTree):
            return net.nodes_per_leaf
        if isinstance(net, Dragonfly):
            return net.nodes_per_group
        return None

    @cached_property
    def placements(self) -> dict[str, GroupPlacement]:
        """Placement of every axis with degree > 1 (and of tp, dp, pp always)."""
        return {
            a: self.placement(a) for a in AXES if self.degrees[a] > 1 or a in ("tp", "dp", "pp")
        }

    def describe(self) -> list[dict[str, object]]:
        """One row per axis: degree, stride, nodes spanned and the level crossed."""
        return [
            {
                "axis": a,
                "degree": g.size,
                "stride": g.stride,
                "members_per_node": g.members_per_node,
                "nodes_spanned": g.nodes_spanned,
                "level": g.level,
            }
            for a, g in self.placements.items()
        ]
