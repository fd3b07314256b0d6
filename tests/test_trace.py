"""The trace: its per-op expansion, as records and as columns."""

from __future__ import annotations

import pytest
from helpers import make_scenario

from llmsim import simulate


@pytest.mark.parametrize("extra", [
    {},  # whole passes
    {"parallelism__zero": 3, "parallelism__pp": 1, "parallelism__tp": 4,
     "system__node__collective_units": 32},  # passes cut by gathers, slowed by collectives
    {"parallelism__zero": 1, "parallelism__grad_bucket_nan_check": True},  # bucket kernels
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
