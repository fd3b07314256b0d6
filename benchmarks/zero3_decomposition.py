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

from llmsim.costs import HardwareCosts, algorithm_times_s
from llmsim.errors import UserError
from llmsim.ops import CommOp
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
    post_step_s: float = 0.0
    """The gather of the persistent parameters after the optimizer step, with its slice
    copies and host loop, s (``parallelism.persistent_regather``; 0 without it)."""

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
    gathers = int(ops.name.str.startswith(gather.name.split("_c")[0] + "_c").sum())
    post = [workload.persistent_gather(s) for s in range(scenario.parallelism.pp)]
    post_step_s = sum(costs.comm_s(op) for op in post if op is not None)
    reduce_s = [costs.comm_s(replace(b, staging_passes=0)) for b in buckets]
    passes_s = [costs.comm_s(b) for b in buckets]
    share = (n - 1) / n
    bus = share * (gathers * gather.bytes + 2 * sum(b.bytes for b in buckets))
    return Decomposition(
        run.id, run.gpus, source_flops(run, result) / (run.measured * 1e12 * run.gpus),
        result.step_time_s, result.breakdown_s["compute"], gathers, bare_gather,
        gather.host_s, costs.comm_s(gather) - bare_gather - gather.host_s, len(buckets),
        sum(reduce_s) / len(buckets), (sum(passes_s) - sum(reduce_s)) / len(buckets), bus,
        post_step_s)


KINDS = {
    "compute": "compute and optimizer kernels (the GEMM and memory rates of the catalog)",
    "nccl_latency": "NCCL's step latencies, ring or tree as its tuner picks (tuning.cc of "
                    "2021; no measurement at 48-280 nodes)",
    "nccl_bandwidth": "NCCL's bus bandwidth term (tuner model: 8 ring channels derived from "
                      "NCCL's topology search, not from a log; HDR at the catalog's 0.9)",
    "launches": "kernel launches of the slice copies, fills, passes and collectives "
                "(accelerator.kernel_launch_us, an unverified 4 us)",
    "memory_passes": "the fill, copy-out and all-reduce staging passes through HBM",
    "host_per_call": "host time per gather that does not grow with the ranks (325 us, from "
                     "an 8-GPU profile, deepspeedai/DeepSpeed#1069)",
    "host_loops": "Python loops over the ranks: each gather's tensor list and the post-step "
                  "copy loop (2.4 us per rank, timed on the 2021 software)",
}
"""What each kind of :func:`by_kind` holds, and what its number rests on."""


def _nccl_parts(costs: HardwareCosts, op: CommOp) -> tuple[float, float]:
    """(latency, bandwidth) seconds of ``op``'s collective alone: the tuner's time is
    latency + bytes / bandwidth at the algorithm and protocol it picks, so doubling the
    message at that pick adds the bandwidth term once more (the messages here are past the
    tree's correction table and the ring plateau's threshold: both terms are linear)."""
    bare = replace(op, copies=0, fill_passes=0, staging_passes=0, host_s=0.0)
    model = costs.collectives
    t1 = model.comm_s(bare) - model.launch_s
    path = model.path(op.axis)
    if model.library is None or path is None:
        t2 = model.comm_s(replace(bare, bytes=2 * op.bytes)) - model.launch_s
        return 2 * t1 - t2, t2 - t1
    tuned = algorithm_times_s(op.collective, op.bytes, path, model.tuner_library)
    pick = min(tuned, key=tuned.__getitem__)  # the pick at 2S may differ: keep this one
    t2 = algorithm_times_s(op.collective, 2 * op.bytes, path, model.library)[pick]
    return 2 * t1 - t2, t2 - t1


def by_kind(run: Run) -> dict[str, float]:
    """A ZeRO-3 row's predicted step split into :data:`KINDS`, seconds per step on one
    device (every op on the device runs alone: their sum is the step), and ``step``."""
    scenario = scenario_for(run)
    if scenario.parallelism.zero != 3:
        raise UserError(f"row {run.id} runs ZeRO stage {scenario.parallelism.zero}, not 3; "
                        "give a ZeRO-3 row such as NAR21-T2-01")
    result = simulate(scenario)
    work, par = result.workload, scenario.parallelism
    costs = HardwareCosts.from_scenario(scenario, Plan.from_scenario(scenario))
    ops = result.to_dataframe()
    ops = ops[ops.device == ops.device.min()]
    gather = next(g for c in work.chunks.values() if (g := work.weight_gather(c)) is not None)
    gathers = int(ops.name.str.startswith(gather.name.split("_c")[0] + "_c").sum())
    counted = [(gather, gathers)] + [(b, 1) for c in work.chunks.values()
                                     for b in work.dp_grad_ops(c)]
    counted += [(op, 1) for s in range(par.pp) if (op := work.persistent_gather(s))]
    parts = dict.fromkeys(KINDS, 0.0)
    parts["compute"] = result.breakdown_s["compute"] + result.breakdown_s["optimizer"]
    launch_s, memory_bps = costs.compute.launch_s, costs.compute.memory_bytes_per_s
    per_call_s = par.tensor_list_host_us_per_call * 1e-6 if par.tensor_list_gathers else 0.0
    for op, times in counted:
        latency_s, bandwidth_s = _nccl_parts(costs, op)
        passes = 2 * (op.staging_passes + (1 if op.copies else 0)) + op.fill_passes
        call_s = per_call_s if op is gather else 0.0
        parts["nccl_latency"] += times * latency_s
        parts["nccl_bandwidth"] += times * bandwidth_s
        parts["launches"] += times * (costs.collectives.launch_s + launch_s * (
            op.copies + op.staging_passes + op.fill_passes))
        parts["memory_passes"] += times * passes * op.bytes / memory_bps
        parts["host_per_call"] += times * call_s
        parts["host_loops"] += times * (op.host_s - call_s)
    parts["step"] = result.step_time_s
    return parts


UNVERIFIED = {
    "launch_us": ("launches", 4.0),
    "host_us_per_rank": ("host_loops", 2.4),
    "host_us_per_call": ("host_per_call", 325.0),
    "nccl_latency_x": ("nccl_latency", 1.0),
    "nccl_time_per_byte_x": ("nccl_bandwidth", 1.0),
}
"""Each number the step rests on that no measurement at these scales fixes: the kind of
:data:`KINDS` it scales, and the value llmsim uses (a factor of 1 for NCCL's tuner)."""


def needed_alone(parts: dict[str, float], measured_s: float) -> dict[str, float]:
    """The value each of :data:`UNVERIFIED` would need, all others kept, for llmsim's
    step to equal ``measured_s``: the kind scales in proportion to its number, so the
    value is ``used · (1 + shortfall / kind's seconds)``."""
    short = measured_s - parts["step"]
    return {name: used * (1 + short / parts[kind]) for name, (kind, used) in UNVERIFIED.items()}


def by_kind_markdown(runs: list[Run]) -> str:
    """The per-kind tables of docs/validation.md: seconds per step by kind with the
    measured step's shortfall, and what each unverified number would need to be, alone,
    to close it."""
    head = ["row", "measured s", "llmsim s", *KINDS, "short s"]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    needs = ["", "| row | " + " | ".join(UNVERIFIED) + " |",
             "|---|" + "---:|" * len(UNVERIFIED)]
    for run in runs:
        parts = by_kind(run)
        measured = decompose(run).measured_s
        cells = [f"{parts[k]:.1f}" for k in KINDS]
        lines.append(f"| {run.id} | {measured:.1f} | {parts['step']:.1f} | "
                     + " | ".join(cells) + f" | {measured - parts['step']:.1f} |")
        need = needed_alone(parts, measured)
        needs.append(f"| {run.id} | " + " | ".join(f"{need[k]:.3g}" for k in UNVERIFIED)
                     + " |")
    return "\n".join(lines + needs)


def markdown(rows: list[Decomposition]) -> str:
    """The table docs/validation.md shows."""
    lines = ["| row | GPUs | measured s | llmsim s | compute s | gathers × ms (NCCL / host / "
             "copies, fill) | all-reduces × ms (NCCL / passes) | post-step s | short s "
             "| short per TB moved, s | bus GB/s: llmsim → needed |", "|---|" + "---:|" * 10]
    for d in rows:
        gather_ms = d.gather_nccl_s + d.gather_host_s + d.gather_copies_s
        reduce_ms = d.all_reduce_nccl_s + d.all_reduce_passes_s
        lines.append(
            f"| {d.id} | {d.gpus:,} | {d.measured_s:.1f} | {d.step_s:.1f} | {d.compute_s:.1f} "
            f"| {d.gathers:,} × {gather_ms * 1e3:.1f} ({d.gather_nccl_s * 1e3:.1f} / "
            f"{d.gather_host_s * 1e3:.1f} / {d.gather_copies_s * 1e3:.1f}) "
            f"| {d.all_reduces} × {reduce_ms * 1e3:.1f} ({d.all_reduce_nccl_s * 1e3:.1f} / "
            f"{d.all_reduce_passes_s * 1e3:.1f}) | {d.post_step_s:.1f} | {d.shortfall_s:.1f} "
            f"| {d.shortfall_s / (d.bus_bytes / 1e12):.1f} "
            f"| {d.model_bus_bytes_per_s / 1e9:.0f} → {d.needed_bus_bytes_per_s / 1e9:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("prefixes", nargs="*", default=["NAR21-T2"],
                        help="row id prefixes; their ZeRO-3 rows are taken (default: NAR21-T2)")
    parser.add_argument("--by-kind", action="store_true",
                        help="seconds per step by kind of cost (compute, NCCL latency and "
                             "bandwidth, launches, memory passes, host time) instead")
    args = parser.parse_args(argv)
    try:
        runs = [run for prefix in args.prefixes for run in load_runs(prefix)
                if run.value("parallelism.zero") == 3]
        if not runs:
            raise UserError(f"no ZeRO-3 validation row starts with {' or '.join(args.prefixes)}; "
                            "give one such as NAR21-T2-01")
        print(by_kind_markdown(runs) if args.by_kind
              else markdown([decompose(run) for run in runs]))
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
