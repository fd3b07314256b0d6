"""Simulator speed and memory: wall time, events and peak memory per simulated step.

Run: python benchmarks/bench_simulate.py [CASE ...] [--repeats N] [--baseline DIR]
(default: every case but the slow ones; ``--baseline DIR`` times each case also on the
``simulator/`` of another checkout, e.g. ``git worktree add DIR main``, alternating runs of
the two, and prints its row beside this checkout's: a before/after in one run)

Each case is GPT-3 175B on A100s (TP 8, PP 8, global batch 1,536 — Narayanan et al.'s
layout) at some data-parallel degree and schedule; :data:`CASES` lists them, those marked
slow (ZeRO-3, full fidelity) run only when named. For each it prints the wall time of
`llmsim run` after its imports (load, simulate, memory, result) and of ``simulate`` alone,
its CPU time (``process_time``: on a machine shared with other work the wall time of a
fresh process varies twofold, its CPU time much less), the SimPy events the engine
scheduled, the events per CPU second of ``simulate``, the peak resident memory of the
timed process (``getrusage``) and the peak Python heap, and how the cost grows from 1,024
to ~100,000 GPUs.

The timed runs are plain: ``tracemalloc`` slows a simulation about fourfold, so the heap
is measured in one separate run, which also counts the events (each call of
``simpy.Environment.schedule``; counting slows that run too). Each run is a fresh process,
and a case is timed :data:`REPEATS` times: the run printed is the one with the least
``simulate`` CPU time (noise from other work on the machine only ever adds time).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

CASE = r"""
import json, resource, sys, time
measure = sys.argv[5] == "measure"
if measure:
    import tracemalloc
    import simpy
    events = [0]
    schedule = simpy.Environment.schedule
    def counted(self, *args, **kwargs):
        events[0] += 1
        return schedule(self, *args, **kwargs)
    simpy.Environment.schedule = counted
t0 = time.perf_counter()
import llmsim, llmsim.loader, llmsim.simulation  # llmsim alone loads its names lazily
t_import = time.perf_counter() - t0
nodes, dp, batch, case = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
extra = {
    "1f1b": ["parallelism.schedule=1f1b", "parallelism.virtual_stages=1"],
    "interleaved": ["parallelism.schedule=interleaved-1f1b", "parallelism.virtual_stages=2"],
    "interleaved-overlap": ["parallelism.schedule=interleaved-1f1b",
                            "parallelism.virtual_stages=2", "parallelism.overlap_pp_comm=true"],
    "zero3": ["parallelism.schedule=1f1b", "parallelism.zero=3"],
    "full": ["parallelism.schedule=1f1b", "fidelity=full", "max_sim_passes=2000000"],
}[case]
if measure:
    tracemalloc.start()
t1 = time.perf_counter()
s = llmsim.load_scenario("selene-gpt3" if nodes <= 560 else "openai-a100", [
    f"nodes={nodes}", "model=gpt3-175b", "parallelism.tp=8", "parallelism.pp=8",
    f"parallelism.dp={dp}", *extra, "parallelism.micro_batch=1",
    f"training.global_batch={batch}", "training.seq_len=2048",
    "training.precision=bf16", *([f"system.nodes={nodes}"] if nodes > 3125 else [])])
t2, c2 = time.perf_counter(), time.process_time()
r = llmsim.simulate(s)
sim, sim_cpu = time.perf_counter() - t2, time.process_time() - c2
r.to_json()
wall = time.perf_counter() - t1
out = {"devices": s.devices, "dp": s.dp, "microbatches": s.micro_batches,
       "records": len(r.trace.records), "wall_s": wall, "simulate_s": sim,
       "simulate_cpu_s": sim_cpu,
       "import_s": t_import,
       "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3,
       "step_time_s": r.step_time_s}
if measure:
    out |= {"events": events[0], "peak_traced_mb": tracemalloc.get_traced_memory()[1] / 1e6}
print(json.dumps(out))
"""

REPEATS = 3

CASES: dict[str, tuple[int, int, int, str, bool]] = {
    # name: (nodes, dp, global batch, schedule, slow). The DP cases keep 96 micro-batches
    # per pipeline (the symmetry reduction makes cost depend on micro-batches, not on dp);
    # dp390-b1560 is ~25,000 GPUs with a realistic batch (4 micro-batches per pipeline).
    "dp16": (128, 16, 1536, "1f1b", False),
    "dp64": (512, 64, 6144, "1f1b", False),
    "dp128": (1024, 128, 12288, "1f1b", False),
    "dp390": (3120, 390, 37440, "1f1b", False),
    "dp390-b1560": (3120, 390, 1560, "1f1b", False),
    # ~100,000 GPUs: openai-a100's machine grown to 12,480 nodes (system.nodes)
    "dp1560": (12480, 1560, 149760, "1f1b", False),
    "interleaved": (128, 16, 1536, "interleaved", False),
    "interleaved-overlap": (128, 16, 1536, "interleaved-overlap", False),
    "zero3": (128, 16, 1536, "zero3", True),
    "full": (128, 16, 1536, "full", True),
}


def _run(nodes: int, dp: int, batch: int, schedule: str, mode: str,
         source: str | None = None) -> dict:
    """One run in a fresh process, of this checkout's llmsim or of ``source`` (a
    ``simulator/`` folder put first on the path), with one OpenBLAS thread as ``llmsim``'s
    command line sets (``llmsim.cli.BLAS_THREADS``; a value set here wins)."""
    env = {"OPENBLAS_NUM_THREADS": "1"} | dict(os.environ)
    if source is not None:
        env["PYTHONPATH"] = source + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, "-c", CASE, str(nodes), str(dp), str(batch),
                          schedule, mode], check=True, capture_output=True, text=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_case(nodes: int, dp: int, batch: int, schedule: str = "1f1b",
             repeats: int = REPEATS, source: str | None = None) -> dict:
    """The fastest of ``repeats`` plain runs of one case, each in a fresh process, with the
    events and peak heap of one more, measured, run."""
    fastest = min((_run(nodes, dp, batch, schedule, "time", source) for _ in range(repeats)),
                  key=lambda r: r["simulate_cpu_s"])
    measured = _run(nodes, dp, batch, schedule, "measure", source)
    assert measured["step_time_s"] == fastest["step_time_s"]
    return fastest | {"events": measured["events"],
                      "peak_traced_mb": measured["peak_traced_mb"]}


def _option(args: list[str], flag: str) -> str | None:
    """The value after ``flag`` in ``args`` (both removed), or None."""
    if flag not in args:
        return None
    at = args.index(flag)
    value = args[at + 1]
    del args[at:at + 2]
    return value


def main(names: list[str]) -> None:
    repeats = _option(names, "--repeats")
    baseline = _option(names, "--baseline")
    unknown = [n for n in names if n not in CASES]
    if unknown:
        sys.exit(f"unknown case {unknown[0]!r}; use one of {', '.join(CASES)}")
    names = names or [n for n, case in CASES.items() if not case[-1]]
    rows = {}
    for n in names:
        times = int(repeats) if repeats else 1 if CASES[n][-1] else REPEATS
        if baseline is not None:
            rows[f"{n} before"] = run_case(*CASES[n][:4], repeats=times,
                                           source=os.path.join(baseline, "simulator"))
        rows[n] = run_case(*CASES[n][:4], repeats=times)
    print(f"{'case':>27} {'devices':>8} {'dp':>5} {'m':>4} {'events':>9} {'records':>8} "
          f"{'wall s':>8} {'sim s':>8} {'sim cpu':>8} {'events/s':>9} {'RSS MB':>7} {'heap MB':>8} "
          f"{'import s':>9} {'step s':>8}")
    for name, r in rows.items():
        print(f"{name:>27} {r['devices']:>8,} {r['dp']:>5} {r['microbatches']:>4} "
              f"{r['events']:>9,} {r['records']:>8,} {r['wall_s']:>8.3f} "
              f"{r['simulate_s']:>8.3f} {r['simulate_cpu_s']:>8.3f} "
              f"{r['events'] / r['simulate_cpu_s']:>9,.0f} "
              f"{r['max_rss_mb']:>7.0f} {r['peak_traced_mb']:>8.1f} {r['import_s']:>9.2f} "
              f"{r['step_time_s']:>8.4f}")
    scaling = [rows[n] for n in ("dp16", "dp64", "dp128", "dp390", "dp390-b1560", "dp1560")
               if n in rows]
    for r in scaling[1:]:
        base = scaling[0]
        print(f"cost ratio {r['devices']:,} vs {base['devices']:,} GPUs: "
              f"{r['simulate_cpu_s'] / base['simulate_cpu_s']:.2f}× simulate CPU, "
              f"{r['max_rss_mb'] / base['max_rss_mb']:.2f}× RSS")


if __name__ == "__main__":
    main(sys.argv[1:])
