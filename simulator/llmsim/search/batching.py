"""The search's pricing batches: core layouts grouped by the schedule walk they share.

Much of a layout's price is built once per (schedule, pp, virtual stages, micro-batches
per step) and memoised by the worker that prices it: the in-flight counts of the memory
model (:mod:`llmsim.in_flight`), ZB-V's, Chimera's and DualPipe's compiled orders and
walks (:mod:`.zb_v_walk`, :mod:`.two_pipelines`), the ZeRO-3 cool-down shares. The
enumeration (:func:`.space.cores`) meets the same walk again and again (every tp and dp
of a pipeline depth), so batches cut from it in order made every worker build most walks
once or more (the bounded memos dropped them in between). Here a batch holds the core
layouts of one walk key only (at most :data:`MAX_BATCH_CORES`), so each walk is built by
one worker, once.

The batches are a pure function of the core layouts and ``bounded`` (the order
``--resume`` relies on): the same search gives the same batches.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from llmsim.search.layout import Layout
from llmsim.search.space import Branch, branch_layout, branch_slice

MAX_BATCH_CORES = 1024
"""Most core layouts per batch (a walk key with more is cut into several batches)."""


def walk_key(core: Layout) -> tuple[str, int, int, int]:
    """(schedule, pp, virtual stages, micro-batches per step): what the walks and
    in-flight counts of ``core``'s layouts are built from."""
    return (core.schedule, core.pp, core.virtual_stages,
            core.global_batch // (core.micro_batch * core.replicas))


def batches(cores: list[Layout], bounded: bool = False) -> list[list[Layout]]:
    """``cores`` cut into batches of one walk key each, in the enumeration's order within
    a batch. With ``bounded`` (the days bound, :mod:`.bound`) the batches go most devices
    first, as the bound needs (a batch then holds one device count too)."""
    groups: dict[tuple, list[Layout]] = {}
    for core in cores:
        key = walk_key(core)
        groups.setdefault((-core.devices, key) if bounded else key, []).append(core)
    ordered = sorted(groups.items(), key=lambda item: item[0]) if bounded \
        else list(groups.items())
    return [members[i:i + MAX_BATCH_CORES] for _, members in ordered
            for i in range(0, len(members), MAX_BATCH_CORES)]


@dataclass(frozen=True, slots=True)
class Cut:
    """A batch's core layouts as ranges of the space's branches (:func:`.space.branches`),
    made (:meth:`layouts`) where the batch is priced: a few integers to send to a worker
    in place of up to :data:`MAX_BATCH_CORES` layouts, and no layout made in the main
    process (selene-gpt3: 1.2 s of CPU to make its 409,701, 0.3 s to pickle them, before
    any worker started)."""

    ranges: tuple[tuple[int, int, int], ...]
    """(branch, first, end): the layouts ``first ≤ i < end`` of that branch's
    :func:`.space.branch_layouts`, in this order."""
    size: int
    """How many core layouts it holds."""
    pp: int
    """Their pipeline depth (a walk key holds it)."""
    devices: int
    """The most devices any of them uses."""

    def __len__(self) -> int:
        return self.size

    def layouts(self, branches: Sequence[Branch], fixed: Mapping[str, Any]) -> list[Layout]:
        """Its core layouts, those :func:`batches` puts in its batch."""
        return [core for b, first, end in self.ranges
                for core in branch_slice(branches[b], fixed, first, end)]


Part = list[Layout] | Cut
"""A batch's core layouts: made already (a sampled space, :mod:`.draw`), or a :class:`Cut`."""


def layouts_of(part: Part, branches: Sequence[Branch] | None,
               fixed: Mapping[str, Any]) -> list[Layout]:
    """``part``'s core layouts (a :class:`Cut`'s made from ``branches``)."""
    if isinstance(part, Cut):
        assert branches is not None, "a Cut is made from the space's branches"
        return part.layouts(branches, fixed)
    return part


def depth(part: Part) -> int:
    """The pipeline depth of a non-empty batch's layouts (one walk key: one depth)."""
    return part.pp if isinstance(part, Cut) else part[0].pp


def most_devices(part: Part) -> int:
    """The most devices any layout of the batch uses (1 if it is empty)."""
    if isinstance(part, Cut):
        return part.devices
    return max((core.devices for core in part), default=1)


def cuts(branches: Sequence[Branch], bounded: bool = False) -> list[Cut]:
    """:func:`batches` of the space ``branches`` hold (their :func:`.space.cores`), made
    from the branches alone: the same batches, layout for layout and in the same order
    (tested). A branch's layouts go plan by plan (:func:`.space.branch_layouts`), and a
    plan (schedule, virtual stages, micro-batch) of a branch fixes the walk key of each of
    its layouts, so the walk keys' first appearances and each key's members come out in
    the enumeration's order here as they do there."""
    groups: dict[tuple, list[list[int]]] = {}  # key → [branch, first, end, devices]
    for b, branch in enumerate(branches):
        per_plan = branch.size // len(branch.plans) if branch.plans else 0
        if not per_plan:
            continue
        devices = _devices(branch)
        replicas = branch.dp * branch.ep
        for p, (schedule, v, mb) in enumerate(branch.plans):
            key = (schedule, branch.pp, v, branch.gb // (mb * replicas))
            members = groups.setdefault((-devices, key) if bounded else key, [])
            if members and members[-1][0] == b and members[-1][2] == p * per_plan:
                members[-1][2] += per_plan
            else:
                members.append([b, p * per_plan, (p + 1) * per_plan, devices])
    ordered = sorted(groups.items(), key=lambda item: item[0]) if bounded \
        else list(groups.items())
    return [cut for (key, members) in ordered for cut in _cut(members, key[1][1] if bounded
                                                               else key[1])]


def _cut(members: list[list[int]], pp: int) -> Iterator[Cut]:
    """One walk key's ranges in batches of :data:`MAX_BATCH_CORES` layouts."""
    ranges: list[tuple[int, int, int]] = []
    size = devices = 0
    for b, first, end, most in members:
        while first < end:
            take = min(end - first, MAX_BATCH_CORES - size)
            ranges.append((b, first, first + take))
            size, devices, first = size + take, max(devices, most), first + take
            if size == MAX_BATCH_CORES:
                yield Cut(tuple(ranges), size, pp, devices)
                ranges, size, devices = [], 0, 0
    if size:
        yield Cut(tuple(ranges), size, pp, devices)


def widest(part: Part, branches: Sequence[Branch] | None,
           fixed: Mapping[str, Any]) -> list[Layout]:
    """Layouts whose most devices are ``part``'s (:func:`most_devices`): its own, or
    for a :class:`Cut` the first of a range that uses them, made alone."""
    if not isinstance(part, Cut):
        return part
    assert branches is not None, "a Cut is made from the space's branches"
    b, first, _ = next(r for r in part.ranges
                       if _devices(branches[r[0]]) == part.devices)
    return [branch_layout(branches[b], fixed, first)]


def _devices(branch: Branch) -> int:
    """Devices each layout of ``branch`` uses (:attr:`.layout.Layout.devices`)."""
    return branch.tp * branch.pp * branch.dp * branch.ep * branch.cp
