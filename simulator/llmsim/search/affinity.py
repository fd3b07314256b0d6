"""Which worker prices which batch: batches that share their placements go to one worker.

A worker's estimator prices a placement (the plan and hardware costs of one
(nodes, tp, pp, dp, …): :meth:`~llmsim.search.parts.SharedParts.plan_costs`, its
collectives' paths, the gradient buckets and chunk extras that key on it) the first time
one of its batches meets it, and keeps it. The batches are cut by walk key
(:mod:`.batching`), and every placement of a pipeline depth recurs in the batches of
every schedule, virtual stage count and micro-batch count of that depth, so a pool that
hands out batches in order makes each worker price nearly every placement once (selene's
913 placements: 1,818 first pricings over two workers). Here the unit of work is an
*affinity group*, the batches of one pipeline depth (what a placement's key and a walk's
key both hold): a worker prices the batches of its group one after another, takes the
group with the most work (:func:`work`) nobody has started when its own is done, and
once none is left takes batches from the end of the group with the most left (the load
stays balanced; only those last batches' placements are priced twice).

With the days bound (:mod:`.bound`) the batches go most devices first: then a group is
the batches of one device count and depth, and the groups keep the devices' order.
"""

from __future__ import annotations

from collections import deque

from llmsim.search.batching import Part, depth, most_devices

Batch = tuple[int, Part]
"""A batch's index (its number in the store) and its core layouts (or their
:class:`~.batching.Cut`)."""


def affinity_key(part: Part) -> int:
    """The pipeline depth of a batch's layouts: every key a placement is memoised on holds
    it, and so does the walk key of a batch (all of its layouts share it)."""
    return depth(part)


def affinity_groups(batches: list[Batch], bounded: bool = False) -> list[list[Batch]]:
    """``batches`` (each of one walk key) grouped by :func:`affinity_key`, the groups
    most :func:`work` first (the first batch's index breaks ties), batches in index
    order within a group. With ``bounded`` a group also holds one device count, and the
    groups go most devices first (most work first within one count)."""
    groups: dict[tuple[int, int], list[Batch]] = {}
    for index, part in batches:
        if not len(part):
            continue
        devices = most_devices(part) if bounded else 0
        groups.setdefault((devices, affinity_key(part)), []).append((index, part))
    ordered = sorted(groups.items(), key=lambda item: (
        -item[0][0], -work(item[1]), item[1][0][0]))
    return [group for _, group in ordered]


def work(group: list[Batch]) -> int:
    """A group's pricing work, in layout-stages: its core layouts times their pipeline
    depth. The estimator's cost a layout grows with the depth (selene-gpt3's whole
    search, session s15, CPU a layout: 137 µs at pp 1, 214 at pp 4, 373 at pp 32, 2,629
    at pp 96, where the two-pipeline schedules' walks are long), so ordered by layouts
    alone the deepest group went last, and its batches of up to 1.9 s of CPU made the
    pool's tail (one worker pricing while the other had none). Ordered by this proxy
    the cheap shallow groups go last. The order changes no row."""
    return sum(len(part) for _, part in group) * affinity_key(group[0][1])


class Affinity:
    """Hands out batches to ``workers`` workers by affinity group (the module's rule):
    :meth:`next` gives worker ``w`` the next batch of its own group, else the first group
    not yet started, else the last batch of the group with the most batches left.
    Every batch is handed out exactly once."""

    def __init__(self, groups: list[list[Batch]], workers: int) -> None:
        self._unstarted = deque(groups)
        self._own: list[deque[Batch]] = [deque() for _ in range(workers)]
        self.left = sum(len(group) for group in groups)
        """Batches not yet handed out."""

    def next(self, worker: int) -> Batch | None:
        """The next batch for ``worker``, or None when every batch is handed out."""
        own = self._own[worker]
        if not own:
            if self._unstarted:
                own.extend(self._unstarted.popleft())
            else:
                own = max(self._own, key=len)
                if not own:
                    return None
                self.left -= 1
                return own.pop()
        self.left -= 1
        return own.popleft()


def static_owners(groups: list[list[Batch]], workers: int) -> list[int]:
    """Per group in order, the worker a static split gives it: each group to the worker
    with the fewest core layouts so far (for a scheduler that places work up front, as
    Dask's does; it then moves work between its workers itself)."""
    loads = [0] * workers
    out = []
    for group in groups:
        worker = loads.index(min(loads))
        loads[worker] += sum(len(cores) for _, cores in group)
        out.append(worker)
    return out
