"""The tables of this folder's README: each case's measured times (run1.txt, run2.txt)
beside llmsim's, priced afresh, and each profiled MoE layer's kernel time by part beside
llmsim's per-layer ops by part.

Run from the repository root: ``python benchmarks/results/h100-2026-11-27-moe-layers/compare.py``.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
import time_layers  # noqa: E402
import time_layers_moe  # noqa: E402

from llmsim.specs import Scenario  # noqa: E402

PROFILES = {  # file: the profiled case's arguments
    "profile_moe02_ep16_scatter.csv": "MBRIDGE-2604-MOE-02 --ep 16 --layers 4",
    "profile_moe02_ep16_gather.csv": "MBRIDGE-2604-MOE-02 --ep 16 --layers 4",
    "profile_moe02_ep1_scatter.csv": "MBRIDGE-2604-MOE-02 --ep 1 --layers 2",
    "profile_mixtral_ep1_gather.csv": "MBRIDGE-2604-MOE-02 --ep 1 --layers 2 --set "
    "model=mixtral-8x7b --set parallelism.ep=1 --set parallelism.dp=16",
}


def cases() -> list[tuple[str, list[str], float, float]]:
    """(run, arguments, measured forward ms, measured forward + backward ms) of each case."""
    found = []
    for run in ("run1", "run2"):
        args: list[str] = []
        times: list[float] = []
        for line in (HERE / f"{run}.txt").read_text().splitlines():
            if line.startswith("== ") and not line.startswith("== end"):
                args, times = shlex.split(line)[2:], []
            elif line.startswith(("forward ", "forward+backward ")):
                times.append(float(line.split()[1]))
                if len(times) == 2:
                    found.append((run, args, times[0], times[1]))
    return found


def scenario_of(args: list[str]) -> tuple[Scenario, int]:
    """The single-device scenario llmsim prices for a case's arguments, and its layers."""
    opts = {"tp": 1, "ep": 1, "layers": 1}
    overrides = []
    for flag, value in zip(args[1::2], args[2::2], strict=False):
        if flag == "--set":
            overrides.append(value)
        elif flag[2:] in opts:
            opts[flag[2:]] = int(value)
    scenario = time_layers.resolve(args[0], overrides)
    one = time_layers.single_device(scenario, opts["layers"], tp=opts["tp"], ep=opts["ep"])
    return one, opts["layers"]


def main() -> None:
    print("| run | case | measured fwd ms | llmsim fwd ms | ratio | measured fwd+bwd ms "
          "| llmsim fwd+bwd ms | ratio |\n|---|---|---|---|---|---|---|---|")
    for run, args, fwd, both in cases():
        one, _ = scenario_of(args)
        p_fwd, p_both = time_layers.predicted_s(one)
        print(f"| {run} | {' '.join(args)} | {fwd:.2f} | {p_fwd * 1e3:.2f} | "
              f"{p_fwd * 1e3 / fwd:.3f} | {both:.2f} | {p_both * 1e3:.2f} | "
              f"{p_both * 1e3 / both:.3f} |")
    for name, case in PROFILES.items():
        measured = time_layers_moe.profiled_parts_us(HERE / name,
                                                     scenario_of(shlex.split(case))[0])
        args = shlex.split(case)
        predicted = time_layers_moe.predicted_layer_parts_us(
            scenario_of([*args, "--layers", "4"])[0], scenario_of([*args, "--layers", "2"])[0])
        print(f"\n{name} (per layer, µs; head_loss per call)\n| part | measured kernels "
              "fwd+bwd | llmsim fwd+bwd |\n|---|---|---|")
        for part in sorted(set(measured) | set(predicted)):
            llm = predicted.get(part, (0.0, 0.0))[1]
            print(f"| {part} | {measured.get(part, 0.0):.1f} | {llm:.1f} |")
        layer = sum(v for p, v in measured.items() if p != "head_loss")
        llm = sum(b for p, (_, b) in predicted.items() if p != "head_loss")
        print(f"| layer total | {layer:.1f} | {llm:.1f} |")


if __name__ == "__main__":
    main()
