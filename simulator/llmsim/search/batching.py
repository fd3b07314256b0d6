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

from llmsim.search.layout import Layout

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
