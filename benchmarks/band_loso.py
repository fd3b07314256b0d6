"""Does the error band hold on runs it was not built from? (docs/validation.md)

    python benchmarks/band_loso.py            # both tables, Markdown, from the stored residuals
    python benchmarks/band_loso.py --rules    # only the comparison of band rules

Leave-one-source-out over the stored residuals (``simulator/llmsim/data/residuals.csv``):
each validation row gets the band the *other* sources' rows give it, and its own error is
checked against it. Prints, per source, how many rows get a band and how many lie inside
it (with the chosen rule, :data:`llmsim.band_rules.CHOSEN`), then every rule of
:data:`llmsim.band_rules.RULES` with its share of held-out rows inside, the mean over
sources of each source's share (each held-out source counted once, as a user's run is
one new source), and the median width of its bands. Runs in seconds; nothing is
simulated.
"""

from __future__ import annotations

import argparse
from statistics import fmean, median
from typing import NamedTuple

from llmsim.band_rules import CHOSEN, RULES, Rule
from llmsim.error_band import Band, Residual, leave_one_source_out, load_residuals


class Coverage(NamedTuple):
    """How a band rule fares on held-out sources (a named tuple: the script loads as a
    plain file in the tests, outside ``sys.modules``, where a dataclass cannot)."""

    rows: int
    """Validation rows."""
    banded: int
    """Rows that get a band from the other sources' rows."""
    inside: int
    """Banded rows whose error lies inside their band."""
    source_mean_pct: float
    """Mean over the sources with banded rows of each one's share inside, %."""
    median_width_pct: float
    """Median width of the banded rows' bands, percentage points."""

    @property
    def inside_pct(self) -> float:
        """Share of the banded rows inside their band, %."""
        return 100 * self.inside / self.banded


def coverage(held_out: list[tuple[Residual, Band | None]]) -> Coverage:
    """The counts of one leave-one-source-out pass."""
    banded = [(row, band) for row, band in held_out if band is not None]
    by_source: dict[str, list[bool]] = {}
    for row, band in banded:
        by_source.setdefault(row.group, []).append(band.contains(row.time_error_pct))
    return Coverage(len(held_out), len(banded), sum(map(sum, by_source.values())),
                    100 * fmean(fmean(v) for v in by_source.values()),
                    median(band.high_pct - band.low_pct for _, band in banded))


def rule_coverage(residuals: list[Residual], rule: Rule) -> Coverage:
    """``rule``'s leave-one-source-out counts."""
    return coverage(leave_one_source_out(residuals, rule))


def sources_table(residuals: list[Residual]) -> str:
    """Per source: rows, rows with a band, rows inside it, and their bands' ends."""
    lines = ["| source | rows | with a band | inside it | held-out bands, % |",
             "|---|---:|---:|---:|---|"]
    held_out = leave_one_source_out(residuals)
    for group in dict.fromkeys(r.group for r in residuals):
        mine = [(row, band) for row, band in held_out if row.group == group]
        banded = [(row, band) for row, band in mine if band is not None]
        inside = sum(band.contains(row.time_error_pct) for row, band in banded)
        ends = (f"{min(b.low_pct for _, b in banded):+.1f} … "
                f"{max(b.high_pct for _, b in banded):+.1f}" if banded else "")
        lines.append(f"| {group} | {len(mine)} | {len(banded)} | {inside} | {ends} |")
    total = coverage(held_out)
    lines.append(f"| **all** | {total.rows} | {total.banded} | {total.inside} "
                 f"({total.inside_pct:.0f} %) | |")
    return "\n".join(lines)


def rules_table(residuals: list[Residual]) -> str:
    """Every band rule's leave-one-source-out coverage and median width."""
    lines = ["| rule | rows inside | share | mean over sources | median width, points |",
             "|---|---:|---:|---:|---:|"]
    for name, rule in RULES.items():
        c = rule_coverage(residuals, rule)
        label = f"**{name}** (chosen)" if name == CHOSEN else name
        lines.append(f"| {label} | {c.inside} of {c.banded} | {c.inside_pct:.1f} % | "
                     f"{c.source_mean_pct:.1f} % | {c.median_width_pct:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rules", action="store_true", help="only the comparison of rules")
    args = parser.parse_args(argv)
    residuals = load_residuals()
    if not args.rules:
        print(sources_table(residuals), end="\n\n")
    print(rules_table(residuals))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
