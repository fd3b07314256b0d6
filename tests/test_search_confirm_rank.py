"""The confirmation's ranking (:mod:`llmsim.search.confirm`): :func:`ranked` is pandas'
sort of the table by the estimator's column and the key, and :func:`leaders` its first
rows, found without ranking the whole table; the engine's runs started before the ranking
are those the ranking asks for."""

from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

import llmsim
from llmsim.search import search
from llmsim.search.confirm import leaders, ranked

VALUES = st.one_of(st.sampled_from([0.0, -0.0, 1.5, 2.0, float("nan"), float("inf")]),
                   st.floats(-3, 3, allow_nan=False))


def _pandas_order(table: pd.DataFrame, larger: bool) -> list[int]:
    return table.reset_index(drop=True).sort_values(
        ["est", "key"], ascending=[not larger, True], na_position="last",
        kind="mergesort").index.tolist()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(VALUES, st.sampled_from(list("abcdefgh"))), max_size=40),
       st.booleans(), st.integers(0, 45), st.booleans())
def test_ranked_and_leaders_are_pandas_sort(rows, larger, count, as_object):
    """Ties (0.0 and -0.0 too), NaN, infinity, repeated keys; a column of objects with
    None (a store's column where a value was missing) as one of floats."""
    values = [v for v, _ in rows]
    column = [None if np.isnan(v) else v for v in values] if as_object else values
    table = pd.DataFrame({"est": pd.Series(column, dtype=object if as_object else float),
                          "key": pd.Series([k for _, k in rows], dtype=object)})
    expected = _pandas_order(table, larger)
    assert ranked(table, "est", larger).tolist() == expected
    assert leaders(table, "est", larger, count) == expected[:count]


def test_search_ranks_as_before():
    """A small search on two workers (its engine runs started before the ranking) and the
    same search on one (ranked after, run one by one) give the same table, row for row."""
    scenario = llmsim.load_scenario("selene-gpt3")
    fix = ["nodes=16", "parallelism.tp=8", "parallelism.schedule=1f1b"]
    two = search(scenario, fix=fix, top=4, workers=2)
    one = search(scenario, fix=fix, top=4, workers=1)
    assert two["step_time_s"].notna().sum() == 4
    pd.testing.assert_frame_equal(two, one)
    est = one["est_days"].to_numpy()
    assert (np.diff(est[4:]) >= 0).all()  # the rest in the estimator's order


def test_early_runs_are_the_ones_confirm_takes():
    """:class:`EarlyRuns` starts, from the store's columns, the runs of exactly the layouts
    :func:`confirm` asks for, and :func:`confirm` takes every one of them."""
    from llmsim.search.confirm import EarlyRuns, confirm
    from llmsim.search.price import price_batch
    from llmsim.search.space import SpaceOptions, cores
    from llmsim.search.store import Store

    base = llmsim.load_scenario("selene-gpt3", ["nodes=8"]).model_copy(
        update={"fidelity": "reduced"})
    space = list(cores(base, SpaceOptions(fixed={"tp": 8, "schedule": "1f1b"}), None))
    store = Store(None, {})
    for index, start in enumerate(range(0, len(space), 7)):
        result = price_batch(base, space[start:start + 7], {"tp": 8, "schedule": "1f1b"}, 0.1)
        store.add(index, result.columns, result.invalid, result.out_of_memory)
    assert store.priced > 6
    with EarlyRuns() as early:
        early.start(base, store, "step_time", 3, 2)
        started = set(early.started)
        table, _, _ = confirm(base, store.table(), "step_time", 3, 2, None, early.started)
        assert early.started == {}  # all taken
    assert started == set(table["key"].iloc[:3])
    assert table["step_time_s"].iloc[:3].notna().all()
