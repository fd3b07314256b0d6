"""The search's store (:mod:`llmsim.search.store`): a pool worker's text columns sent as
Arrow strings (:func:`~llmsim.search.store.arrow_text`) make the same table, dtypes
included, and the same record on disk, as numpy's, alone or mixed with them (a resumed
search's batches come back from JSON as numpy)."""

from __future__ import annotations

import pandas as pd
import pytest

import llmsim
from llmsim.search.batching import cuts
from llmsim.search.price import price_batch, state_fits
from llmsim.search.space import SpaceOptions, branches
from llmsim.search.store import Store, arrow_text

pytest.importorskip("pyarrow")


def _priced() -> list:
    """Six batches of selene-gpt3 at tp 8, priced (numpy columns; one may be empty)."""
    base = llmsim.load_scenario("selene-gpt3").model_copy(update={"fidelity": "reduced"})
    options = SpaceOptions(fixed={"tp": 8})
    branch_list = list(branches(base, options, state_fits(base, 0.1)))
    return [price_batch(base, cut.layouts(branch_list, options.fixed), options.fixed, 0.1)
            for cut in cuts(branch_list)[:6]]


PRICED = _priced()


@pytest.mark.parametrize("arrow", ["none", "all", "odd"])
def test_arrow_text_makes_the_same_table_and_record(tmp_path, arrow):
    assert sum(len(result) for result in PRICED) > 100
    made = {}
    for side in ("numpy", arrow):
        store = Store(tmp_path / side, {"search": 1})
        for index, result in enumerate(PRICED):
            send = side == "all" or (side == "odd" and index % 2)
            columns = arrow_text(result.columns) if send else result.columns
            store.add(index, columns, result.invalid, result.out_of_memory)
        store.close()
        made[side] = (store.table(), (tmp_path / side / "priced.jsonl").read_text())
    (numpy_table, numpy_record), (table, record) = made["numpy"], made[arrow]
    pd.testing.assert_frame_equal(table, numpy_table)
    assert record == numpy_record
    assert numpy_table["key"].is_unique and len(numpy_table) == sum(map(len, PRICED))


def test_arrow_text_converts_only_the_text_columns():
    columns = next(r for r in PRICED if len(r)).columns
    sent = arrow_text(columns)
    text = {name for name, values in columns.items() if values.dtype.kind == "U"}
    assert text >= {"key", "schedule", "recompute", "dp_mode"}
    assert all((sent[name] is columns[name]) == (name not in text) for name in columns)
    assert all(sent[name].to_pylist() == columns[name].tolist() for name in text)
