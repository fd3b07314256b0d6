"""Where the Zero Bubble rows' interleaved 1F1B loses its time: slope, intercept, latency.

Qi et al. 2024 measured each (model, schedule) at three batches; a step is, to the
rounding of the printed throughputs, a line in the micro-batch count m:
``T(m) = intercept + m · slope``. The slope is the steady-state period of the slowest
stage per micro-batch, the intercept the warm-up and cool-down (the other stages' ramp)
and the per-step work (optimizer, gradient reductions). This script prints, for every
configuration and schedule, the measured and the predicted slope and intercept (from the
two largest batches, as ``llmsim.validation.marginal_costs``), so a candidate cause of the
interleaved rows' shortfall can be placed in one or the other: extra warm-up or flush
passes move the intercept; a cost per micro-batch, per chunk or per message the slope.

With ``--latency-us`` it then adds that many microseconds to every pipeline message
(``node.fabric[*].latency_us`` for sends on one node, ``network.step_latency_us`` for sends
between nodes; both catalog fields, the per-message fixed cost llmsim's message model
charges) and prints the slopes again: how much of a per-message latency each schedule's
steady state exposes. Megatron-LM's overlapped interleaved schedule waits on the previous
step's send and receive before its next pass, and each posted operation holds its thread
blocks until it completes (``docs/engine.md``); the Zero Bubble runtime posts its
receives ahead of the pass that consumes them; 1F1B sends blocking. docs/validation.md
section 7 records the result.

    python benchmarks/zb_interleaved_whatif.py --latency-us 100 500 1000

Runs on the CPU, about 0.2 s of CPU per simulated step (24 steps, and 24 more per latency).
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

from llmsim.simulation import simulate
from llmsim.specs.scenario import Scenario
from llmsim.validation.runs import Run, load_runs
from llmsim.validation.scenarios import scenario_for


def with_message_latency(sc: Scenario, extra_us: float) -> Scenario:
    """``sc`` with ``extra_us`` more fixed cost on every message, on the node's fabric
    tiers and across the network."""
    if extra_us == 0:
        return sc
    node = sc.system.node
    fabric = [tier.model_copy(update={"latency_us": tier.latency_us + extra_us})
              for tier in node.fabric]
    network = sc.system.network
    network = network.model_copy(update={"step_latency_us": network.step_latency_us + extra_us})
    system = sc.system.model_copy(update={"node": node.model_copy(update={"fabric": fabric}),
                                          "network": network})
    return sc.model_copy(update={"system": system})


def groups(runs: list[Run]) -> dict[tuple[str, str], list[Run]]:
    """(model, schedule) → its rows, fewest micro-batches first."""
    out: dict[tuple[str, str], list[Run]] = defaultdict(list)
    for r in runs:
        out[(r.row["model_name"], str(scenario_for(r).parallelism.schedule))].append(r)
    for rows in out.values():
        rows.sort(key=lambda r: int(r.row["global_batch"]))
    return out


def line(points: list[tuple[int, float]]) -> tuple[float, float]:
    """(slope s per micro-batch, intercept s) through the two points of most micro-batches."""
    (m0, t0), (m1, t1) = sorted(points)[-2:]
    slope = (t1 - t0) / (m1 - m0)
    return slope, t1 - m1 * slope


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--latency-us", type=float, nargs="*", default=[],
                    help="extra fixed cost per pipeline message, µs (each a what-if)")
    args = ap.parse_args()
    cpu0 = time.process_time()
    runs = [r for r in load_runs() if r.id.startswith("ZB24")]
    by_group = groups(runs)
    print("model           schedule          slope ms meas/llmsim   intercept s meas/llmsim")
    base: dict[tuple[str, str], float] = {}
    for (model, schedule), rows in by_group.items():
        pairs = [(scenario_for(r), r) for r in rows[-2:]]
        meas = line([(sc.micro_batches, r.measured) for sc, r in pairs])
        pred = line([(sc.micro_batches, simulate(sc).step_time_s) for sc, _ in pairs])
        base[(model, schedule)] = pred[0]
        print(f"{model:15s} {schedule:17s} {meas[0] * 1e3:7.2f} / {pred[0] * 1e3:7.2f}"
              f"      {meas[1]:6.3f} / {pred[1]:6.3f}")
    for extra in args.latency_us:
        print(f"\n+{extra:g} µs a message: slope ms (change)")
        for (model, schedule), rows in by_group.items():
            scs = [with_message_latency(scenario_for(r), extra) for r in rows[-2:]]
            pts = [(sc.micro_batches, simulate(sc).step_time_s) for sc in scs]
            slope = line(pts)[0]
            print(f"{model:15s} {schedule:17s} {slope * 1e3:7.2f} "
                  f"({(slope - base[(model, schedule)]) * 1e3:+.2f})")
    print(f"\nCPU {time.process_time() - cpu0:.1f} s")


if __name__ == "__main__":
    main()
