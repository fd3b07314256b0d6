"""How fast the layout search is: layouts priced per second, the whole search, peak RSS.

Usage::

    python benchmarks/bench_search.py                  # GPT-3 175B on 1,024 A100 (selene-gpt3)
    python benchmarks/bench_search.py frontier --max-layouts 20000 --workers 2
    python benchmarks/bench_search.py selene-gpt3 --every 10   # one process, CPU seconds
    python benchmarks/bench_search.py selene-gpt3 --every 1 --first-batch 3000 --batches 300
    python benchmarks/bench_search.py selene-gpt3 --every 10 --rounds 2 --rows ROWS.csv  # + warm
    python benchmarks/bench_search.py selene-gpt3 --every 1 --by-schedule  # CPU by schedule
    python benchmarks/bench_search.py selene-gpt3 --workers 2 --timeline TL.jsonl  # + tail

Prints, for the scenario: the size of the space (core layouts, layouts after the overlap
switches), layouts priced, rejected for memory and invalid, the estimator's layouts/s
(its pricing phase's wall time, all workers together) and per worker, the engine
confirmation of the top layouts, the whole search's wall time, the estimator's cost on
one cached layout (µs, one core), and the peak RSS of this process and its workers.
Also how the estimator's cost grows with the pipeline depth (pp 1 to 96), and the CPU
seconds of this process and of the workers, with the load average: on a machine shared
with other jobs the wall times are theirs as much as the search's.
"""

from __future__ import annotations

import argparse
import os
import resource
import time

import llmsim
from llmsim.search import search
from llmsim.search.estimate import Estimator


def _rss_mb() -> tuple[float, float]:
    """Peak RSS of this process and of its finished children, MB (Linux: ru_maxrss KB)."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return own, children


def _cpu_s() -> tuple[float, float]:
    """CPU seconds (user + system) used so far by this process and by its finished
    children (the pool's workers): on a shared machine the wall time depends on the
    other users, the CPU time much less."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


def _per_layout_us(scenario: llmsim.specs.Scenario, repeats: int = 200) -> float:
    """The estimator's wall time on one layout whose shared parts are priced (µs)."""
    est = Estimator()
    est.estimate(scenario)
    start = time.perf_counter()
    for _ in range(repeats):
        est.estimate(scenario)
    return (time.perf_counter() - start) / repeats * 1e6


def every_nth_batch(name: str, every: int, first: int = 0, count: int | None = None,
                    rounds: int = 1, rows: str | None = None,
                    by_schedule: bool = False) -> None:
    """Price every ``every``-th batch of the scenario's whole space in this process and
    print the CPU seconds: a measure of the pricing alone that other jobs on the machine
    disturb little (no pool, no confirmation). ``first`` and ``count`` narrow it to
    ``count`` batches from batch ``first`` (``--every 1``: a contiguous stretch, as a
    worker meets them). ``rounds`` > 1 prices the same batches again in the same process
    (the later rounds warm: the per-layout body without the one-time costs); ``rows``
    writes the last round's rows as ``--rows`` does for a whole search; ``by_schedule``
    prints the last round's CPU seconds by schedule and by (schedule, pp), each batch's
    one-time builds (its walk key's orders and walks) included."""
    from collections import defaultdict

    from llmsim.search.batching import batches as walk_batches
    from llmsim.search.price import price_batch, state_fits
    from llmsim.search.space import SpaceOptions, cores

    base = llmsim.load_scenario(name).model_copy(update={"fidelity": "reduced"})
    start = time.process_time()
    space = list(cores(base, SpaceOptions(fixed={}), state_fits(base, 0.1)))
    enumerated = time.process_time() - start
    batches = walk_batches(space)  # as the search cuts them: one walk key each
    batches = batches[first:][::every][:count]
    for round_ in range(1, rounds + 1):
        start = time.process_time()
        priced = over = invalid = 0
        results = []
        spent: dict[tuple[str, int], list[float]] = defaultdict(lambda: [0.0, 0])
        for batch in batches:
            batch_start = time.process_time()
            result = price_batch(base, batch, {}, 0.1)
            share = spent[batch[0].schedule, batch[0].pp]
            share[0] += time.process_time() - batch_start
            share[1] += len(result)
            priced, over, invalid = (priced + len(result), over + result.out_of_memory,
                                     invalid + result.invalid)
            results.append(result)
        cpu = time.process_time() - start
        print(f"scenario {name}: {len(space):,} core layouts (enumerated in {enumerated:.1f} "
              f"s CPU); every {every}th batch: {len(batches):,} batches, priced {priced:,}, "
              f"over memory {over:,}, invalid {invalid:,}; round {round_}: {cpu:.2f} s CPU, "
              f"{priced / cpu:,.0f} layouts priced per CPU-second")
    if by_schedule:
        _print_by_schedule(spent, cpu)
    if rows:
        import pandas as pd

        table = pd.concat([pd.DataFrame({k: list(v) for k, v in r.columns.items()})
                           for r in results if len(r)])
        print(f"  rows: {_write_rows(table, rows)}")


def _print_by_schedule(spent: dict[tuple[str, int], list[float]], cpu: float) -> None:
    """The CPU seconds of :func:`every_nth_batch`'s last round by schedule, then its ten
    costliest (schedule, pp), with µs per priced layout."""
    totals: dict[str, float] = {}
    for (schedule, _), (seconds, _) in spent.items():
        totals[schedule] = totals.get(schedule, 0.0) + seconds
    print("  CPU s by schedule: " + ", ".join(
        f"{schedule} {seconds:.2f} ({seconds / cpu:.0%})"
        for schedule, seconds in sorted(totals.items(), key=lambda item: -item[1])))
    for (schedule, pp), (seconds, n) in sorted(spent.items(), key=lambda item: -item[1][0])[:10]:
        print(f"    {schedule} pp {pp}: {seconds:.2f} s CPU, {n:,} priced, "
              f"{seconds / max(n, 1) * 1e6:,.0f} µs a priced layout")


def _write_rows(table: object, path: str) -> str:
    """Write the priced rows' key, memory and estimator columns, sorted by key, floats
    exactly (``repr``), to ``path``; return the file's SHA-256."""
    import hashlib

    columns = ["key", "memory_gb"] + [c for c in table.columns if c.startswith("est_")]
    rows = table[columns].sort_values("key")
    text = "\n".join(",".join(repr(v) for v in row)
                     for row in rows.itertuples(index=False, name=None))
    with open(path, "w") as f:
        f.write(",".join(columns) + "\n" + text + "\n")
    return f"{len(rows):,} rows, sha256 {hashlib.sha256(text.encode()).hexdigest()[:16]}"


def _timeline(path: str) -> None:
    """Record, as JSON lines in ``path``, each batch a pool worker prices (process, start,
    end, CPU) and each engine run of the confirmation, from inside the processes: the
    pricing function and the engine's are wrapped here and the workers are forked from
    this process (so any llmsim on ``PYTHONPATH`` can be timed, a base worktree's too)."""
    import functools
    import importlib
    import json

    open(path, "w").close()

    def traced(function):
        @functools.wraps(function)  # pickled by its name, which is then this wrapper's
        def run(*args, **kwargs):
            t0, c0 = time.time(), time.process_time()
            out = function(*args, **kwargs)
            with open(path, "a") as f:
                f.write(json.dumps({"what": function.__name__, "pid": os.getpid(), "t0": t0,
                                    "t1": time.time(),
                                    "cpu": time.process_time() - c0}) + "\n")
            return out
        return run

    # by import_module: ``llmsim.search.confirm`` as an attribute is the function
    runner = importlib.import_module("llmsim.search.runner")
    confirm = importlib.import_module("llmsim.search.confirm")
    runner._price_on_worker = traced(runner._price_on_worker)
    confirm.engine_row = traced(confirm.engine_row)
    # and the main process's steps between the pricing and the engine's runs
    store = importlib.import_module("llmsim.search.store")
    store.Store.table = traced(store.Store.table)
    confirm.ranked = traced(confirm.ranked)
    confirm.engine_rows = traced(confirm.engine_rows)


def _timeline_summary(path: str, started: float) -> str:
    """Per worker: batches, first start and last end (s after the search's start), CPU;
    the pool's tail (the last ends' spread); the engine runs' first start, last end; the
    main process's steps from the last batch's end to the first engine run."""
    import json

    with open(path) as f:
        records = [json.loads(line) for line in f]
    out = []
    for what, name in (("_price_on_worker", "pricing"), ("engine_row", "engine")):
        mine = [r for r in records if r["what"] == what]
        ends = []
        for n, pid in enumerate(sorted({r["pid"] for r in mine})):
            of = [r for r in mine if r["pid"] == pid]
            ends.append(max(r["t1"] for r in of) - started)
            out.append(f"    {name} worker {n}: {len(of)} runs, "
                       f"{min(r['t0'] for r in of) - started:.2f} → {ends[-1]:.2f} s, "
                       f"CPU {sum(r['cpu'] for r in of):.1f} s")
        if ends:
            out.append(f"    {name}: last ends {max(ends) - min(ends):.2f} s apart")
    steps = [r for r in records if r["what"] in ("table", "ranked", "engine_rows")]
    if steps:
        out.append("    main process: " + ", ".join(
            f"{r['what']} {r['t0'] - started:.2f} → {r['t1'] - started:.2f} s "
            f"(CPU {r['cpu']:.2f} s)" for r in steps))
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario", nargs="?", default="selene-gpt3")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--max-layouts", type=int, default=None)
    parser.add_argument("--every", type=int, default=None,
                        help="only price every N-th batch in this process (CPU seconds)")
    parser.add_argument("--first-batch", type=int, default=0,
                        help="with --every: start at this batch")
    parser.add_argument("--batches", type=int, default=None,
                        help="with --every: price at most this many batches")
    parser.add_argument("--rows", default=None,
                        help="write every priced row (key and estimator columns, sorted) to "
                             "this CSV and print its SHA-256 (rows identical before/after)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="with --every: price the batches this many times (later: warm)")
    parser.add_argument("--by-schedule", action="store_true",
                        help="with --every: print the CPU seconds by schedule and pp")
    parser.add_argument("--timeline", default=None,
                        help="record each batch's and engine run's process, start, end and "
                             "CPU to this file (JSON lines) and print the tail")
    args = parser.parse_args()
    if args.every:
        every_nth_batch(args.scenario, args.every, args.first_batch, args.batches,
                        args.rounds, args.rows, args.by_schedule)
        return
    scenario = llmsim.load_scenario(args.scenario)

    if args.timeline:
        _timeline(args.timeline)
    start, started = time.perf_counter(), time.time()
    load_before = os.getloadavg()[0]
    cpu_own, cpu_children = _cpu_s()
    table = search(scenario, top=args.top, workers=args.workers,
                   max_layouts=args.max_layouts)
    wall = time.perf_counter() - start
    own_now, children_now = _cpu_s()
    cpu_own, cpu_children = own_now - cpu_own, children_now - cpu_children
    s = table.attrs["summary"]
    own, children = _rss_mb()
    print(f"scenario {s.scenario} on {s.machine_devices:,} devices, {args.workers} workers, "
          f"{os.cpu_count()} cores")
    print(f"  space: {s.core_layouts:,} core layouts{' (sampled)' if s.sampled else ''}; "
          f"{s.priced + s.out_of_memory + s.invalid:,} layouts with the overlap switches")
    print(f"  priced {s.priced:,}, over memory {s.out_of_memory:,}, invalid {s.invalid:,}")
    print(f"  estimator: {s.layouts_per_s:,.0f} layouts/s priced "
          f"({s.layouts_per_s / args.workers:,.0f} per worker), "
          f"{(s.priced + s.out_of_memory + s.invalid) / s.estimate_wall_s:,.0f} layouts/s "
          f"looked at, {s.estimate_wall_s:,.1f} s")
    print(f"  CPU: this process {cpu_own:,.1f} s, workers {cpu_children:,.1f} s (pricing "
          f"and confirmation); {s.priced / max(cpu_children, 1e-9):,.0f} layouts priced per "
          f"worker CPU-second; load average {load_before:.1f} → {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} cores")
    print(f"  engine confirmation of the top {s.confirmed}: "
          f"{wall - s.estimate_wall_s:,.1f} s")
    print(f"  whole search: {wall:,.1f} s wall; peak RSS {own:,.0f} MB "
          f"(workers {children:,.0f} MB)")
    if args.rows:
        print(f"  rows: {_write_rows(table, args.rows)}")
    if args.timeline:
        print(f"  timeline ({args.timeline}):\n{_timeline_summary(args.timeline, started)}")
    best = table.iloc[0]
    print(f"  best: {best['key']}: engine {best['step_time_s']:.3f} s/step, "
          f"estimator {best['est_step_time_s']:.3f} s, MFU {best['mfu'] * 100:.1f} %")
    print(f"  one cached layout (the scenario's own): {_per_layout_us(scenario):,.0f} µs")
    print("  cost against pipeline depth (µs per cached layout):")
    for pp in (1, 4, 16, 96):
        if scenario.model.layers % pp:
            continue
        try:
            deep = llmsim.load_scenario(args.scenario, [f"parallelism.pp={pp}",
                                                        "parallelism.dp=auto",
                                                        "parallelism.schedule=1f1b",
                                                        "parallelism.virtual_stages=1"])
        except llmsim.UserError:
            continue
        print(f"    pp {pp:>3}: {_per_layout_us(deep, 100):,.0f}")


if __name__ == "__main__":
    main()
