"""Where llmsim's step of a ZeRO-3 validation row goes, op by op, beside the measured step
(docs/validation.md, section 1, "Round six: the step taken apart").

    python benchmarks/zero3_decomposition.py              # NAR21-T2-01 ... -06
    python benchmarks/zero3_decomposition.py NAR21-T2-06  # rows whose id starts with it

Prints one Markdown table: the measured step (the source's TFLOP/s turned into seconds with
its own FLOP formula), llmsim's step and compute, each weight all-gather and gradient
all-reduce split into what prices it (NCCL's tuner-model time; the host time before the
call; the tensor-list copies and zero-fill; the fallback's three passes), the time llmsim is
short of the measurement, and the bus bandwidth the collectives would need for the
measured step if all of the shortfall were theirs: their bus volume (every rank receives
(n - 1)/n of each gathered message; an all-reduce moves twice that) over their NCCL time
plus the shortfall. About 1-3 s per row on one core.
"""

import argparse
import sys
from dataclasses import dataclass, replace

from llmsim.costs import HardwareCosts
from llmsim.errors import UserError
from llmsim.plan import Plan
from llmsim.simulation import simulate
from llmsim.validation import load_runs, scenario_for
from llmsim.validation.predictions import source_flops
from llmsim.validation.runs import Run


@dataclass(frozen=True, slots=True)
class Decomposition:
    """One ZeRO-3 row's predicted step, by part, beside its measured step."""

    id: str
    gpus: int
    measured_s: float
    """The measured step, s: the source's FLOPs per step over its TFLOP/s and GPUs."""
    step_s: float
    compute_s: float
    gathers: int
    """Weight all-gathers per step on one device."""
    gather_nccl_s: float
    """One gather's collective alone (NCCL's tuner model), s."""
    gather_host_s: float
    """Host time before one gather (list loop, call), s."""
    gather_copies_s: float
    """One gather's tensor-list copies and zero-fill, s."""
    all_reduces: int
    all_reduce_nccl_s: float
    """One gradient all-reduce's collective alone, s (mean over the chunk's buckets)."""
    all_reduce_passes_s: float
    """One all-reduce's flatten, scale and copy-back passes, s."""
    bus_bytes: float
    """Bytes the step's collectives move per rank, nccl-tests' bus convention."""

    @property
    def shortfall_s(self) -> float:
        """Measured step less llmsim's, s."""
        return self.measured_s - self.step_s

    @property
    def nccl_s(self) -> float:
        """The step's collectives alone, s."""
        return self.gathers * self.gather_nccl_s + self.all_reduces * self.all_reduce_nccl_s

    @property
    def model_bus_bytes_per_s(self) -> float:
        """The bus bandwidth llmsim's collectives run at, latency included, bytes/s."""
        return self.bus_bytes / self.nccl_s

    @property
    def needed_bus_bytes_per_s(self) -> float:
        """The bus bandwidth that would give the measured step if all of the shortfall
        were the collectives', bytes/s."""
        return self.bus_bytes / (self.nccl_s + self.shortfall_s)


def decompose(run: Run) -> Decomposition:
    """The decomposition of a ZeRO-3 row (``parallelism.zero: 3``)."""
    scenario = scenario_for(run)
    if scenario.parallelism.zero != 3:
        raise UserError(f"row {run.id} runs ZeRO stage {scenario.parallelism.zero}, not 3; "
                        "give a ZeRO-3 row such as NAR21-T2-01")
    result = simulate(scenario)
    workload = result.workload
    costs = HardwareCosts.from_scenario(scenario, Plan.from_scenario(scenario))
    ops = result.to_dataframe()
    ops = ops[ops.device == ops.device.min()]
    gather, buckets, n = None, [], workload.dp
    for chunk in workload.chunks.values():
        gather = gather or workload.weight_gather(chunk)
        buckets += workload.dp_grad_ops(chunk)
    assert gather is not None  # a ZeRO-3 chunk gathers its weights
    bare_gather = costs.comm_s(replace(gather, copies=0, fill_passes=0, host_s=0.0))
    gathers = int(ops.name.str.startswith(gather.name.split("_c")[0] + "_").sum())
    reduce_s = [costs.comm_s(replace(b, staging_passes=0)) for b in buckets]
    passes_s = [costs.comm_s(b) for b in buckets]
    share = (n - 1) / n
    bus = share * (gathers * gather.bytes + 2 * sum(b.bytes for b in buckets))
    return Decomposition(
        run.id, run.gpus, source_flops(run, result) / (run.measured * 1e12 * run.gpus),
        result.step_time_s, result.breakdown_s["compute"], gathers, bare_gather,
        gather.host_s, costs.comm_s(gather) - bare_gather - gather.host_s, len(buckets),
        sum(reduce_s) / len(buckets), (sum(passes_s) - sum(reduce_s)) / len(buckets), bus)


def markdown(rows: list[Decomposition]) -> str:
    """The table docs/validation.md shows."""
    lines = ["| row | GPUs | measured s | llmsim s | compute s | gathers × ms (NCCL / host / "
             "copies, fill) | all-reduces × ms (NCCL / passes) | short s | short per TB moved, s "
             "| bus GB/s: llmsim → needed |", "|---|" + "---:|" * 9]
    for d in rows:
        gather_ms = d.gather_nccl_s + d.gather_host_s + d.gather_copies_s
        reduce_ms = d.all_reduce_nccl_s + d.all_reduce_passes_s
        lines.append(
            f"| {d.id} | {d.gpus:,} | {d.measured_s:.1f} | {d.step_s:.1f} | {d.compute_s:.1f} "
            f"| {d.gathers:,} × {gather_ms * 1e3:.1f} ({d.gather_nccl_s * 1e3:.1f} / "
            f"{d.gather_host_s * 1e3:.1f} / {d.gather_copies_s * 1e3:.1f}) "
            f"| {d.all_reduces} × {reduce_ms * 1e3:.1f} ({d.all_reduce_nccl_s * 1e3:.1f} / "
            f"{d.all_reduce_passes_s * 1e3:.1f}) | {d.shortfall_s:.1f} "
            f"| {d.shortfall_s / (d.bus_bytes / 1e12):.1f} "
            f"| {d.model_bus_bytes_per_s / 1e9:.0f} → {d.needed_bus_bytes_per_s / 1e9:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("prefixes", nargs="*", default=["NAR21-T2"],
                        help="row id prefixes; their ZeRO-3 rows are taken (default: NAR21-T2)")
    args = parser.parse_args(argv)
    try:
        runs = [run for prefix in args.prefixes for run in load_runs(prefix)
                if run.value("parallelism.zero") == 3]
        if not runs:
            raise UserError(f"no ZeRO-3 validation row starts with {' or '.join(args.prefixes)}; "
                            "give one such as NAR21-T2-01")
        print(markdown([decompose(run) for run in runs]))
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
