"""The search's one-time costs per walk key: each ZB-V, ZB-H2, Chimera and DualPipe key of
a scenario's space built once in this process, CPU seconds by part.

Usage::

    python benchmarks/bench_walk_keys.py                     # selene-gpt3, every key
    python benchmarks/bench_walk_keys.py selene-gpt3 --every 4
    python benchmarks/bench_walk_keys.py --schedules zb-v --digest

For every walk key (schedule, pp, virtual stages, micro-batches per step) of those
schedules among the scenario's core layouts (:func:`llmsim.search.batching.walk_key`),
it times, one after the other and each from nothing (no memo in between):

- ``order``: the schedule's per-stage action order (:func:`llmsim.schedules.build`);
- ``graph``: its wait graph (:func:`llmsim.schedules.walk.wait_graph`, compiled: its rows
  as the array the search's walks read);
- ``rows``: the graph's rows as tuples (:meth:`~llmsim.schedules.walk.WaitGraph.rows`,
  what the reference timeline reads);
- ``in_flight``: the order's in-flight counts at each stage's peak
  (:func:`llmsim.schedules.chunks_at_peak`, what :mod:`llmsim.in_flight` reads).

With ``--digest`` it also prints a SHA-256 of every part's result over all keys (orders,
needs and senders, rows, counts), so that two versions of the code can be shown
to build the same things (run each with its own ``PYTHONPATH``).
"""

from __future__ import annotations

import argparse
import hashlib
import time

import llmsim
from llmsim.schedules import SCHEDULES, SPLIT_BACKWARD, build, chunks_at_peak
from llmsim.schedules.walk import wait_graph

PARTS = ("order", "graph", "rows", "in_flight")
WALKED = ("zb-v", "zb-h2", "chimera", "dualpipe")


def walk_keys(name: str, schedules: tuple[str, ...]) -> list[tuple[str, int, int, int]]:
    """The scenario's walk keys of ``schedules``, sorted."""
    from llmsim.search.batching import walk_key
    from llmsim.search.price import state_fits
    from llmsim.search.space import SpaceOptions, cores

    base = llmsim.load_scenario(name).model_copy(update={"fidelity": "reduced"})
    keys = {walk_key(c) for c in cores(base, SpaceOptions(fixed={}), state_fits(base, 0.1))}
    return sorted(k for k in keys if k[0] in schedules)


def _timed(cpu: dict[str, float], part: str, fn, *args, **kwargs):
    start = time.process_time()
    out = fn(*args, **kwargs)
    cpu[part] += time.process_time() - start
    return out


def build_parts(keys: list[tuple[str, int, int, int]], digest: bool) -> None:
    """Build every key's parts once; print CPU seconds by part and schedule."""
    cpu = {(s, part): 0.0 for s in WALKED for part in PARTS}
    hashes = {part: hashlib.sha256() for part in PARTS}
    passes = 0
    for schedule, p, v, m in keys:
        own = {part: 0.0 for part in PARTS}
        order = _timed(own, "order", build, schedule, p, m, v)
        route = SCHEDULES[schedule].route_of(p, m, v)
        graph = _timed(own, "graph", wait_graph, order, route,
                       gradient_after_weights=schedule not in SPLIT_BACKWARD)
        rows = _timed(own, "rows", graph.rows)
        counts = _timed(own, "in_flight", lambda o=order: [chunks_at_peak(r) for r in o])
        passes += len(rows)
        for part in PARTS:
            cpu[schedule, part] += own[part]
        if digest:
            hashes["order"].update(repr([[str(a) for a in row] for row in order]).encode())
            hashes["graph"].update(repr((graph.needs, graph.senders)).encode())
            hashes["rows"].update(repr(rows).encode())
            hashes["in_flight"].update(repr(counts).encode())
    print(f"{len(keys)} walk keys, {passes:,} passes; CPU seconds by part:")
    print(f"{'schedule':>10} {'keys':>5} " + " ".join(f"{part:>9}" for part in PARTS))
    for schedule in WALKED:
        n = sum(k[0] == schedule for k in keys)
        if n:
            print(f"{schedule:>10} {n:>5} "
                  + " ".join(f"{cpu[schedule, part]:>9.2f}" for part in PARTS))
    print(f"{'all':>10} {len(keys):>5} "
          + " ".join(f"{sum(cpu[s, part] for s in WALKED):>9.2f}" for part in PARTS))
    if digest:
        for part in PARTS:
            print(f"  {part} sha256 {hashes[part].hexdigest()[:16]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario", nargs="?", default="selene-gpt3")
    parser.add_argument("--schedules", default=",".join(WALKED),
                        help=f"comma-separated, among {', '.join(WALKED)}")
    parser.add_argument("--every", type=int, default=1, help="only every N-th key")
    parser.add_argument("--digest", action="store_true",
                        help="print a SHA-256 of each part's results over all keys")
    args = parser.parse_args()
    schedules = tuple(args.schedules.split(","))
    keys = walk_keys(args.scenario, schedules)[::args.every]
    build_parts(keys, args.digest)


if __name__ == "__main__":
    main()
