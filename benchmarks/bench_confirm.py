"""The engine's confirmation of a search's top layouts: CPU seconds per layout, and which
path replayed it (a loop without SimPy, or SimPy).

Usage::

    python benchmarks/bench_confirm.py                       # selene-gpt3, tp 4, pp 4
    python benchmarks/bench_confirm.py selene-gpt3 --fix parallelism.tp=8 --top 10
    python benchmarks/bench_confirm.py --baseline /tmp/base/simulator --repeats 3

Runs the layout search on the scenario, narrowed by ``--fix`` (default
``parallelism.tp=4 parallelism.pp=4``, where the whole search's best layouts of
selene-gpt3 lie: docs/search.md, "Speed") in one process, and takes its ``--top`` rows.
Then, each time in a fresh process, it runs :func:`llmsim.search.confirm.engine_row` (what
the search's confirmation runs) on each of them in turn and prints the CPU seconds
(``process_time``: on a shared machine the wall time is the other jobs' as much as this
one's) of each and in all, and whether SimPy ran (``Environment.run`` called) or a loop.
With ``--baseline DIR`` (the ``simulator/`` of another checkout, e.g. ``git worktree add
--detach /tmp/base main``) the same runs of that code alternate with this checkout's,
printed side by side; the rows must be identical (the engine's numbers of each layout).
Each side keeps the run of least total CPU of ``--repeats``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile

CASE = r"""
import json, sys, time
import simpy
runs = [0]
run = simpy.Environment.run
def counted(self, *args, **kwargs):
    runs[0] += 1
    return run(self, *args, **kwargs)
simpy.Environment.run = counted
import llmsim
from llmsim.search.confirm import engine_row
from llmsim.search.space import Layout
spec = json.load(open(sys.argv[1]))
base = llmsim.load_scenario(spec["scenario"])
layouts = [Layout(**fields) for fields in spec["layouts"]]
out, start = [], time.process_time()
for layout in layouts:
    before, t = runs[0], time.process_time()
    row = engine_row(base, layout)
    out.append({"key": layout.key, "cpu_s": time.process_time() - t,
                "simpy": runs[0] > before,
                "row": {k: v for k, v in row.items() if k != "key"}})
print(json.dumps({"total_cpu_s": time.process_time() - start, "layouts": out}))
"""


def top_layouts(scenario: str, fix: list[str], top: int) -> list[dict]:
    """The ``top`` rows the search confirms (its table's first), as Layout fields."""
    import llmsim
    from llmsim.search import search
    from llmsim.search.confirm import layout_of_row

    table = search(llmsim.load_scenario(scenario), fix=fix, top=top, workers=1)
    return [dataclasses.asdict(layout_of_row(row)) for _, row in table.head(top).iterrows()]


def run_side(spec_path: str, source: str | None) -> dict:
    """One fresh process's confirmation of the layouts, of this checkout's llmsim or of
    ``source`` (a ``simulator/`` folder first on the path)."""
    env = {"OPENBLAS_NUM_THREADS": "1"} | dict(os.environ)
    if source is not None:
        env["PYTHONPATH"] = source + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, "-c", CASE, spec_path], check=True,
                         capture_output=True, text=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario", nargs="?", default="selene-gpt3")
    parser.add_argument("--fix", nargs="*", default=["parallelism.tp=4", "parallelism.pp=4"])
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--baseline", default=None)
    args = parser.parse_args()
    layouts = top_layouts(args.scenario, args.fix, args.top)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"scenario": args.scenario, "layouts": layouts}, f)
    sides = {"this": None} | ({"baseline": args.baseline} if args.baseline else {})
    best: dict[str, dict] = {}
    for _ in range(args.repeats):
        for name, source in sides.items():
            run = run_side(f.name, source)
            if name not in best or run["total_cpu_s"] < best[name]["total_cpu_s"]:
                best[name] = run
    os.unlink(f.name)
    names = list(best)
    print(f"{args.scenario}, fix {' '.join(args.fix)}: the search's top {len(layouts)}, "
          f"engine CPU s per layout (least total of {args.repeats}; S: SimPy ran)")
    print("  ".join(f"{n:>12}" for n in names) + "  layout")
    for i, layout in enumerate(best["this"]["layouts"]):
        runs = [best[n]["layouts"][i] for n in names]
        cells = [f"{r['cpu_s']:10.3f} {'S' if r['simpy'] else ' '}" for r in runs]
        print("  ".join(cells) + "  " + layout["key"])
    print("  ".join(f"{best[n]['total_cpu_s']:12.3f}" for n in names) + "  total")
    if "baseline" in best:
        same = all(a["row"] == b["row"] for a, b in zip(best["this"]["layouts"],
                                                         best["baseline"]["layouts"],
                                                         strict=True))
        print(f"engine rows identical to the baseline's: {same}")


if __name__ == "__main__":
    main()
