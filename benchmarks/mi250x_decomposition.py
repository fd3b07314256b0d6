"""Where llmsim's step of an MI250X validation row goes, part by part, beside the measured
step (docs/validation.md, section 8, "The MI250X rows taken apart: communication is not
the gap").

    python benchmarks/mi250x_decomposition.py                 # LUMI23-05, -06, LUMIRF25-03
    python benchmarks/mi250x_decomposition.py LUMI FRONTIER   # rows whose id starts with them
    python benchmarks/mi250x_decomposition.py FRONTIER --calibration PROFILE  # a what-if
    python benchmarks/mi250x_decomposition.py LUMI23-06 --ops  # the busiest stage, op by op
    python benchmarks/mi250x_decomposition.py LUMI FRONTIER XMOE --shares  # % of each step

With ``--calibration`` the rows' collectives are priced from a measured table where it
covers them (``benchmarks/results/frontier_rccl_pccl.yaml``: the PCCL authors' RCCL sweep on
Frontier), each group at the measured shape closest to its own.

With ``--ops`` it prints, for each row, the busiest stage's kernels by name instead: the
seconds a step each takes (all layers of the stage, forward, recompute and backward
together) and the bytes it moves, the largest first (docs/validation.md, section 8, "The
LUMI23 rows' memory-bound kernels").

With ``--shares`` it prints, for each row, what share of llmsim's step each mechanism takes
(GEMMs, attention forward and recompute, attention backward, memory-bound kernels, the
device's launch gap per kernel carved out of those, exposed communication with the MoE
all-to-all, bubble and optimizer), the busiest stage's kernels a step and their mean length,
and the factor by which the measured step is longer (docs/validation.md, section 8, "The
MI250X rows' common shortfall").

Otherwise it prints one Markdown table: the busiest stage's compute split by how each
kernel is priced (GEMMs, fused attention, memory-bound kernels: one micro-batch's ops times the
micro-batches), the exposed TP, PP and DP communication, the bubble, the share of the step
that is communication, and the time llmsim is short of the measurement. About 2-5 s per
row on one core.
"""

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmsim.costs import HardwareCosts
from llmsim.errors import UserError
from llmsim.ops import ComputeOp
from llmsim.plan import Plan
from llmsim.simulation import simulate
from llmsim.validation import load_runs, scenario_for
from llmsim.validation.runs import Run

DEFAULT_ROWS = ("LUMI23-05", "LUMI23-06", "LUMIRF25-03")
"""The two worst LUMI23 rows and the largest LUMIRF25 run."""


@dataclass(frozen=True, slots=True)
class Decomposition:
    """One MI250X row's predicted step, by part, beside its measured step (all in s)."""

    id: str
    measured_s: float
    step_s: float
    gemm_s: float
    """GEMM kernels of the busiest stage over the step (the unfused attention's batched
    score and context GEMMs included)."""
    attention_fwd_s: float
    """Fused attention kernels of the forward and of its recompute, over the step."""
    attention_bwd_s: float
    """Fused attention backward kernels over the step."""
    memory_s: float
    """Memory-bound kernels (norms, softmax, dropout, element-wise) over the step."""
    compute_s: float
    """The busiest stage's compute stream, as the engine ran it."""
    tp_s: float
    pp_s: float
    dp_s: float
    bubble_s: float
    optimizer_s: float
    a2a_s: float = 0.0
    """Exposed expert-parallel all-to-all of the busiest stage, s."""
    launch_s: float = 0.0
    """The device's own gap per kernel (``kernel_launch_us``) over the busiest stage's
    kernels of the step, inside the kinds above, s."""
    kernels: int = 0
    """Kernels of the busiest stage a step (every split its own)."""

    @property
    def attention_s(self) -> float:
        """Fused attention kernels of the busiest stage over the step, s."""
        return self.attention_fwd_s + self.attention_bwd_s

    @property
    def comm_s(self) -> float:
        """Exposed communication of the busiest stage, s."""
        return self.tp_s + self.pp_s + self.dp_s + self.a2a_s

    @property
    def comm_share(self) -> float:
        """Exposed communication over the predicted step."""
        return self.comm_s / self.step_s

    @property
    def shortfall_s(self) -> float:
        """Measured step less llmsim's, s."""
        return self.measured_s - self.step_s


@dataclass(frozen=True, slots=True)
class OpLine:
    """One kernel name of the busiest stage over a step: every layer's instance of it in
    every phase (forward, recompute, backward) and micro-batch."""

    name: str
    kind: str
    """How it is priced: ``gemm``, ``attention`` or ``memory``."""
    phases: str
    """The phases it runs in (F forward, R recompute, B and W backward, O optimizer)."""
    seconds: float
    """Its time over the step, s."""
    bytes: float
    """The bytes it moves over the step."""


def _simulated(run: Run, calibration: Path | None,
               with_launch: bool = False) -> tuple[Any, list[tuple[ComputeOp, float]]]:
    """The engine's result for ``run`` and the busiest stage's compute ops of one
    micro-batch, each with its price in s (and, ``with_launch``, the device's launch gap
    as the accelerator's ``launch_s`` attribute of the result)."""
    scenario = scenario_for(run)
    if calibration is not None:
        scenario = scenario.model_copy(update={"calibration": str(calibration)})
    result = simulate(scenario)
    costs = HardwareCosts.from_scenario(scenario, Plan.from_scenario(scenario))
    stage = result.critical_stage.stage
    ops = [(op, costs.compute_s(op)) for chunk in result.workload.chunks.values()
           if chunk.stage == stage for op in chunk.ops if isinstance(op, ComputeOp)]
    if with_launch:
        return (result, costs.compute.compute_launch_s), ops
    return result, ops


def by_op(run: Run) -> list[OpLine]:
    """The busiest stage's kernels of ``run`` by name, the longest first (s per step)."""
    result, ops = _simulated(run, None)
    m = result.workload.microbatches
    lines: dict[str, OpLine] = {}
    for op, seconds in ops:
        old = lines.get(op.name, OpLine(op.name, op.kind, "", 0.0, 0.0))
        phases = old.phases if op.phase in old.phases else old.phases + op.phase
        lines[op.name] = OpLine(op.name, op.kind, phases, old.seconds + seconds * m,
                                old.bytes + op.bytes * m)
    return sorted(lines.values(), key=lambda line: -line.seconds)


def decompose(run: Run, calibration: Path | None = None) -> Decomposition:
    """Price the busiest stage's ops of ``run`` by kind and take the engine's breakdown,
    with the measured tables of the ``calibration`` profile if one is given."""
    (result, launch_s), ops = _simulated(run, calibration, with_launch=True)
    stage = result.critical_stage
    by_kind = {"gemm": 0.0, "attention_fwd": 0.0, "attention_bwd": 0.0, "memory": 0.0}
    for op, seconds in ops:
        kind = op.kind if op.kind != "attention" else (
            "attention_bwd" if op.phase == "B" else "attention_fwd")
        by_kind[kind] += seconds
    m = result.workload.microbatches
    kernels = m * sum(op.splits for op, _ in ops)
    return Decomposition(
        run.id, run.measured, result.step_time_s,
        by_kind["gemm"] * m, by_kind["attention_fwd"] * m, by_kind["attention_bwd"] * m,
        by_kind["memory"] * m, stage.compute_s, stage.tp_s, stage.pp_s, stage.dp_s,
        stage.bubble_s, stage.optimizer_s, stage.a2a_s, kernels * launch_s, kernels)


def table(rows: list[Decomposition]) -> str:
    """The decompositions as one Markdown table, seconds per step."""
    lines = ["| row | measured s | llmsim s | GEMMs | attention | memory-bound | TP | PP | DP "
             "| bubble | comm. share % | short by s |", "|---|" + "---:|" * 11]
    for d in rows:
        lines.append(
            f"| {d.id} | {d.measured_s:,.2f} | {d.step_s:,.2f} | {d.gemm_s:,.2f} | "
            f"{d.attention_s:,.2f} | {d.memory_s:,.2f} | {d.tp_s:,.2f} | {d.pp_s:,.2f} | "
            f"{d.dp_s:,.2f} | {d.bubble_s:,.2f} | {100 * d.comm_share:.1f} | "
            f"{d.shortfall_s:,.2f} |")
    return "\n".join(lines)


def shares_table(rows: list[Decomposition]) -> str:
    """Each row's predicted step by mechanism, in per cent of the step, the launch gap
    (already inside the kinds' shares) beside them, the stage's kernels a step with their
    mean length, and the measured step over llmsim's, as one Markdown table."""
    lines = ["| row | GEMMs % | attn fwd % | attn bwd % | memory-bound % "
             "| of which launches % | comm. % | bubble + opt. % | kernels a step "
             "| mean kernel µs | measured / llmsim |", "|---|" + "---:|" * 10]
    for d in rows:
        pct = [100 * x / d.step_s for x in (d.gemm_s, d.attention_fwd_s, d.attention_bwd_s,
                                             d.memory_s, d.launch_s)]
        lines.append(
            f"| {d.id} | " + " | ".join(f"{p:.1f}" for p in pct) + " | "
            f"{100 * d.comm_share:.1f} | "
            f"{100 * (d.bubble_s + d.optimizer_s) / d.step_s:.1f} | {d.kernels:,} | "
            f"{1e6 * d.compute_s / d.kernels:,.0f} | {d.measured_s / d.step_s:.2f} |")
    return "\n".join(lines)


def op_table(run: Run, lines: list[OpLine]) -> str:
    """The busiest stage's kernels of ``run`` as one Markdown table, s and GB per step."""
    total = sum(line.seconds for line in lines)
    out = [f"{run.id}: the busiest stage's kernels, {total:,.2f} s of compute a step",
           "", "| kernel | priced as | phases | s | % of compute | GB |", "|---|---|---|"
           + "---:|" * 3]
    for line in lines:
        out.append(f"| {line.name} | {line.kind} | {line.phases} | {line.seconds:,.2f} | "
                   f"{100 * line.seconds / total:.1f} | {line.bytes / 1e9:,.1f} |")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    """Print the table for the rows whose ids start with the given prefixes; 2 on bad input."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rows", nargs="*", help="row ids or prefixes (MI250X rows only)")
    parser.add_argument("--calibration", type=Path, help="a calibration profile (what-if)")
    parser.add_argument("--ops", action="store_true",
                        help="the busiest stage's kernels by name, row by row")
    parser.add_argument("--shares", action="store_true",
                        help="each row's step by mechanism, in per cent")
    args = parser.parse_args(argv)
    prefixes = tuple(args.rows) or DEFAULT_ROWS
    try:
        runs = [r for r in load_runs() if r.id.startswith(prefixes)]
        if not runs or any(scenario_for(r).system.node.accelerator.name != "mi250x-gcd"
                           or r.metric != "iteration_time_s" for r in runs):
            raise UserError(f"rows {', '.join(prefixes)}: give ids or prefixes of MI250X "
                            "rows (LUMI23, LUMIRF25, FRONTIER, XMOE25)")
        if args.calibration is not None and not args.calibration.is_file():
            raise UserError(f"--calibration: no file {args.calibration}; give the path of a "
                            "calibration profile (llmsim calibrate writes one)")
        if args.ops and args.calibration is not None:
            raise UserError("--ops prices the kernels, which a calibration profile's "
                            "collective tables do not change; drop --calibration or --ops")
        if args.ops:
            print("\n\n".join(op_table(r, by_op(r)) for r in runs))
        elif args.shares:
            print(shares_table([decompose(r, args.calibration) for r in runs]))
        else:
            print(table([decompose(r, args.calibration) for r in runs]))
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
