"""What the Fugaku rows miss, per collective and per op (docs/validation.md, section 8,
"Tensor parallelism on Fugaku: what the rows miss, counted").

    python benchmarks/fugaku_tp_shortfall.py

For each Fugaku development row with tensor parallelism, and for three timings of the same
source that are not rows (the configurations of FUGAKU-DEV-1, -6 and -7 timed again or at
another micro-batch size), it prints the measured and predicted step, the time llmsim is
short, the busiest stage's collectives and compute ops a step, and the shortfall spread
over each of them: the size a per-collective or a per-op cost would need to close the row.
Those readings are not priced anywhere; they say which count the missing time follows.

A second table sets FUGAKU-DEV-14 (TP 4 over a node's four CMGs) beside its pair
FUGAKU-DEV-13 (DP 4 over the same CMGs, the same PyTorch 1.10, allocator, clock and
knobs): what each misses per micro-batch, per op and per priced compute second, and what
each of DEV-14's collectives would have to cost beyond llmsim's price once DEV-13's
shortfall is taken as common to both, in proportion to the ops, the FLOPs or the priced
compute (docs/validation.md, section 8, "The TP rows on the CMGs").
About 15 s on one core.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from llmsim.loader import load_scenario
from llmsim.ops import ComputeOp
from llmsim.simulation import simulate
from llmsim.validation import load_runs
from llmsim.validation.scenarios import scenario_mapping

FLOP_FACTOR_1_3B_CKPT = 1.16251e16
"""DeepSpeedFugaku's FLOPs of one 1.3B iteration with activation checkpointing (its
``megatron/utils.py`` at 8e0eabb: 96·B·s·l·h²·(1 + s/6h + V/16lh), B = 1,024, s = 1,024,
l = 24, h = 2,048, V = 50,304; at TP 4 Megatron pads V to 50,688, 0.04 % more), which
turns a printed TFLOP/s into seconds."""


@dataclass(frozen=True)
class Case:
    """A measured run: a validation row, optionally with one parallelism field changed."""

    label: str
    row: str
    measured_s: float
    source: str
    micro_batch: int | None = None


CASES = (
    Case("DEV-14", "FUGAKU-DEV-14", 1233.7, "the row"),
    Case("DEV-1", "FUGAKU-DEV-1", 2533.0, "the row"),
    Case("DEV-1 again", "FUGAKU-DEV-1", 2857.8,
         "1.3b_benchmarking.md (bb88177^): the same layout's second table, 0.76 TFLOP/s"),
    Case("DEV-2", "FUGAKU-DEV-2", 162.5, "the row"),
    Case("DEV-3", "FUGAKU-DEV-3", 7717.7, "the row"),
    Case("DEV-7", "FUGAKU-DEV-7", 3231.4, "the row"),
    Case("DEV-7 at MBS 1", "FUGAKU-DEV-7", FLOP_FACTOR_1_3B_CKPT / (0.69e12 * 4),
         "1.3b_benchmarking.md: TP 4, MBS 1, 0.69 TFLOP/s a node, no time printed", 1),
    Case("DEV-13", "FUGAKU-DEV-13", 613.2, "the row (DP 4 on the CMGs, DEV-14's pair)"),
    Case("DEV-8", "FUGAKU-DEV-8", 1020.3, "the row (one node, no collective, tcmalloc)"),
    Case("DEV-9", "FUGAKU-DEV-9", 1321.5, "the row (one node, no collective, glibc)"),
    Case("DEV-6", "FUGAKU-DEV-6", 11727.9, "the row (one node, no collective)"),
    Case("DEV-6 at MBS 2", "FUGAKU-DEV-6", FLOP_FACTOR_1_3B_CKPT / 1.18e12,
         "1.3b_benchmarking.md: one node, MBS 2, 1.18^ TFLOP/s (marked estimated)", 2),
)


def counts(case: Case) -> dict[str, Any]:
    """The case simulated: its step, and the busiest stage's collectives, compute ops,
    model FLOPs, priced compute and priced TP time over the step."""
    run = next(r for r in load_runs("FUGAKU-DEV") if r.id == case.row)
    mapping = dict(scenario_mapping(run))
    if case.micro_batch is not None:
        mapping["parallelism"] = {**mapping["parallelism"], "micro_batch": case.micro_batch}
    result = simulate(load_scenario(mapping))
    critical = result.critical_stage
    ops = [op for chunk in result.workload.chunks.values() if chunk.stage == critical.stage
           for op in chunk.ops]
    compute = [op for op in ops if isinstance(op, ComputeOp)]
    m = result.workload.microbatches
    return {"step_s": result.step_time_s, "collectives": (len(ops) - len(compute)) * m,
            "ops": len(compute) * m, "microbatches": m,
            "flops": m * sum(op.flops for op in compute),
            "compute_s": critical.compute_s, "tp_s": critical.tp_s}


@dataclass(frozen=True)
class Shortfall:
    """A measured run beside llmsim's step of it, with the counts a missing cost could
    follow (all over one step of the busiest process)."""

    measured_s: float
    step_s: float
    microbatches: int
    ops: int
    """Compute ops."""
    flops: float
    """Model FLOPs of the compute ops."""
    compute_s: float
    """llmsim's priced compute."""
    collectives: int = 0

    @property
    def short_s(self) -> float:
        """Measured less predicted, s."""
        return self.measured_s - self.step_s


def common_shortfall_s(pair: Shortfall, alone: Shortfall) -> dict[str, float]:
    """The time ``pair`` would miss if it missed what ``alone`` misses, in proportion to
    its compute ops, its FLOPs or its priced compute seconds (s)."""
    return {
        "per op": alone.short_s / alone.ops * pair.ops,
        "per FLOP": alone.short_s / alone.flops * pair.flops,
        "per priced compute second": alone.short_s / alone.compute_s * pair.compute_s,
    }


def residual_per_collective_ms(pair: Shortfall, alone: Shortfall) -> dict[str, float]:
    """What each of ``pair``'s collectives would have to cost beyond llmsim's price (ms)
    for the rest of its shortfall, after :func:`common_shortfall_s` under each reading."""
    return {reading: 1e3 * (pair.short_s - common) / pair.collectives
            for reading, common in common_shortfall_s(pair, alone).items()}


def shortfall(case: Case) -> Shortfall:
    """:func:`counts` of ``case`` as a :class:`Shortfall`."""
    c = counts(case)
    return Shortfall(case.measured_s, c["step_s"], c["microbatches"], c["ops"], c["flops"],
                     c["compute_s"], c["collectives"])


def pair_table() -> str:
    """DEV-14 (TP 4 on the CMGs) beside DEV-13 (DP 4 on the same CMGs) as Markdown."""
    by_label = {case.label: case for case in CASES}
    tp, dp = shortfall(by_label["DEV-14"]), shortfall(by_label["DEV-13"])
    lines = ["| run | short s | micro-batches | s per micro-batch | ms per op "
             "| s per priced compute s |", "|---|" + "---:|" * 5]
    for label, s in (("DEV-13 (DP 4)", dp), ("DEV-14 (TP 4)", tp)):
        lines.append(f"| {label} | {s.short_s:,.1f} | {s.microbatches:,} | "
                     f"{s.short_s / s.microbatches:.3f} | {1e3 * s.short_s / s.ops:.3f} | "
                     f"{s.short_s / s.compute_s:.3f} |")
    common = common_shortfall_s(tp, dp)
    residual = residual_per_collective_ms(tp, dp)
    lines += ["", "| DEV-13's shortfall taken as common | DEV-14 would miss s | left s "
              "| ms per collective beyond llmsim's price |", "|---|---:|---:|---:|"]
    for reading, common_s in common.items():
        lines.append(f"| {reading} | {common_s:,.1f} | {tp.short_s - common_s:,.1f} | "
                     f"{residual[reading]:.2f} |")
    return "\n".join(lines)


def table() -> str:
    """One Markdown table over :data:`CASES`."""
    lines = ["| run | measured s | llmsim s | error % | short s | collectives a step "
             "| ms per collective | compute ops a step | ms per op |", "|---|" + "---:|" * 8]
    for case in CASES:
        c = counts(case)
        short = case.measured_s - c["step_s"]
        per_coll = f"{1e3 * short / c['collectives']:.2f}" if c["collectives"] else "–"
        lines.append(
            f"| {case.label} | {case.measured_s:,.1f} | {c['step_s']:,.1f} | "
            f"{100 * (c['step_s'] - case.measured_s) / case.measured_s:+.1f} | {short:,.0f} | "
            f"{c['collectives']:,} | {per_coll} | {c['ops']:,} | "
            f"{1e3 * short / c['ops']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """Print the table; no arguments."""
    if argv:
        print("error: fugaku_tp_shortfall.py takes no arguments; run it as is", file=sys.stderr)
        return 2
    print(table())
    print()
    print(pair_table())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
