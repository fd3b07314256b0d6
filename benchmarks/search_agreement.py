"""How far the search's estimator is from the SimPy engine (docs/search.md quotes it).

Usage::

    python benchmarks/search_agreement.py                 # validation rows + 200 layouts
    python benchmarks/search_agreement.py --layouts 50 --scenario frontier
    python benchmarks/search_agreement.py --no-rows --layouts 12 --fix zero=3 \
        --fix schedule=interleaved-1f1b                   # one part of the space
    python benchmarks/search_agreement.py --no-layouts \
        --steps tests/data/validation_steps.csv           # the rows alone, engine steps stored

For every validation row (the target set and the rest) and for a seeded random sample of
layouts of a scenario's search space that fit in memory, prints the distribution of the
estimator's step time over the engine's (min, 5th, 50th, 95th percentile, max), the
share within 1 %, 2 % and 5 %, and the Spearman rank correlation of the two over the
sampled layouts (how well the estimator orders layouts, which is what the search needs).
"""

from __future__ import annotations

import argparse
import random

import numpy as np
import pandas as pd

import llmsim
from llmsim.search.estimate import Estimator
from llmsim.search.fix import parse_fix
from llmsim.search.price import state_fits
from llmsim.search.space import SpaceOptions, apply, cores, switch_variants
from llmsim.simulation import simulate


def describe(ratios: list[float]) -> str:
    r = np.asarray(ratios)
    q = np.percentile(r, [0, 5, 50, 95, 100])
    within = [np.mean(np.abs(r - 1) <= t) * 100 for t in (0.01, 0.02, 0.05)]
    return (f"n={len(r)}: min {q[0]:.4f}, p5 {q[1]:.4f}, median {q[2]:.4f}, p95 {q[3]:.4f}, "
            f"max {q[4]:.4f}; within 1/2/5 %: {within[0]:.0f}/{within[1]:.0f}/{within[2]:.0f} %")


def validation_rows(steps_csv: str | None = None) -> pd.DataFrame:
    """Each validation row's estimate over its engine step: the engine run here, or read
    from ``steps_csv`` (the step table ``tests/test_validation_steps.py`` holds to 1e-9
    against the engine, so the ratio is the same and costs the estimator's time alone)."""
    from llmsim.validation import load_runs, scenario_for

    stored = (pd.read_csv(steps_csv).set_index("id")["step_time_s"].to_dict()
              if steps_csv else {})
    est, rows = Estimator(), []
    for run in load_runs():
        sc = scenario_for(run)
        engine = stored[run.id] if run.id in stored else simulate(sc).step_time_s
        rows.append({"id": run.id, "target": run.target,
                     "ratio": est.estimate(sc).step_time_s / engine})
    return pd.DataFrame(rows)


def sampled_layouts(name: str, count: int, seed: int,
                    fixed: dict | None = None) -> pd.DataFrame:
    scenario = llmsim.load_scenario(name)
    options = SpaceOptions(fixed=fixed or {})
    space = [v for c in cores(scenario, options, state_fits(scenario, 0.1))
             for v in switch_variants(c, fixed or {})]
    rng, est, rows = random.Random(seed), Estimator(), []
    limit = scenario.system.node.accelerator.hbm_bytes * 0.9
    while len(rows) < count:
        layout = rng.choice(space)
        try:
            sc = apply(scenario, layout)
        except ValueError:
            continue
        if max(m.total_bytes for m in est.memory(sc)) > limit:
            continue
        engine = simulate(sc).step_time_s
        rows.append({"key": layout.key, "estimate_s": est.estimate(sc).step_time_s,
                     "engine_s": engine})
    table = pd.DataFrame(rows)
    table["ratio"] = table["estimate_s"] / table["engine_s"]
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default="selene-gpt3")
    parser.add_argument("--layouts", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fix", action="append", default=[], metavar="FIELD=VALUE",
                        help="sample only layouts with this value (as llmsim search --fix)")
    parser.add_argument("--no-rows", action="store_true", help="skip the validation rows")
    parser.add_argument("--no-layouts", action="store_true", help="skip the sampled layouts")
    parser.add_argument("--steps", metavar="CSV", help="the rows' engine steps from this "
                        "table (tests/data/validation_steps.csv) instead of engine runs")
    parser.add_argument("--out", metavar="PREFIX", help="also write PREFIX_rows.csv and "
                        "PREFIX_layouts.csv (each row's or layout's ratio and steps), so "
                        "that another checkout's estimator can be compared on them")
    args = parser.parse_args()
    if not args.no_rows:
        rows = validation_rows(args.steps)
        print("validation target rows:", describe(rows[rows["target"]]["ratio"].tolist()))
        print("all validation rows:   ", describe(rows["ratio"].tolist()))
        worst = rows.iloc[(rows["ratio"] - 1).abs().argsort()[::-1][:3]]
        print("  furthest:", ", ".join(f"{r.id} {r.ratio:.4f}" for r in worst.itertuples()))
        if args.out:
            rows.to_csv(f"{args.out}_rows.csv", index=False)
    if args.no_layouts:
        return
    table = sampled_layouts(args.scenario, args.layouts, args.seed, parse_fix(args.fix))
    print(f"{args.layouts} random fitting layouts of {args.scenario}:",
          describe(table["ratio"].tolist()))
    rho = table["estimate_s"].rank().corr(table["engine_s"].rank())
    print(f"  Spearman rank correlation, estimator against engine: {rho:.4f}")
    worst = table.iloc[(table["ratio"] - 1).abs().argsort()[::-1][:3]]
    print("  furthest:", ", ".join(f"{r.key} {r.ratio:.4f}" for r in worst.itertuples()))
    if args.out:
        table.to_csv(f"{args.out}_layouts.csv", index=False)


if __name__ == "__main__":
    main()
