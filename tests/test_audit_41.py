"""Issue #41's interfaces, as the audit (docs/audits/issue-41.md) found them missing a test."""

from __future__ import annotations

from helpers import make_scenario

import llmsim
from llmsim import plots

MOE = {"experts": 8, "top_k": 2, "ffn_hidden": 1024}


def _moe_result():
    return llmsim.simulate(make_scenario(model__moe=MOE, nodes=2, parallelism__pp=2,
                                         parallelism__ep=4,
                                         parallelism__sequence_parallel=True))


def test_a_trace_over_the_limit_keeps_the_all_to_alls_of_every_device() -> None:
    """Over the limit the shown records merge adjacent ops; they used to fall back to one
    record per pass, so a large MoE scenario's timeline (``frontier-moe``, 71,000 ops over
    the 50,000 bars) drew no all-to-all and an empty TP row."""
    trace = _moe_result().trace
    ops = list(trace.expand())
    shown = list(trace.shown(limit=len(ops) // 4))
    assert len(shown) < len(ops) / 2
    assert {(r.device, r.stream) for r in shown} == {(r.device, r.stream) for r in ops}
    assert {r.device for r in shown if r.stream == "ep"} == {r.device for r in trace.records}


def _ep_bars(result) -> list[int]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.colors as mc

    ax = result.plot_timeline().axes[0]
    return [len(c.get_paths()) for c in ax.collections
            if mc.to_hex(c.get_facecolor()[0]) == plots.COLOURS["ep"]]


def test_the_timeline_over_its_bar_limit_draws_every_all_to_all(monkeypatch) -> None:
    """Over the bar limit the passes are one bar each and the collectives stay op by op:
    each device's row holds its 4 all-to-alls per MoE layer and micro-batch (as under the
    limit, tests/test_moe.py); before, a step over 50,000 ops drew none."""
    result = _moe_result()
    trace = result.trace
    ops = len(list(trace.expand()))
    collectives = sum(1 for r in trace.expand() if r.stream != "compute")
    passes = sum(1 for r in trace.records if r.stream == "compute")
    assert passes + collectives < ops - 1
    monkeypatch.setattr(plots, "MAX_BARS", passes + collectives)
    s = result.scenario
    drawn = len({r.device for r in trace.records})
    assert _ep_bars(result) == [4 * s.model.layers // s.parallelism.pp * s.micro_batches] * drawn
    monkeypatch.setattr(plots, "MAX_BARS", passes + collectives - 1)  # merged runs
    assert len(_ep_bars(result)) == drawn and all(_ep_bars(result))
    bars = list(plots._bars(result))
    assert len(bars) <= plots.MAX_BARS
    outside = [r for r in trace.records if r.stream != "compute"]
    assert set(outside) <= set(bars)  # sends and DP collectives drawn as they are, not merged
