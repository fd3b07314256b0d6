"""The step time's spread with per-op noise and slow devices (llmsim.costs.jitter), on a
job shaped like the sample AR of Lin et al.'s straggler artifact (dp 4 · pp 4 · tp 4, 64
GPUs; github.com/ByteDance-Seed/StragglerAnalysis): how much noise gives its measured
step-to-step spread (0.45 % CV, p99/p50 1.007), and at what mean cost (docs/calendar.md,
section 6).

Run: python benchmarks/jitter_spread.py   (about 2 minutes on 2 cores)
"""

from __future__ import annotations

import numpy as np

import llmsim
from llmsim.calendar.stragglers import step_spread

LAYOUT = ["nodes=8", "parallelism.tp=4", "parallelism.pp=4", "parallelism.dp=4",
          "training.global_batch=64"]
"""selene-gpt3's model on 8 Selene nodes in the sample job's layout."""
STEPS = 30


def main() -> None:
    plain = llmsim.simulate(llmsim.load_scenario("selene-gpt3", overrides=LAYOUT))
    print(f"without noise: {plain.step_time_s:.3f} s")
    for field in ("compute_cv", "comm_cv"):
        for cv in (0.02, 0.05, 0.1, 0.2, 0.5):
            scenario = llmsim.load_scenario(
                "selene-gpt3", overrides=[*LAYOUT, f"jitter.{field}={cv}", f"jitter.steps={STEPS}"])
            spread = step_spread(scenario, deterministic_s=plain.step_time_s)
            times = np.array(spread.step_times_s)
            print(f"{field} {cv}: mean {100 * (spread.slowdown - 1):+.1f} %, step CV "
                  f"{100 * times.std(ddof=1) / times.mean():.2f} %, p99/p50 "
                  f"{spread.percentile_s(99) / spread.percentile_s(50):.4f}")
    slow = llmsim.load_scenario("selene-gpt3", overrides=[
        *LAYOUT, "jitter.slow_fraction=0.01", "jitter.slow_speed=0.5"])
    for seed in range(4):
        step = llmsim.simulate(slow.model_copy(update={"seed": seed})).step_time_s
        print(f"slow_fraction 0.01 at speed 0.5, seed {seed}: {step / plain.step_time_s:.3f}×")


if __name__ == "__main__":
    main()
