"""ABCI's GPT-4 job two ways: pipeline stages on node groups (the catalog's ``abci``
scenario) against data-parallel replicas on node groups (docs/heterogeneous.md).

Run: python benchmarks/abci_placements.py [--zero3]

Prints, for each placement, the layout, each replica's micro-batches (the throughput
balance within memory, :mod:`llmsim.hetero_replicas`), the step time, MFU and days to
3·10²⁵ FLOPs. The replica layouts keep the scenario's model, batch, precision and
recompute and use every device they can: tp 4 (a V node, half an A node), pp dividing the
120 layers, as many whole replicas of ``4·pp`` devices as each group holds. ``--zero3``
adds two ZeRO-3 layouts (some 5 minutes more on two cores).
"""

from __future__ import annotations

import sys
import time
from typing import Any

LAYOUTS: list[tuple[int, int, int, int]] = [(40, 6, 27, 2), (60, 4, 18, 2), (30, 8, 36, 2),
                                            (120, 2, 9, 2), (60, 4, 18, 1), (120, 2, 9, 1)]
"""(pp, A100 replicas, V100 replicas, ZeRO stage) of the replica placements."""
ZERO3: list[tuple[int, int, int, int]] = [(60, 4, 18, 3), (40, 6, 27, 3)]


def replicas_scenario(pp: int, a100: int, v100: int, zero: int) -> Any:
    """The ``abci`` scenario with ``a100`` + ``v100`` replicas of tp 4 · ``pp``."""
    from llmsim import loader

    raw = loader.read_yaml(loader.scenario_path("abci"))
    raw["placement"] = {"replicas": [{"group": "a100", "replicas": a100},
                                     {"group": "v100", "replicas": v100}]}
    raw["parallelism"] = {**raw["parallelism"], "pp": pp, "dp": a100 + v100, "zero": zero}
    return loader.load_scenario(raw)


def main(argv: list[str]) -> None:
    from llmsim import loader, simulate

    runs = [("stages (abci)", loader.load_scenario("abci"))]
    for pp, a100, v100, zero in LAYOUTS + (ZERO3 if "--zero3" in argv else []):
        runs.append((f"replicas tp 4 · pp {pp} · dp {a100} + {v100}, ZeRO-{zero}",
                     replicas_scenario(pp, a100, v100, zero)))
    for label, scenario in runs:
        started = time.process_time()
        result = simulate(scenario)
        split = getattr(result, "split", None)
        each = (f"{min(split)}–{max(split)}" if split else str(scenario.micro_batches))
        print(f"{label}: {scenario.devices:,} devices, micro-batches per replica {each}, "
              f"step {result.step_time_s:.1f} s, MFU {100 * result.mfu:.1f} %, "
              f"{result.days_to_train:,.0f} days, fits {result.fits} "
              f"({time.process_time() - started:.0f} s CPU)", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
