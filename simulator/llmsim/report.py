"""The terminal report of a result (rich tables, a unit on every number)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from llmsim import hetero, hetero_replicas
from llmsim.band_rules import COVERAGE_PCT
from llmsim.calendar import CalendarSummary
from llmsim.calendar.energy import JOULES_PER_KWH
from llmsim.calendar.stragglers import StepSpread
from llmsim.costs.topology import job_shape_line, placement_rows
from llmsim.partition import stage_layers
from llmsim.plan import Plan
from llmsim.result import Result
from llmsim.specs import Parallelism


def _fmt_days(days: float | None) -> str:
    return "—" if days is None else f"{days:,.1f} days"


def fmt_seconds(seconds: float) -> str:
    """A duration with a unit that keeps three significant digits readable."""
    if seconds == 0:
        return "0 s"
    if seconds < 1e-3:
        return f"{seconds * 1e6:,.1f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:,.1f} ms"
    return f"{seconds:,.3f} s"


def _stages_to_show(count: int) -> list[int]:
    """All stages when few; otherwise the first, the last and every eighth."""
    if count <= 8:
        return list(range(count))
    return sorted({0, count - 1, *range(0, count, max(1, count // 6))})


def _stage_split(layers: list[int]) -> str:
    """``' · layers 5 + 10×6 + 5'`` for an uneven split, '' for an even one."""
    if len(set(layers)) <= 1:
        return ""
    middle = layers[1:-1]
    parts = [str(layers[0])]
    if middle:
        parts.append(f"{len(middle)}×{middle[0]}" if len(set(middle)) == 1
                     else " + ".join(map(str, middle)))
    parts.append(str(layers[-1]))
    return " · layers " + " + ".join(parts)


def _runs(layers: list[int]) -> str:
    """``'2 + 3×14 + 1×53 + 2×15'``: a split as runs of equal counts."""
    runs: list[list[int]] = []
    for n in layers:
        if runs and runs[-1][0] == n:
            runs[-1][1] += 1
        else:
            runs.append([n, 1])
    return " + ".join(str(n) if k == 1 else f"{n}×{k}" for n, k in runs)


def _overlaps(par: Parallelism) -> str:
    """The communication overlaps switched on, named as in the scenario."""
    names = [("DP", par.overlap_dp_comm), ("TP", par.overlap_tp_comm),
             ("PP", par.overlap_pp_comm), ("param gather", par.overlap_param_gather),
             ("all-to-all" + (f" ({par.moe_comm_units} units held)" if par.moe_comm_units
                              else ""), par.moe_a2a_overlap)]
    on = [name for name, flag in names if flag]
    return "overlap " + (", ".join(on) if on else "none")


def _kernel_switches(result: Result) -> str:
    """Framework behaviours switched away from their defaults that change this result."""
    s, work = result.scenario, result.workload
    par, trn = s.parallelism, s.training
    names = [
        ("no weight prefetch", not par.prefetch_weights
         and (work.zero == 3 or work.overlap_param_gather)),
        ("weight prefetch in the forward only", par.prefetch_weights == "forward"
         and (work.zero == 3 or work.overlap_param_gather)),
        ("regather for recompute", work.regather_for_recompute),
        ("gather per module", work.gather_messages > 1),
        ("gathers per call", work.gather_calls > 1),
        ("reductions in the backward", work.unit_reductions > 0),
        ("tensor-list gathers", work.gather_copies > 0),
        ("grad all-reduce", work.grad_all_reduce),
        ("separate bias kernels", trn.bias_kernels == "separate" and s.model.bias),
        ("attention layout copies", trn.attention_layout_copies
         and trn.fused_attention),
    ]
    return "".join(f", {name}" for name, on in names if on)


def _render_groups(result: Result, console: Console) -> None:
    """A heterogeneous job's node groups: the stages, layers, nodes and devices of each,
    and the pipeline sends across their borders (:mod:`llmsim.hetero`)."""
    s = result.scenario
    rule = ("balanced by throughput" if s.placement and s.placement.balance == "throughput"
            else "as given")
    table = Table(title=f"Node groups of {s.system.name} (layers {rule})",
                  title_justify="left")
    for col in ("group", "stages", "layers per stage", "nodes", "devices", "accelerator",
                "network"):
        table.add_column(col, justify="right" if col in ("nodes", "devices") else "left")
    for row in hetero.group_rows(s):
        table.add_row(str(row["group"]), str(row["stages"]),
                      ", ".join(map(str, row["layers"])),  # type: ignore[call-overload]
                      f"{row['nodes']:,} of {row['of_nodes']:,}", f"{row['devices']:,}",
                      str(row["accelerator"]), str(row["network"]))
    console.print(table)
    for b in hetero.border_sends(s, result.workload.pp_message_bytes):
        console.print(f"between groups: a pipeline send from stage {b['stage']} ({b['from']}) "
                      f"to {b['stage'] + 1} ({b['to']}) takes {fmt_seconds(b['across_s'])}, "
                      f"the slower side's path ({b['from']}: {fmt_seconds(b['from_s'])}, "
                      f"{b['to']}: {fmt_seconds(b['to_s'])})")


def _micro_batches(result: Result) -> str:
    """Micro-batches per pipeline: one number, or per replica on node groups (ranges)."""
    if not isinstance(result, hetero_replicas.ReplicasResult):
        return str(result.scenario.micro_batches)
    return "–".join(str(m) for m in sorted({min(result.split), max(result.split)}))


def _render_replica_groups(result: hetero_replicas.ReplicasResult, console: Console) -> None:
    """A job of data-parallel replicas on node groups: each group's replicas, their
    micro-batches and simulated steps, and the gradient reduction across the groups
    (:mod:`llmsim.hetero_replicas`)."""
    s = result.scenario
    assert s.placement is not None
    rule = "balanced by throughput" if s.placement.balance == "throughput" else "as given"
    table = Table(title=f"Node groups of {s.system.name} (data-parallel replicas, "
                        f"micro-batches {rule})", title_justify="left")
    for col in ("group", "replicas", "micro-batches each", "replica's step", "nodes",
                "devices", "accelerator", "network"):
        table.add_column(col, justify="left" if col in ("group", "accelerator", "network")
                         else "right")
    for row in hetero_replicas.group_rows(result):
        table.add_row(str(row["group"]), str(row["replicas"]),
                      ", ".join(map(str, row["micro_batches"])),  # type: ignore[call-overload]
                      ", ".join(map(fmt_seconds, row["step_s"])),  # type: ignore[call-overload]
                      f"{row['nodes']:,} of {row['of_nodes']:,}", f"{row['devices']:,}",
                      str(row["accelerator"]), str(row["network"]))
    console.print(table)
    bucket = hetero_replicas.gradient_bucket(result)
    if bucket is not None:
        sides = ", ".join(f"{g}: {fmt_seconds(t)}"
                          for g, t in bucket["per_group_s"].items())  # type: ignore[attr-defined]
        console.print(f"between groups: a gradient bucket's {bucket['collective']} "
                      f"({bucket['bytes'] / 1e6:,.1f} MB, stage 0) takes "
                      f"{fmt_seconds(bucket['across_s'])}, the slowest group's path ({sides}); "
                      "the step waits for the slowest replica")


def _render_placement(result: Result, console: Console) -> None:
    """Where each parallel group sits: ranks per node, nodes, the network level and hops
    of its ring's steps, and its route (leaves / dragonfly groups / torus dimensions)."""
    s = result.scenario
    if isinstance(result, hetero_replicas.ReplicasResult):
        _render_replica_groups(result, console)
    elif s.placement is not None:
        _render_groups(result, console)
    if s.placement is not None:
        for name in s.group_systems():
            system = hetero.job_system(s, name)
            plan = Plan(system, s.devices // system.node.devices_per_node, s.parallelism, s.dp)
            _placement_table(placement_rows(plan), console, f" on group {name}")
        return
    plan = Plan.from_scenario(s)
    _placement_table(placement_rows(plan), console)
    shape = job_shape_line(plan)
    if shape is not None:
        console.print(f"torus: {shape}")


def _placement_table(rows: list[dict[str, object]], console: Console, where: str = "") -> None:
    """The placement table of :func:`_render_placement`."""
    if not rows:
        return
    table = Table(title=f"Placement{where} (the worst group of each axis)",
                  title_justify="left")
    for col in ("axis", "size", "ranks", "per node", "nodes", "level", "hops", "route"):
        table.add_column(col, justify="right" if col in ("size", "per node", "nodes", "hops")
                         else "left")
    for row in rows:
        table.add_row(str(row["axis"]), f"{row['degree']:,}", str(row["ranks"]),
                      str(row["per_node"]), f"{row['nodes']:,}", str(row["level"]),
                      str(row["hops"]), str(row["route"]))
    console.print(table)


def render(result: Result, console: Console, error_band: str | None = None) -> None:
    """Print the summary, the step breakdown, the per-stage view and memory;
    ``error_band`` is the measured step time to expect (:mod:`llmsim.error_band`)."""
    s = result.scenario
    par = s.parallelism
    accel = s.system.node.accelerator
    machine = (f"{s.devices:,} × {accel.name} ({s.nodes_used:,} nodes of {s.system.name})"
               if s.placement is None else " + ".join(
                   f"{d:,} × {s.system.group(g).node.accelerator.name} ({n:,} nodes)"
                   for g, (n, d) in s.group_nodes().items()) + f" of {s.system.name}")
    console.print(
        f"[bold]{s.name}[/bold]: {s.model.name} ({s.model.params / 1e9:,.1f} B params"
        + (f", {s.model.active_params_per_token / 1e9:,.1f} B active per token"
           if s.model.moe is not None else "")
        + (f", multi-token prediction depth {s.model.mtp_depth} "
           f"(+{s.model.mtp_params / 1e9:,.1f} B)" if s.model.mtp_depth else "")
        + ") on " + machine
    )
    console.print(
        f"layout: tp {par.tp} · pp {par.pp} · dp {s.dp}"
        + "".join(f" · {a} {d}" for a, d in (("cp", par.cp), ("ep", par.ep)) if d > 1)
        + (f" · expert tp {par.etp}" if par.etp != par.tp else "")
        + (f" · {par.moe_dispatcher} dispatch" if par.moe_dispatcher != "alltoall" else "")
        + (f", tokens to ≤ {par.moe_max_nodes} nodes" if par.moe_max_nodes else "")
        + (f" · {par.virtual_stages} chunks/stage" if par.virtual_stages > 1 else "")
        + (_stage_split(stage_layers(s.model.layers, par)) if s.placement is None
           else " · layers " + _runs(stage_layers(s.model.layers, par)))
        + f", {par.schedule}, {_micro_batches(result)} micro-batches of {par.micro_batch} × "
        f"{s.training.seq_len:,} tokens, ZeRO-{par.zero}, recompute {par.recompute}"
        + (" (+ norms, MLA up-projections)" if par.recompute_norms_and_up_proj else "")
        + f", {s.training.precision}"
        + (" (expert activations cached in FP8)" if s.training.fp8_activation_cache else "")
        + f", {_overlaps(par)}{_kernel_switches(result)}"
    )
    summary = Table(title="Step", show_header=False, title_justify="left")
    summary.add_column("metric")
    summary.add_column("value", justify="right")
    peak = result.peak_flops_per_device / 1e12
    rows = [
        ("step time", fmt_seconds(result.step_time_s)),
        *([(f"likely measured ({COVERAGE_PCT} %)", error_band)] if error_band else []),
        ("throughput", f"{result.tokens_per_s:,.0f} tokens/s"),
        ("model FLOPs per device", f"{result.model_tflops_per_device:,.1f} TFLOP/s"),
        ("MFU", f"{100 * result.mfu:.1f} % of {peak:,.1f} TFLOP/s"),
        ("HFU", f"{100 * result.hfu:.1f} %"),
        ("pipeline bubble", f"{100 * result.bubble_fraction:.1f} % (mean over stages)"),
        ("days to train", _fmt_days(result.days_to_train)
         + (f" ({s.training.flops:.1e} FLOPs)" if s.training.flops else
            f" ({s.training.tokens:.2e} tokens)" if s.training.tokens else "")),
    ]
    for name, value in rows:
        summary.add_row(name, value)
    console.print(summary)
    _render_placement(result, console)

    crit = result.critical_stage
    parts = Table(title=f"Where the time goes (stage {crit.stage}, the busiest)",
                  title_justify="left")
    parts.add_column("part")
    parts.add_column("time", justify="right")
    parts.add_column("share", justify="right")
    names = {"compute": "compute", "tp_comm": "exposed TP comm", "pp_comm": "exposed PP comm",
             "dp_comm": "exposed DP comm", "ep_all_to_all": "EP all-to-all (MoE)",
             "cp_comm": "exposed CP ring exchange",
             "bubble": "pipeline bubble / wait",
             "optimizer": "optimizer"}
    for key, value in result.breakdown_s.items():
        if key in ("ep_all_to_all", "cp_comm") and value == 0.0:
            continue  # no expert or context parallelism: nothing to show
        parts.add_row(names[key], fmt_seconds(value), f"{100 * value / result.step_time_s:.1f} %")
    console.print(parts)

    mem = Table(title="Memory per device, GB", title_justify="left")
    for col in ("stage", "weights", "grads", "optim.", "activ.", "buffers+reserve", "total",
                "capacity", "fits"):
        mem.add_column(col, justify="right")
    for stage in _stages_to_show(len(result.memory)):
        m = result.memory[stage]
        gb = m.as_gb()
        other = gb["buffers_gb"] + gb["reserve_gb"]
        mem.add_row(str(m.stage), f"{gb['weights_gb']:.1f}", f"{gb['grads_gb']:.1f}",
                    f"{gb['optimizer_gb']:.1f}", f"{gb['activations_gb']:.1f}",
                    f"{other:.1f}", f"{gb['total_gb']:.1f}", f"{gb['capacity_gb']:.0f}",
                    "yes" if m.fits else "[red]NO[/red]")
    console.print(mem)
    if s.model.moe is not None:
        most = max(result.memory, key=lambda m: m.expert_state_bytes)
        split = f"ep {par.ep}" if par.etp == par.tp else \
            f"whole, over tp·ep = {par.expert_ranks} ranks" if par.etp == 1 else \
            f"each over {par.etp} TP ranks, over tp/{par.etp}·ep = {par.expert_ranks} ranks"
        console.print(f"routed experts: {s.model.moe.experts // par.expert_ranks} of "
                      f"{s.model.moe.experts} per device and MoE layer ({split}); "
                      f"{most.expert_state_bytes / 1e9:.1f} GB of stage {most.stage}'s "
                      f"{most.model_state_bytes / 1e9:.1f} GB of model state")
    for warning in result.warnings:
        console.print(f"[yellow]warning:[/yellow] {warning}")


def _fmt_hours(seconds: float) -> str:
    """A long duration: seconds below a minute, then minutes, then hours."""
    if seconds == float("inf"):
        return "never"
    if seconds < 60:
        return fmt_seconds(seconds)
    return f"{seconds / 60:,.1f} min" if seconds < 3600 else f"{seconds / 3600:,.2f} h"


def render_step_spread(spread: StepSpread, days_to_train: float | None, step_s: float,
                       console: Console) -> None:
    """Print the step time's mean and tail over seeded steps with jitter
    (llmsim.costs.jitter); ``step_s`` is the reported step (step 0's draws)."""
    table = Table(title=f"Step time with jitter ({len(spread.step_times_s)} seeded steps)",
                  show_header=False, title_justify="left")
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows = [
        ("without noise", fmt_seconds(spread.deterministic_s)),
        ("mean", f"{fmt_seconds(spread.mean_s)} ({100 * (spread.slowdown - 1):+.1f} %)"),
        ("p50 / p90 / p99", " / ".join(fmt_seconds(spread.percentile_s(q))
                                       for q in (50, 90, 99))),
    ]
    if days_to_train is not None:
        rows.append(("days to train at the mean step",
                     _fmt_days(days_to_train * spread.mean_s / step_s)))
    for name, value in rows:
        table.add_row(name, value)
    console.print(table)


def render_calendar(cal: CalendarSummary, console: Console) -> None:
    """Print the whole run: calendar days with their spread, goodput, failures, the
    checkpoint plan and the energy (llmsim.calendar)."""
    table = Table(title="Whole run (failures, checkpoints, energy)", show_header=False,
                  title_justify="left")
    table.add_column("metric")
    table.add_column("value", justify="right")
    c, p = cal.checkpoint, cal.plan
    mode = "asynchronous" if p.write_s > 0 else "synchronous"
    rows = [
        ("days to train (no interruptions)", _fmt_days(cal.days_to_train)),
        ("calendar days (expected)", _fmt_days(cal.calendar_days)),
        ("calendar days (Monte Carlo)", f"median {cal.days_median:,.1f}, 10–90 % "
         f"{cal.days_p10:,.1f}–{cal.days_p90:,.1f} ({cal.runs:,} runs, seed {cal.seed})"),
        ("goodput", f"{100 * cal.goodput:.1f} % of wall time"),
        ("interruptions", f"{cal.failures.per_day:,.2f} per day (MTBF "
         f"{_fmt_hours(cal.failures.mtbf_s)}), {cal.expected.failures:,.0f} expected"),
        ("checkpoint", f"{c.total_bytes / 1e12:,.2f} TB, write {fmt_seconds(c.write_s)}, "
         f"read {fmt_seconds(c.read_s)} ({c.storage})"),
        ("checkpoint plan", f"every {_fmt_hours(p.interval_s)}, {mode}, stops training "
         f"{fmt_seconds(p.checkpoint_s)}, {p.checkpoints():,} checkpoints"),
        ("restart", f"{fmt_seconds(p.restart_s)} (relaunch and read)"),
    ]
    if cal.energy is not None and cal.step is not None:
        e = cal.energy
        rows += [
            ("energy per step", f"{cal.step.total_j / JOULES_PER_KWH:,.1f} kWh "
             f"({cal.step.power_w / 1e6:,.2f} MW, "
             + (f"PUE {cal.step.pue:.2f}" if cal.step.pue > 1 else "cooling not counted")
             + (", accelerators only)" if cal.step.nodes_j == 0 else ")")),
            ("energy of the run", f"{e.mwh:,.0f} MWh, {e.tonnes_co2:,.0f} t CO₂ at "
             f"{e.gco2_per_kwh:,.0f} g/kWh, ${e.cost:,.0f} at ${e.price_per_kwh:.3f}/kWh"),
        ]
    else:
        rows.append(("energy", "— (the accelerator has no power figures)"))
    for name, value in rows:
        table.add_row(name, value)
    console.print(table)
    if cal.plan.rate_per_s > 0 and not c.has_storage:
        console.print("[yellow]warning:[/yellow] the system has no storage in the catalog, so "
                      "checkpoint times are bounded only by each node's network injection "
                      "(optimistic); give system.storage (write_gbps, read_gbps)")
