"""The range of errors the unstated settings of validation rows give (docs/validation.md,
"Sensitivity to the unstated values").

    python benchmarks/sensitivity.py                     # every row sensitivity.yaml names
    python benchmarks/sensitivity.py MEGREADME-H100-04   # rows whose id starts with it
    python benchmarks/sensitivity.py MLPERF --csv out.csv

Prints one Markdown table (the row's chosen error, the range over the combinations that
are valid layouts and fit in memory, and the values at each end); ``--csv`` also writes
every combination's prediction. About 1-10 s per combination on one core.
"""

from __future__ import annotations

import argparse
import sys

import pandas as pd

from llmsim.errors import UserError
from llmsim.validation import load_runs
from llmsim.validation.sensitivity import markdown, ranges, sensitivity, variations_for


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("prefixes", nargs="*", help="row id prefixes (default: all varied rows)")
    parser.add_argument("--csv", help="also write every combination to this CSV")
    args = parser.parse_args(argv)
    try:
        runs = [r for p in (args.prefixes or [None]) for r in load_runs(p, "prefix")]
        runs = [r for r in runs if variations_for(r)]
        if not runs:
            raise UserError("no row of these prefixes is in sensitivity.yaml; name one it varies")
        frames = []
        for run in runs:
            frames.append(sensitivity(run))
            print(f"{run.id}: {len(frames[-1])} combinations", file=sys.stderr)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(markdown(ranges(frames)))
    if args.csv:
        pd.concat(frames, ignore_index=True).to_csv(args.csv, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
