"""The gradient all-reduce between the two weight replicas of a bidirectional pipeline.

Chimera (Li & Hoefler 2021 §3.1, §3.4) runs a down and an up pipeline on the same
devices: device ``s`` holds stage ``s`` of the down pipeline and stage ``p − 1 − s`` of
the up one, so each stage's weights have two replicas, on devices ``s`` and ``p − 1 − s``,
whose gradients are summed before the optimizer step (with data parallelism, over the
``2·dp`` replicas together). llmsim reduces each chunk's gradients over its data-parallel
group as for any schedule, then sums the two replicas' in a two-rank all-reduce between
the pair; with ZeRO-1/2 each rank exchanges only its shard.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import TYPE_CHECKING

import simpy

from llmsim.engine.devices import Device
from llmsim.trace import Record

if TYPE_CHECKING:
    from llmsim.engine.replay import Engine


def replica_grad_allreduce(engine: Engine, dev: Device) -> Iterator[simpy.Event]:
    """On a schedule with two pipelines (:attr:`Workload.pipelines`), wait for the device
    that holds the other replicas of ``dev``'s weights, then exchange the gradients
    (:meth:`Workload.replica_grad_exchange`), recorded on the ``dp`` stream as kind "O";
    nothing for one pipeline.

    A two-rank all-reduce moves each rank's ``S`` bytes once each way (a ring's
    2(n−1)/n·S at n = 2), so it is priced as one send of ``S`` bytes between the pair, on
    the pair's path (within a node when the two share one), as
    :attr:`Workload.embedding_grad_allreduce` is. It runs after the data-parallel
    reductions, not overlapped with the backward: Chimera's eager synchronisation of the
    stages that finish early (§3.4) is not modelled.
    """
    op = engine.work.replica_grad_exchange(dev.stage)
    if op is None:
        return
    mirror = engine.work.stages - 1 - dev.stage
    # dev.pipe: the same tensor- and data-parallel coordinates (one pipeline's devices).
    yield engine.barrier.arrive((dev.pipe, op.name, min(dev.stage, mirror)), 2)
    op = replace(op, within_node=engine._within_node(dev, mirror))
    start = engine.env.now
    yield engine.env.timeout(engine.pair_costs(dev.stage, mirror).comm_s(op))
    engine.records.append(Record(dev.id, dev.stage, "dp", op.name, "O", -1, -1, start,
                                 engine.env.now))
