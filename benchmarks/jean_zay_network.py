"""Jean Zay's Omni-Path as BigScience measured it, and two checks of it against the runs
(docs/validation.md section 6, "Round nine").

1. The measurement: ``all_reduce_bench.py`` on 4 A100 nodes (bigscience-workshop/bigscience,
   ``experiments/bandwidth/all_reduce_bench-a100-n4.txt``): 4 GB of FP32 over 32 ranks,
   bus bandwidth 40.5-40.8 Gb/s in every trial after the first, each node's ring entering
   on one HFI and leaving on another, so 40.8 of one HFI's 100 Gb/s: the catalog's
   ``network.efficiency`` 0.408 of ``jean-zay-a100``.
2. A check that was not used to set it: the prequel's 200B runs (``chronicles-prequel.md``,
   "Best TFLOPs", 2022-02-17) on 10 nodes at DP 1 and 20 nodes at DP 2 (TP 8, PP 10,
   80 layers, hidden 14,400, 96 heads, 250k vocabulary, GBS 2,048, MBS 1). Half the DP-1
   step is the DP-2 step without its gradient all-reduce (and half a bubble): the measured
   excess is 434.14 - 853.81 / 2 = 7.24 s (bf16), 430.21 - 844.81 / 2 = 7.80 s (fp16).
3. The three BLOOM rows' step parts at the old prior (0.9) and the measured rate.

Run: python benchmarks/jean_zay_network.py   (about 30 s on 2 cores)
"""

from __future__ import annotations

import copy
from typing import Any

from llmsim import catalog, load_scenario, simulate, validation
from llmsim.loader import read_yaml

BUS_GBPS = 40.8
"""The benchmark's bus bandwidth in its timed trials after the first (40.49-40.83 Gb/s)."""
HFI_GBPS = 100.0
"""One Omni-Path HFI's line rate per direction (BLOOM paper Sec. 3.5.1)."""
PREQUEL_EXCESS_S = {"bf16": 434.14 - 853.81 / 2, "fp16": 430.21 - 844.81 / 2}
"""DP-2 step minus half the DP-1 step, from the prequel's two log lines of each dtype."""
PRIOR = 0.9
"""The catalog's unverified prior before the measurement was read this way."""


def system_at(efficiency: float) -> dict[str, Any]:
    """jean-zay-a100 as an inline system with ``network.efficiency`` set."""
    raw = read_yaml(catalog.path_of("systems", "jean-zay-a100"))
    raw["network"]["efficiency"] = efficiency
    return raw


def prequel_step_s(efficiency: float, dp: int) -> float:
    """The prequel's 200B model on 10·dp nodes, bf16, as BLOOM-01's software ran it."""
    mapping = copy.deepcopy(validation.scenario_mapping(validation.load_runs("BLOOM-01")[0]))
    mapping.update(name=f"prequel-200b-dp{dp}", system=system_at(efficiency), nodes=10 * dp)
    mapping["model"].update(layers=80, hidden=14_400, heads=96, kv_heads=96,
                            ffn_hidden=4 * 14_400, vocab=250_880)
    par = mapping["parallelism"]
    par.update(tp=8, pp=10, dp=dp, micro_batch=1)
    par.pop("first_stage_layers"), par.pop("last_stage_layers")
    mapping["training"]["global_batch"] = 2048
    return simulate(load_scenario(mapping)).step_time_s


def bloom_rows(efficiency: float) -> list[tuple[str, float, dict[str, float]]]:
    """Each BLOOM row's error and step parts with ``network.efficiency`` set."""
    rows = []
    for run in validation.load_runs("BLOOM"):
        mapping = validation.scenario_mapping(run)
        mapping["system"] = system_at(efficiency)
        result = simulate(load_scenario(mapping))
        predicted = validation.predicted_metric(run, result)
        rows.append((run.id, (predicted / run.measured - 1) * 100, result.breakdown_s))
    return rows


def main() -> None:
    measured = BUS_GBPS / HFI_GBPS
    print(f"measured per-HFI rate: {BUS_GBPS} / {HFI_GBPS} Gb/s = {measured:.3f}")
    for efficiency in (PRIOR, measured):
        excess = prequel_step_s(efficiency, 2) - prequel_step_s(efficiency, 1) / 2
        print(f"efficiency {efficiency:.3f}: prequel DP-2 step - DP-1 step / 2 = {excess:.2f} s"
              f" (measured {PREQUEL_EXCESS_S['bf16']:.2f} s bf16,"
              f" {PREQUEL_EXCESS_S['fp16']:.2f} s fp16)")
        for row_id, error_pct, parts in bloom_rows(efficiency):
            shown = ", ".join(f"{k} {v:.2f}" for k, v in parts.items() if v)
            print(f"  {row_id}: {error_pct:+.1f} %  ({shown} s)")


if __name__ == "__main__":
    main()
