"""Timeline (Gantt) of one simulated step: passes, collectives and the bubbles between."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable

    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from llmsim.result import Result
    from llmsim.trace import Record

COLOURS = {
    "F": "#4c72b0", "R": "#8172b3", "B": "#dd8452", "W": "#55a868", "O": "#937860",
    "D": "#ccb974", "tp": "#c44e52", "pp": "#da8bc3", "dp": "#8c8c8c",
    "ep": "#64b5cd", "cp": "#e5ae38",
}
LABELS = {"F": "forward", "R": "recompute", "B": "backward (input grad)",
          "W": "backward (weight grad)", "O": "optimizer",
          "D": "gradient bucket checks", "tp": "TP comm",
          "pp": "PP send/recv", "dp": "DP / ZeRO comm", "ep": "MoE all-to-all",
          "cp": "CP ring exchange"}
MAX_BARS = 50_000
"""Above this many per-op bars the timeline draws each pass as one bar and keeps the
collectives inside the passes (TP, the MoE all-to-alls, the CP ring) op by op; above it
again, runs of adjacent ops are merged (:meth:`llmsim.trace.Trace.shown`)."""


def _colour_key(stream: str, kind: str) -> str:
    return kind if stream == "compute" else stream


def _blocking_comm(result: Result) -> bool:
    """Whether the passes hold collectives (TP, MoE all-to-alls, the CP ring): a row."""
    par = result.scenario.parallelism
    return par.tp > 1 or par.ep > 1 or par.cp > 1


def _bars(result: Result) -> Iterable[Record]:
    """The records drawn: per op up to :data:`MAX_BARS`. Above it, one bar per pass on
    the compute row, the records outside the passes (pipeline sends, DP and ZeRO
    collectives) as they are, and the collectives inside the passes (TP, the MoE
    all-to-alls, the CP ring) op by op (``frontier-moe``: 71,000 ops, 22,000 such bars), or,
    where they are too many, in runs of adjacent ones of a kind, micro-batch and chunk
    (:func:`llmsim.trace.merged_runs`: ``openai-a100-moe``'s 64,900 become 32,500; a run's
    bar spans the gaps between its ops)."""
    from llmsim.trace import merged_runs

    trace = result.trace
    if trace.op_count() <= MAX_BARS:
        return trace.expand()
    passes = [r for r in trace.records if r.stream == "compute"]
    outside = [r for r in trace.records if r.stream != "compute"]
    kept = set(outside)
    inside = [r for r in trace.expand() if r.stream != "compute" and r not in kept]
    room = MAX_BARS - len(passes) - len(outside)
    if len(inside) <= room:
        return passes + outside + inside
    if room <= 0:
        return trace.shown(limit=MAX_BARS)
    return passes + outside + list(merged_runs(inside, -(-len(inside) // room)))


def plot_timeline(result: Result, ax: Axes | None = None, max_devices: int = 16) -> Figure:
    """Draw one row per device and stream; idle gaps on the compute row are bubbles.

    Returns the figure. Without ``ax`` it is a new figure whose legend, below the chart,
    is part of its constrained layout, so ``fig.savefig(path)`` saves it whole. With
    ``ax`` the chart and its legend (below those axes) go there and ``ax.figure`` is
    returned; give that figure ``layout="constrained"`` for it to save whole too.
    Only the first ``max_devices`` devices are drawn."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch


    own_figure = ax is None
    if ax is None:  # constrained layout keeps the legend below inside the saved figure
        rows = min(max_devices, len({r.device for r in result.trace.records}))
        _, ax = plt.subplots(figsize=(12, 1.5 + 0.55 * rows * 2), layout="constrained")
    devices = sorted({r.device for r in result.trace.records})[:max_devices]
    streams = ("compute", "tp", "pp", "dp")
    used = sorted({(r.device, r.stream) for r in result.trace.records if r.device in devices}
                  | {(d, "tp") for d in devices if _blocking_comm(result)},
                  key=lambda k: (k[0], streams.index(k[1])))
    row = {key: i for i, key in enumerate(used)}
    bars: dict[str, list[tuple[float, float, int]]] = {}
    for r in _bars(result):
        key = (r.device, "tp" if r.stream not in streams else r.stream)
        if key not in row:
            continue
        # all-to-alls and ring exchanges share the TP row, in their own colours
        colour = _colour_key(r.stream if r.stream in ("ep", "cp") else key[1], r.kind)
        bars.setdefault(colour, []).append((r.start_s, r.end_s - r.start_s, row[key]))
    for colour, items in bars.items():
        by_row: dict[int, list[tuple[float, float]]] = {}
        for start, width, y in items:
            by_row.setdefault(y, []).append((start, width))
        for y, spans in by_row.items():
            ax.broken_barh(spans, (y - 0.4, 0.8), facecolors=COLOURS.get(colour, "#333333"),
                           linewidth=0)
    stage_of = {r.device: r.stage for r in result.trace.records}
    ax.set_yticks(range(len(used)))
    ax.set_yticklabels([f"stage {stage_of[d]} · {s}" for d, s in used], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, result.step_time_s)
    ax.set_xlabel("time in step (s)")
    ax.set_title(f"{result.scenario.name}: one step, {result.step_time_s:.3f} s "
                 f"(bubble {100 * result.bubble_fraction:.1f} %)")
    handles = [Patch(color=COLOURS[k], label=LABELS[k]) for k in COLOURS if k in bars]
    if own_figure:
        ax.figure.legend(handles=handles, loc="outside lower center", ncol=4, fontsize=8,
                         frameon=False)
    else:
        ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=4,
                  fontsize=8, frameon=False)
    return ax.figure
