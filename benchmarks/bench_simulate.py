"""Simulator speed and memory: wall time, events and peak memory per simulated step.

Run: python benchmarks/bench_simulate.py

Prints, for GPT-3 175B on A100s (TP 8, PP 8, 1F1B, global batch 1,536 — Narayanan et
al.'s layout) at growing data-parallel degree, the wall time of `llmsim run` (load,
simulate, memory, result), the records per second and the peak Python memory, and how
the cost grows from 1,024 to ~25,000 GPUs; a last case runs the interleaved schedule with
its sends and receives posted ahead (each holding SMs until its peer posts, re-pricing the
passes under way: the engine's costliest mode per pass). Each case runs in a fresh process so peak
memory is that of the run alone, and :data:`REPEATS` times: the wall time printed is the
fastest run (noise from other work on the machine only ever adds time).
"""

from __future__ import annotations

import json
import subprocess
import sys

CASE = r"""
import json, resource, sys, time, tracemalloc
t0 = time.perf_counter()
import llmsim
t_import = time.perf_counter() - t0
nodes, dp, batch = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
schedule = ["parallelism.schedule=1f1b", "parallelism.virtual_stages=1"]
if sys.argv[4] == "interleaved":
    schedule = ["parallelism.schedule=interleaved-1f1b", "parallelism.virtual_stages=2",
                "parallelism.overlap_pp_comm=true"]
tracemalloc.start()
t1 = time.perf_counter()
s = llmsim.load_scenario("selene-gpt3" if nodes <= 560 else "openai-a100", [
    f"nodes={nodes}", "model=gpt3-175b", "parallelism.tp=8", "parallelism.pp=8",
    f"parallelism.dp={dp}", *schedule, "parallelism.micro_batch=1",
    f"training.global_batch={batch}", "training.seq_len=2048",
    "training.precision=bf16"])
r = llmsim.simulate(s)
r.to_json()
wall = time.perf_counter() - t1
_, peak = tracemalloc.get_traced_memory()
print(json.dumps({"devices": s.devices, "dp": s.dp, "microbatches": s.micro_batches,
                  "records": len(r.trace.records), "wall_s": wall, "import_s": t_import,
                  "peak_traced_mb": peak / 1e6,
                  "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3,
                  "step_time_s": r.step_time_s}))
"""


REPEATS = 3


def run_case(nodes: int, dp: int, batch: int, schedule: str = "1f1b") -> dict:
    """The fastest of :data:`REPEATS` runs of one case, each in a fresh process."""
    runs = []
    for _ in range(REPEATS):
        out = subprocess.run([sys.executable, "-c", CASE, str(nodes), str(dp), str(batch),
                              schedule],
                             check=True, capture_output=True, text=True)
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return min(runs, key=lambda r: r["wall_s"])


def main() -> None:
    # (nodes, dp, global batch): the batch keeps 96 micro-batches per pipeline at every
    # size (the symmetry reduction makes cost depend on micro-batches, not on dp); the
    # last case is ~25,000 GPUs with a realistic batch (4 micro-batches per pipeline).
    cases = [(128, 16, 1536), (512, 64, 6144), (1024, 128, 12288), (3120, 390, 37440),
             (3120, 390, 1560)]
    rows = [run_case(*c) for c in cases]
    interleaved = run_case(128, 16, 1536, "interleaved")
    print(f"{'schedule':>12} {'devices':>8} {'dp':>5} {'m':>4} {'records':>8} {'wall s':>8} "
          f"{'rec/s':>9} {'traced MB':>10} {'RSS MB':>8} {'import s':>9} {'step s':>8}")
    for r, name in [(r, "1f1b") for r in rows] + [(interleaved, "interleaved")]:
        print(f"{name:>12} {r['devices']:>8,} {r['dp']:>5} {r['microbatches']:>4} "
              f"{r['records']:>8,} "
              f"{r['wall_s']:>8.3f} {r['records'] / r['wall_s']:>9,.0f} "
              f"{r['peak_traced_mb']:>10.1f} {r['max_rss_mb']:>8.0f} {r['import_s']:>9.2f} "
              f"{r['step_time_s']:>8.2f}")
    base = rows[0]
    for r in rows[1:]:
        print(f"cost ratio {r['devices']:,} vs {base['devices']:,} GPUs: "
              f"{r['wall_s'] / base['wall_s']:.2f}× wall, "
              f"{r['max_rss_mb'] / base['max_rss_mb']:.2f}× RSS")


if __name__ == "__main__":
    main()
