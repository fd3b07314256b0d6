"""The trace: its per-op expansion, as records and as columns."""

from __future__ import annotations

import pytest
from helpers import make_scenario

from llmsim import simulate


@pytest.mark.parametrize("extra", [
    {},  # whole passes
    {"parallelism__zero": 3, "parallelism__pp": 1, "parallelism__tp": 4,
     "system__node__collective_units": 32},  # passes cut by gathers, slowed by collectives
    # bucket kernels: 1 MB buckets, so that marks fall inside passes (with the default
    # 25 MB the tiny model's one bucket is made final at its pass's end)
    {"parallelism__zero": 1, "parallelism__grad_bucket_nan_check": True,
     "parallelism__dp_bucket_mb": 1.0},
])
def test_columns_hold_the_expanded_records_exactly(extra):
    result = simulate(make_scenario(nodes=2, **extra))
    rows = list(result.trace.expand())
    columns = result.trace.expand_columns()
    assert {len(c) for c in columns.values()} == {len(rows)}
    assert any(r.block_from_s > 0 for r in result.trace.records) or not extra
    for name, column in columns.items():
        assert column.tolist() == [getattr(r, name) for r in rows], name
    df = result.to_dataframe()
    assert list(df.columns) == [*columns, "duration_s"]
    assert (df["duration_s"] == df["end_s"] - df["start_s"]).all()


def test_the_breakdown_reads_the_blocks_block_of_finds_paired_passes_included():
    """The stage breakdown's compute and all-to-all time are the shares of the blocks
    ``Trace.block_of`` finds on the stage's first device, DualPipe's overlapped pairs
    included (whose blocks hide all-to-all time the plain F and B blocks do not): both
    read one lookup, ``Trace.pass_block``."""
    from test_moe_dualpipe import _scenario

    from llmsim.blocks import block_kind

    result = simulate(_scenario(True))
    trace = result.trace
    assert any("&" in kind for kind in trace.pass_kinds.values())
    for stage, breakdown in enumerate(result.stages):
        device = min(r.device for r in trace.records if r.stage == stage)
        compute = a2a = 0.0
        for r in trace.records:
            block = trace.block_of(r) if r.device == device else None
            if block is None:
                continue
            key = (r.stage, r.kind, r.microbatch, r.chunk)
            kind = trace.pass_kinds.get(key) or block_kind(r.kind, r.microbatch,
                                                           trace.accumulate_from_microbatch)
            assert block is trace.blocks[(r.stage, r.chunk, kind)]
            compute += block.compute_s * r.block_share(block)
            a2a += block.a2a_s * r.block_share(block)
        assert breakdown.compute_s == pytest.approx(compute, rel=1e-9)
        assert breakdown.a2a_s == pytest.approx(a2a, rel=1e-9, abs=1e-12)
