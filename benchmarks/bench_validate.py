"""CPU time of ``llmsim validate``, row by row: building the scenario, simulating, and the total.

Run: python benchmarks/bench_validate.py [PREFIX] [--top N] [--profile]

For each validation row (those whose id starts with PREFIX, all by default) it times
:func:`llmsim.validation.scenario_for` (the row's scenario: model, system and memory
settings) and :func:`llmsim.simulate` in CPU time (``process_time``: on a machine shared
with other work the wall time varies far more than the CPU time), then prints the N
slowest rows, the total per phase and the total of all rows. ``--profile`` runs the same
under ``cProfile`` and prints the 30 functions with the most cumulative time instead.
"""

from __future__ import annotations

import importlib
import os
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy, as llmsim's command line


def time_rows(prefix: str | None) -> list[tuple[str, float, float]]:
    """(row id, scenario CPU s, simulate CPU s) for every row of the subset."""
    from llmsim import simulate, validation
    from llmsim.validation.scenarios import scenario_for

    rows = []
    for run in validation.load_runs(prefix):
        c0 = time.process_time()
        scenario = scenario_for(run)
        c1 = time.process_time()
        simulate(scenario)
        rows.append((run.id, c1 - c0, time.process_time() - c1))
    return rows


def _path(row_id: str) -> str:
    """How the engine replays a row's step: "tight loop", "contended loop", or SimPy and
    why (:func:`llmsim.engine.uncontended.simpy_reason`; "same instant" where a loop gave
    the step back to SimPy; "" with an llmsim that has none)."""
    from llmsim import validation
    from llmsim.engine import uncontended
    from llmsim.simulation import build_engine
    from llmsim.validation.scenarios import scenario_for

    reason = getattr(uncontended, "simpy_reason", None)
    if reason is None:
        return ""
    run = next(r for r in validation.load_runs(row_id) if r.id == row_id)
    engine = build_engine(scenario_for(run))
    loop = "tight loop" if uncontended.applies(engine) else "contended loop"
    why = reason(engine, contended=True) if loop == "contended loop" else ""
    engine.run()
    if engine.env.now == 0:  # no SimPy event ran
        return loop
    return f"SimPy: {why or 'same instant'}"


def main(args: list[str]) -> None:
    top = int(args[args.index("--top") + 1]) if "--top" in args else 15
    if "--top" in args:
        del args[args.index("--top"): args.index("--top") + 2]
    profile = "--profile" in args
    args = [a for a in args if a != "--profile"]
    prefix = args[0] if args else None
    c0 = time.process_time()
    for module in ("llmsim.simulation", "llmsim.validation"):  # timed apart from the rows
        importlib.import_module(module)
    print(f"imports: {time.process_time() - c0:.2f} s CPU")
    if profile:
        import cProfile
        import pstats

        with cProfile.Profile() as p:
            time_rows(prefix)
        pstats.Stats(p).sort_stats("cumulative").print_stats(30)
        return
    rows = time_rows(prefix)
    print(f"{'row':<28} {'scenario s':>10} {'simulate s':>10}  path")
    for rid, build, sim in sorted(rows, key=lambda r: -(r[1] + r[2]))[:top]:
        print(f"{rid:<28} {build:>10.3f} {sim:>10.3f}  {_path(rid)}")
    build, sim = sum(r[1] for r in rows), sum(r[2] for r in rows)
    print(f"{len(rows)} rows: scenario {build:.2f} s, simulate {sim:.2f} s, "
          f"total {build + sim:.2f} s CPU")


if __name__ == "__main__":
    main(sys.argv[1:])
