"""What each stated or chosen setting of DeepSeek-V3's run is worth: the ``deepseek-v3``
scenario (or, with ``row``, validation row DSV3-01's scenario) with one setting changed
at a time, its step, the busiest stage's all-to-all and bubble, the peak memory and MFU
(docs/moe.md, "DeepSeek-V3 as it ran").

Run: python benchmarks/deepseek_v3_settings.py [row]   (about 20 s on 2 cores)
"""

from __future__ import annotations

import sys
from typing import Any

import llmsim
from llmsim import validation

VARIANTS: list[tuple[str, dict[str, Any], dict[str, Any], dict[str, Any]]] = [
    ("as stated", {}, {}, {}),
    ("1F1B, per-pass all-to-all overlap, no SMs held, no memory savings (before DualPipe)",
     {"schedule": "1f1b", "moe_comm_units": 0, "recompute_norms_and_up_proj": False},
     {"fp8_activation_cache": False}, {}),
    ("1F1B with the memory savings", {"schedule": "1f1b", "moe_comm_units": 0}, {}, {}),
    ("DualPipe, no all-to-all overlap", {"moe_a2a_overlap": False, "moe_comm_units": 0}, {},
     {}),
    ("DualPipe, pairs overlapped, no SMs held", {"moe_comm_units": 0}, {}, {}),
    ("no memory savings", {"recompute_norms_and_up_proj": False},
     {"fp8_activation_cache": False}, {}),
    ("no node limit (moe_max_nodes: null)", {"moe_max_nodes": None}, {}, {}),
    ("NCCL all-to-all (moe_dispatcher: alltoall)", {"moe_dispatcher": "alltoall"}, {}, {}),
    ("DeepEP's low-latency kernels (moe_dispatcher: deepep_low_latency)",
     {"moe_dispatcher": "deepep_low_latency"}, {}, {}),
    ("no MTP module (mtp_depth 0)", {}, {}, {"mtp_depth": 0}),
]
"""(what changes, parallelism, training and model fields set)."""


def changed(scenario: llmsim.Scenario, par: dict[str, Any], trn: dict[str, Any],
            mdl: dict[str, Any]) -> llmsim.Scenario:
    """``scenario`` with the fields set, validated again."""
    raw = scenario.model_dump()
    for part, update in (("parallelism", par), ("training", trn), ("model", mdl)):
        raw[part] = {**raw[part], **update}
    return type(scenario).model_validate(raw)


def main(which: str = "scenario") -> None:
    if which == "row":
        run = next(r for r in validation.load_runs() if r.id == "DSV3-01")
        base = validation.scenario_for(run)
    else:
        base = llmsim.load_scenario("deepseek-v3")
    print("| setting | step s | all-to-all s | bubble s | peak GB | MFU % |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, par, trn, mdl in VARIANTS:
        r = llmsim.simulate(changed(base, par, trn, mdl))
        peak_gb = max(m.total_bytes for m in r.memory) / 1e9
        b = r.breakdown_s
        print(f"| {name} | {r.step_time_s:.3f} | {b['ep_all_to_all']:.2f} | "
              f"{b['bubble']:.2f} | {peak_gb:.1f} | {100 * r.mfu:.1f} |", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:2])
