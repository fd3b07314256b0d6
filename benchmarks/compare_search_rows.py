"""Compare two searches' rows (``bench_search.py --rows FILE``): the same layouts, every
estimator column within a relative tolerance, the same best layout and top-20 order.

Usage::

    python benchmarks/compare_search_rows.py base.csv new.csv [--rel 1e-9]

Prints, per column, the largest relative difference and how many rows are exactly equal;
exits 1 if the keys differ, a column is off by more than ``--rel``, or the best 20 (by
``est_days``, by ``est_step_time_s`` where a row has no days) are not in the same order.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import pandas as pd


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base")
    parser.add_argument("new")
    parser.add_argument("--rel", type=float, default=1e-9)
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args()
    a, b = pd.read_csv(args.base), pd.read_csv(args.new)
    if list(a.columns) != list(b.columns) or len(a) != len(b) \
            or not (a["key"].to_numpy() == b["key"].to_numpy()).all():
        print(f"the layouts differ: {len(a):,} against {len(b):,} rows")
        return 1
    worst = 0.0
    for column in a.columns[1:]:
        x, y = a[column].to_numpy(float), b[column].to_numpy(float)
        nan = np.isnan(x) & np.isnan(y)
        scale = np.maximum(np.abs(x), np.finfo(float).tiny)
        rel = np.where(nan, 0.0, np.abs(x - y) / scale)
        worst = max(worst, float(rel.max()))
        print(f"{column:26s} max relative difference {rel.max():.3e}, "
              f"exactly equal {int(((x == y) | nan).sum()):,} of {len(x):,}")
    by = "est_days" if a["est_days"].notna().all() else "est_step_time_s"
    top_a = a.sort_values([by, "key"], kind="stable")["key"].head(args.top).tolist()
    top_b = b.sort_values([by, "key"], kind="stable")["key"].head(args.top).tolist()
    print(f"{len(a):,} rows; worst {worst:.3e}; best {top_a[0]} "
          f"{'same' if top_a[0] == top_b[0] else 'DIFFERS: ' + top_b[0]}; top {args.top} "
          f"by {by} {'in the same order' if top_a == top_b else 'DIFFER'}")
    return 0 if worst <= args.rel and top_a == top_b else 1


if __name__ == "__main__":
    sys.exit(main())
