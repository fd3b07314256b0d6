"""The simulated devices: one per pipeline stage (reduced fidelity) or every device."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Device:
    """A simulated device: its global id, stage and the peers it talks to."""

    id: int
    stage: int
    tp_group: tuple[object, int]
    dp_group: tuple[object, int]
    pipe: object
    """Key shared by the devices of one pipeline (same tp and dp coordinates)."""


def devices_for(fidelity: str, stages: int, tp: int, dp: int) -> list[Device]:
    """One device per stage (reduced) or every device (full)."""
    if fidelity == "reduced":
        return [Device(s, s, (("tp", s), 1), (("dp", s), 1), 0) for s in range(stages)]
    out = []
    for s in range(stages):
        for d in range(dp):
            for t in range(tp):
                out.append(Device(len(out), s, (("tp", s, d), tp), (("dp", s, t), dp), (t, d)))
    return out


def fold_identical_tp_ranks(devices: list[Device], stages: int,
                            node_of: Callable[[Device, int], int],
                            ) -> tuple[list[Device], dict[int, tuple[int, ...]]]:
    """Full fidelity with the tensor-parallel ranks of each (stage, data-parallel rank)
    folded into one simulated device where they are provably identical: (the devices to
    simulate, each one's id → the ids of the devices it stands for, its own first).

    A device's step depends on its stage, on which of its pipeline's stages share a node
    (a send within a node crosses its fabric, one between nodes the network) and on the
    collectives it waits for with its groups' members; the cost model prices each
    collective for its group, whoever runs it. So where every pipeline of one
    data-parallel rank (one per TP rank) places its stages on nodes alike — the same
    stages share a node — the TP ranks of each stage run the same step: their TP
    rendezvous ends when all arrive, at the time each arrives, and each data-parallel
    group of one TP rank waits for the same times as the others'. One device per TP group
    is simulated, alone in it; the others are listed as its replicas. Where some TP rank's
    pipeline differs, nothing is folded.
    """
    def pattern(dev: Device) -> tuple[int, ...]:
        nodes = [node_of(dev, s) for s in range(stages)]
        return tuple(nodes.index(n) for n in nodes)

    first: dict[object, tuple[int, ...]] = {}  # dp rank → its TP ranks' common pattern
    for dev in devices:
        if dev.stage:
            continue
        _, d = dev.pipe  # type: ignore[misc]
        if first.setdefault(d, pattern(dev)) != pattern(dev):
            return devices, {d.id: (d.id,) for d in devices}
    kept: list[Device] = []
    replicas: dict[int, list[int]] = {}
    rep_of: dict[object, int] = {}  # tp group key → the device standing for it
    for dev in devices:
        key = dev.tp_group[0]
        if key not in rep_of:
            rep_of[key] = dev.id
            kept.append(replace(dev, tp_group=(key, 1)))
        replicas.setdefault(rep_of[key], []).append(dev.id)
    return kept, {rep: tuple(ids) for rep, ids in replicas.items()}


def stage_devices(devices: list[Device]) -> dict[int, list[int]]:
    """Stage → the ids of its simulated devices."""
    out: dict[int, list[int]] = defaultdict(list)
    for d in devices:
        out[d.stage].append(d.id)
    return out
