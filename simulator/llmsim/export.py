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
    """Per-op records when they are few enough; otherwise every run of up to ``k``
    consecutive ops of one device and stream that share their kind, micro-batch and chunk
    becomes one record from the first op's start to the last one's end, named after the
    first with ``(+n)`` for the others, ``k`` the factor that brings the count near
    ``limit``. Every stream keeps its activity (TP communication included)."""
    trace = result.trace
    per_op = sum(1 if block is None else len(block.spans)
                 for block in map(trace.block_finder(), trace.records))
    if per_op <= limit:
        return trace.expand()
    return _merged(trace.expand(), -(-per_op // limit))


def _merged(records: Iterable[Record], k: int) -> Iterable[Record]:
    """Runs of up to ``k`` adjacent records of one (device, stream) and kind, micro-batch
    and chunk, each as one record spanning them."""
    runs: dict[tuple[int, str], list[Record]] = {}

    def joined(run: list[Record]) -> Record:
        first = run[0]
        name = first.name if len(run) == 1 else f"{first.name} (+{len(run) - 1})"
        return Record(first.device, first.stage, first.stream, name, first.kind,
                      first.microbatch, first.chunk, min(r.start_s for r in run),
                      max(r.end_s for r in run))

    for r in records:
        key = (r.device, r.stream)
        run = runs.get(key)
        if run and (len(run) == k or (r.kind, r.microbatch, r.chunk) != (
                run[0].kind, run[0].microbatch, run[0].chunk)):
            yield joined(run)
            run = None
        if run:
            run.append(r)
        else:
            runs[key] = [r]
    for run in runs.values():
        yield joined(run)


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
