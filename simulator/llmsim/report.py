"""The terminal report of a result (rich tables, a unit on every number)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from llmsim.costs.topology import placement_rows
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


def _overlaps(par: Parallelism) -> str:
    """The communication overlaps switched on, named as in the scenario."""
    names = [("DP", par.overlap_dp_comm), ("TP", par.overlap_tp_comm),
             ("PP", par.overlap_pp_comm), ("param gather", par.overlap_param_gather)]
    on = [name for name, flag in names if flag]
    return "overlap " + (", ".join(on) if on else "none")


def _kernel_switches(result: Result) -> str:
    """Framework behaviours switched away from their defaults that change this result."""
    s, work = result.scenario, result.workload
    par, trn = s.parallelism, s.training
    names = [
        ("no weight prefetch", not par.prefetch_weights
         and (work.zero == 3 or work.overlap_param_gather)),
        ("regather for recompute", work.regather_for_recompute),
        ("gather per module", work.gather_messages > 1),
        ("tensor-list gathers", work.gather_copies > 0),
        ("grad all-reduce", work.grad_all_reduce),
        ("separate bias kernels", trn.bias_kernels == "separate" and s.model.bias),
        ("attention layout copies", trn.attention_layout_copies
         and trn.fused_attention),
    ]
    return "".join(f", {name}" for name, on in names if on)


def _render_placement(result: Result, console: Console) -> None:
    """Where each parallel group sits: ranks per node, nodes, the network level and hops
    of its ring's steps, and its route (leaves / dragonfly groups / torus dimensions)."""
    rows = placement_rows(Plan.from_scenario(result.scenario))
    if not rows:
        return
    table = Table(title="Placement (the worst group of each axis)", title_justify="left")
    for col in ("axis", "size", "ranks", "per node", "nodes", "level", "hops", "route"):
        table.add_column(col, justify="right" if col in ("size", "per node", "nodes", "hops")
                         else "left")
    for row in rows:
        table.add_row(str(row["axis"]), f"{row['degree']:,}", str(row["ranks"]),
                      str(row["per_node"]), f"{row['nodes']:,}", str(row["level"]),
                      str(row["hops"]), str(row["route"]))
    console.print(table)


def render(result: Result, console: Console) -> None:
    """Print the summary, the step breakdown, the per-stage view and memory."""
    s = result.scenario
    par = s.parallelism
    accel = s.system.node.accelerator
    console.print(
        f"[bold]{s.name}[/bold]: {s.model.name} ({s.model.params / 1e9:,.1f} B params) on "
        f"{s.devices:,} × {accel.name} ({s.nodes_used:,} nodes of {s.system.name})"
    )
    console.print(
        f"layout: tp {par.tp} · pp {par.pp} · dp {s.dp}"
        + (f" · {par.virtual_stages} chunks/stage" if par.virtual_stages > 1 else "")
        + _stage_split(stage_layers(s.model.layers, par))
        + f", {par.schedule}, {s.micro_batches} micro-batches of {par.micro_batch} × "
        f"{s.training.seq_len:,} tokens, ZeRO-{par.zero}, recompute {par.recompute}, "
        f"{s.training.precision}, {_overlaps(par)}{_kernel_switches(result)}"
    )
    summary = Table(title="Step", show_header=False, title_justify="left")
    summary.add_column("metric")
    summary.add_column("value", justify="right")
    peak = result.peak_flops_per_device / 1e12
    rows = [
        ("step time", fmt_seconds(result.step_time_s)),
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
             "dp_comm": "exposed DP comm", "bubble": "pipeline bubble / wait",
             "optimizer": "optimizer"}
    for key, value in result.breakdown_s.items():
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
    for warning in result.warnings:
        console.print(f"[yellow]warning:[/yellow] {warning}")
