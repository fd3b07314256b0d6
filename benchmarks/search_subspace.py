"""A search over a fixed part of a scenario's space, timed: CPU, wall, peak RSS, rows.

Usage (before and after on the same machine, one after the other)::

    PYTHONPATH=/work/main/simulator python benchmarks/search_subspace.py parallelism.tp=8
    python benchmarks/search_subspace.py parallelism.tp=8

Runs ``llmsim.search(load_scenario("selene-gpt3"), fix=[...], workers=2, top=20)`` and
prints the space, layouts priced per second and per worker CPU-second, the whole search's
wall time, peak RSS, the best layout and a hash of every priced row's key, estimated
step time and memory (equal hashes: the same rows).
"""

from __future__ import annotations

import hashlib
import os
import resource
import sys
import time

import llmsim
from llmsim.search import search


def _cpu_s() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


def main() -> None:
    fix = sys.argv[1:] or ["parallelism.tp=8"]
    scenario = llmsim.load_scenario("selene-gpt3")
    start, (own_0, children_0) = time.perf_counter(), _cpu_s()
    table = search(scenario, fix=fix, workers=2, top=20)
    wall = time.perf_counter() - start
    own_1, children_1 = _cpu_s()
    s = table.attrs["summary"]
    rss_own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    rss_children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    workers = children_1 - children_0
    print(f"{llmsim.__file__}: fix {fix}: {s.core_layouts:,} cores, priced {s.priced:,}, "
          f"oom {s.out_of_memory:,}; estimate wall {s.estimate_wall_s:.1f} s, "
          f"{s.layouts_per_s:,.0f} layouts/s; whole {wall:.1f} s; CPU main "
          f"{own_1 - own_0:.1f} s workers {workers:.1f} s -> {s.priced / workers:,.0f} "
          f"priced per worker CPU-s; peak RSS {rss_own:.0f} MB (workers {rss_children:.0f} "
          f"MB); load {os.getloadavg()[0]:.1f}")
    best = table.iloc[0]
    print("  best", best["key"], best["est_step_time_s"], best["step_time_s"])
    rows = table.sort_values("key")
    digest = hashlib.sha1(repr(list(zip(rows["key"], rows["est_step_time_s"],
                                        rows["memory_gb"], strict=True))).encode())
    print("  rows sha", digest.hexdigest()[:12])


if __name__ == "__main__":
    main()
