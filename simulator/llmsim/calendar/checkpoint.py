"""Checkpoint size, write and read time, and the interval between checkpoints.

Size: a checkpoint holds the weights and the optimizer state of every parameter once —
2 + 12 bytes per parameter with mixed-precision Adam, 4 + 8 in fp32
(:func:`llmsim.memory.state_bytes_per_param`; gradients are not saved). Replicas are
written once, spread over the data-parallel ranks (Megatron-Core's distributed
checkpoint with fully parallel save, PyTorch DCP's deduplication), so each device writes
1/dp of its pipeline stage's tensor-parallel shard whatever the ZeRO stage.

Time: the write moves the whole checkpoint through the file system's aggregate
bandwidth, and each node's share through that node's client bandwidth; the slower of the
two sets the time. Asynchronous checkpointing blocks training only for the copy of each
device's share to host memory.

Interval: Young (1974), τ = √(2δM), and Daly's higher-order optimum (Daly 2006, "A higher
order estimate of the optimum checkpoint interval for restart dumps", FGCS 22, eq. 37):
τ = √(2δM)·[1 + ⅓·√(δ/2M) + ⅑·(δ/2M)] − δ for δ < 2M, else τ = M, with δ the time
training stops for a checkpoint and M the job's mean time between failures.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llmsim.memory import stage_params, state_bytes_per_param
from llmsim.partition import stage_layers
from llmsim.specs import Model, Parallelism, System, Training


@dataclass(frozen=True)
class CheckpointCost:
    """What one checkpoint of a job weighs and costs."""

    total_bytes: float
    """The whole checkpoint (weights and optimizer state, each once), bytes."""
    per_device_bytes: float
    """The most any device writes, bytes."""
    write_s: float
    """Time to write it to the file system, seconds."""
    read_s: float
    """Time to read it back on a restart, seconds."""
    snapshot_s: float
    """Time to copy each device's share to host memory (asynchronous checkpoint), s."""
    storage: str
    """The file system, or how the bandwidth was bounded without one."""
    has_storage: bool
    """Whether the system gives its file system (otherwise only node injection bounds the
    times: optimistic)."""


def checkpoint_cost(model: Model, parallelism: Parallelism, training: Training, dp: int,
                    system: System, snapshot_gbps: float) -> CheckpointCost:
    """Size and time of one checkpoint of a job with this layout on ``system``, whose
    devices copy to host memory at ``snapshot_gbps`` GB/s (module docstring)."""
    par = parallelism
    weight_b, _, optim_b = state_bytes_per_param(training.precision)
    per_param = weight_b + optim_b
    layers = stage_layers(model.layers, par)
    shards = [stage_params(model, par.tp, par.pp, s, layers[s]) for s in range(par.pp)]
    total = per_param * par.tp * sum(shards)
    per_device = per_param * max(shards) / dp
    per_node = per_device * system.node.devices_per_node
    storage = system.storage
    client = (storage.client_gbps_per_node * 1e9 if storage and storage.client_gbps_per_node
              else system.node.injection_bytes_per_s)
    node_s = per_node / client
    if storage is None:
        write_s = read_s = node_s
        name = "not in the catalog: each node at its injection bandwidth"
    else:
        write_s = max(total / storage.write_bytes_per_s, node_s)
        read_s = max(total / storage.read_bytes_per_s, node_s)
        name = storage.name or "file system"
    snapshot_s = per_device / (snapshot_gbps * 1e9)
    return CheckpointCost(total, per_device, write_s, read_s, snapshot_s, name,
                          storage is not None)


def young_interval_s(checkpoint_s: float, mtbf_s: float) -> float:
    """Young's optimum compute time between checkpoints, √(2δM), seconds."""
    return math.sqrt(2.0 * checkpoint_s * mtbf_s)


def daly_interval_s(checkpoint_s: float, mtbf_s: float) -> float:
    """Daly's optimum compute time between checkpoints (2006, eq. 37), seconds; inf
    without failures."""
    if math.isinf(mtbf_s):
        return math.inf
    if checkpoint_s >= 2.0 * mtbf_s:
        return mtbf_s
    x = checkpoint_s / (2.0 * mtbf_s)
    return young_interval_s(checkpoint_s, mtbf_s) * (1 + math.sqrt(x) / 3 + x / 9) - checkpoint_s
