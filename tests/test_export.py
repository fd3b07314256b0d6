"""The Perfetto trace and the timeline keep every stream's activity at any size."""

from __future__ import annotations

import re

from helpers import make_scenario

from llmsim import simulate
from llmsim.export import trace_records


def _ops_in(record) -> int:
    match = re.search(r" \(\+(\d+)\)$", record.name)
    return 1 + int(match.group(1)) if match else 1


def test_over_the_limit_adjacent_ops_merge_and_no_stream_is_lost():
    result = simulate(make_scenario(parallelism__sequence_parallel=True))
    ops = list(result.trace.expand())
    assert list(trace_records(result, limit=len(ops))) == ops  # under the limit: every op
    merged = list(trace_records(result, limit=len(ops) // 4))
    assert len(merged) < len(ops) / 2
    assert {(r.device, r.stream) for r in merged} == {(r.device, r.stream) for r in ops}
    assert "tp" in {r.stream for r in merged}
    assert sum(map(_ops_in, merged)) == len(ops)  # each op in exactly one merged record
    for op in ops[:: max(1, len(ops) // 200)]:  # each op lies inside a record of its kind
        assert any(m.device == op.device and m.stream == op.stream and m.kind == op.kind
                   and m.microbatch == op.microbatch and m.chunk == op.chunk
                   and m.start_s <= op.start_s and op.end_s <= m.end_s for m in merged)


def _inside(box, page) -> bool:
    return page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0 and box.y1 <= page.y1


def test_the_timeline_figure_saves_with_its_legend(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.figure import Figure

    fig = simulate(make_scenario()).plot_timeline()
    assert isinstance(fig, Figure)
    fig.savefig(tmp_path / "t.png")  # no bbox_inches="tight"
    (legend,) = fig.legends
    assert _inside(legend.get_window_extent(), fig.bbox)
    assert {t.get_text() for t in legend.get_texts()} >= {"forward", "TP comm"}
    plt.close(fig)


def test_the_timeline_on_given_axes_returns_their_figure_legend_inside(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, figsize=(10, 9), layout="constrained")
    result = simulate(make_scenario())
    assert result.plot_timeline(ax=bottom, max_devices=2) is fig
    fig.savefig(tmp_path / "t.png")
    assert not top.has_data() and bottom.has_data() and not fig.legends
    legend = bottom.get_legend()
    assert _inside(legend.get_window_extent(), fig.bbox)
    assert {t.get_text() for t in legend.get_texts()} >= {"forward", "TP comm"}
    plt.close(fig)
