"""The simulated devices: one per pipeline stage (reduced fidelity) or every device."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass


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



def stage_devices(devices: list[Device]) -> dict[int, list[int]]:
    """Stage → the ids of its simulated devices."""
    out: dict[int, list[int]] = defaultdict(list)
    for d in devices:
        out[d.stage].append(d.id)
    return out
