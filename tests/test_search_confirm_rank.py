"""The confirmation's ranking (:mod:`llmsim.search.confirm`): :func:`ranked` is pandas'
sort of the table by the estimator's column and the key."""

from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

import llmsim
from llmsim.search import search
from llmsim.search.confirm import ranked

VALUES = st.one_of(st.sampled_from([0.0, -0.0, 1.5, 2.0, float("nan"), float("inf")]),
                   st.floats(-3, 3, allow_nan=False))


def _pandas_order(table: pd.DataFrame, larger: bool) -> list[int]:
    return table.reset_index(drop=True).sort_values(
        ["est", "key"], ascending=[not larger, True], na_position="last",
        kind="mergesort").index.tolist()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(VALUES, st.sampled_from(list("abcdefgh"))), max_size=40),
       st.booleans(), st.booleans())
def test_ranked_is_pandas_sort(rows, larger, as_object):
    """Ties (0.0 and -0.0 too), NaN, infinity, repeated keys; a column of objects with
    None (a store's column where a value was missing) as one of floats."""
    values = [v for v, _ in rows]
    column = [None if np.isnan(v) else v for v in values] if as_object else values
    table = pd.DataFrame({"est": pd.Series(column, dtype=object if as_object else float),
                          "key": pd.Series([k for _, k in rows], dtype=object)})
    expected = _pandas_order(table, larger)
    assert ranked(table, "est", larger).tolist() == expected


def test_search_ranks_as_before():
    """A small search on two workers and the same search on one give the same table, row
    for row (the rows arrive in another order from the pool), ranked."""
    scenario = llmsim.load_scenario("selene-gpt3")
    fix = ["nodes=16", "parallelism.tp=8", "parallelism.schedule=1f1b"]
    two = search(scenario, fix=fix, top=4, workers=2)
    one = search(scenario, fix=fix, top=4, workers=1)
    assert two["step_time_s"].notna().sum() == 4
    pd.testing.assert_frame_equal(two, one)
    est = one["est_days"].to_numpy()
    assert (np.diff(est[4:]) >= 0).all()  # the rest in the estimator's order

