"""Timeline (Gantt) of one simulated step: passes, collectives and the bubbles between."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from llmsim.result import Result

COLOURS = {
    "F": "#4c72b0", "R": "#8172b3", "B": "#dd8452", "W": "#55a868", "O": "#937860",
    "D": "#ccb974", "tp": "#c44e52", "pp": "#da8bc3", "dp": "#8c8c8c",
}
LABELS = {"F": "forward", "R": "recompute", "B": "backward (input grad)",
          "W": "backward (weight grad)", "O": "optimizer",
          "D": "gradient bucket checks", "tp": "TP comm",
          "pp": "PP send/recv", "dp": "DP / ZeRO comm"}


def _colour_key(stream: str, kind: str) -> str:
    return kind if stream == "compute" else stream


def plot_timeline(result: Result, ax: Any = None, max_devices: int = 16) -> Any:
    """Draw one row per device and stream; idle gaps on the compute row are bubbles."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    if ax is None:
        rows = min(max_devices, len({r.device for r in result.trace.records}))
        _, ax = plt.subplots(figsize=(12, 1.0 + 0.55 * rows * 2))
    devices = sorted({r.device for r in result.trace.records})[:max_devices]
    streams = ("compute", "tp", "pp", "dp")
    used = sorted({(r.device, r.stream) for r in result.trace.records if r.device in devices}
                  | {(d, "tp") for d in devices if result.scenario.parallelism.tp > 1},
                  key=lambda k: (k[0], streams.index(k[1])))
    row = {key: i for i, key in enumerate(used)}
    bars: dict[str, list[tuple[float, float, int]]] = {}
    for r in result.trace.shown(limit=50_000):
        key = (r.device, "tp" if r.stream not in streams else r.stream)
        if key not in row:
            continue
        colour = _colour_key(key[1], r.kind)
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
    ax.legend(handles=[Patch(color=COLOURS[k], label=LABELS[k]) for k in COLOURS if k in bars],
              loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=4, fontsize=8, frameon=False)
    return ax
