"""Files written by ``llmsim run --out DIR``: result JSON, Perfetto trace, timeline PNG.

It reads a :class:`~llmsim.result.Result` (imported for type hints only: the result is
data and imports neither this module nor the plots at load time)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from llmsim.errors import UserError
from llmsim.trace import Record

if TYPE_CHECKING:
    from llmsim.result import Result

STREAMS = ("compute", "tp", "pp", "dp", "ep", "cp")
"""Thread of each stream in the trace: ``ep`` holds the MoE all-to-alls, ``cp`` the
context-parallel ring exchanges (both inside the passes)."""
MAX_OP_EVENTS = 200_000
"""Above this many per-op events the trace merges runs of adjacent ops (see
:func:`trace_records`)."""


def trace_records(result: Result, limit: int = MAX_OP_EVENTS) -> Iterable[Record]:
    """The trace file's records: :meth:`llmsim.trace.Trace.shown` at ``limit`` (per-op
    records when they are few enough, otherwise runs of adjacent ops merged; every stream
    keeps its activity, TP communication included)."""
    return result.trace.shown(limit)


def chrome_trace(result: Result) -> dict:
    """The step as Chrome trace-event JSON (loadable in ui.perfetto.dev).

    One process per simulated device (named by its pipeline stage), one thread per
    stream; times in microseconds.
    """
    events: list[dict] = []
    devices: set[int] = set()
    for r in trace_records(result):
        devices.add(r.device)
        events.append({
            "name": r.name, "cat": r.kind, "ph": "X", "pid": r.device,
            "tid": STREAMS.index(r.stream) if r.stream in STREAMS else len(STREAMS),
            "ts": r.start_s * 1e6, "dur": (r.end_s - r.start_s) * 1e6,
            "args": {"stage": r.stage, "microbatch": r.microbatch, "chunk": r.chunk},
        })
    stage_of = {r.device: r.stage for r in result.trace.records}
    for d in sorted(devices):
        events.append({"name": "process_name", "ph": "M", "pid": d,
                       "args": {"name": f"device {d} (stage {stage_of[d]})"}})
        for tid, stream in enumerate(STREAMS):
            events.append({"name": "thread_name", "ph": "M", "pid": d, "tid": tid,
                           "args": {"name": stream}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"scenario": result.scenario.name, "step_time_s": result.step_time_s}}


def write_outputs(result: Result, out_dir: Path) -> list[Path]:
    """Write result.json, trace.json and timeline.png into ``out_dir``."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"--out {out_dir}: cannot create the folder ({exc.strerror}); "
                        "choose a writable path") from None
    paths = [out_dir / "result.json", out_dir / "trace.json", out_dir / "timeline.png"]
    paths[0].write_text(result.to_json() + "\n", encoding="utf-8")
    paths[1].write_text(json.dumps(chrome_trace(result)), encoding="utf-8")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = result.plot_timeline()
    fig.savefig(paths[2], dpi=120, bbox_inches="tight")
    plt.close(fig)
    return paths
