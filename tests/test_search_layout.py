"""A search layout's fast copies equal the dataclass's own: pickling by its field values
and the switch variants made without ``dataclasses.replace``."""

from __future__ import annotations

import pickle
from dataclasses import fields, replace

from hypothesis import given
from hypothesis import strategies as st

from llmsim.search.layout import LAYOUT_FIELDS, Layout

_VALUES = {"int": st.integers(0, 4096), "bool": st.booleans(),
           "str": st.sampled_from(["1f1b", "none", "zb-v", "full"])}

layouts = st.builds(Layout, **{f.name: _VALUES[f.type] for f in fields(Layout)})
"""Layouts with every field drawn (values need not make a valid layout here)."""


@given(layouts)
def test_a_pickled_layout_is_the_same_layout(layout: Layout) -> None:
    back = pickle.loads(pickle.dumps(layout))
    assert back == layout and type(back) is Layout
    assert [getattr(back, name) for name in LAYOUT_FIELDS] == \
        [getattr(layout, name) for name in LAYOUT_FIELDS]
    assert len(layout.__reduce__()[1]) == len(LAYOUT_FIELDS)


@given(layouts, st.booleans(), st.booleans(), st.booleans(), st.booleans())
def test_a_variant_equals_the_dataclass_replace(layout: Layout, otp: bool, opp: bool,
                                                opg: bool, a2a: bool) -> None:
    want = replace(layout, overlap_tp_comm=otp, overlap_pp_comm=opp,
                   overlap_param_gather=opg, moe_a2a_overlap=a2a)
    got = layout.variant(otp, opp, opg, a2a)
    assert got == want and got.key == want.key
    assert [getattr(got, name) for name in LAYOUT_FIELDS] == \
        [getattr(want, name) for name in LAYOUT_FIELDS]


def test_the_key_names_every_switch() -> None:
    layout = Layout(4, 8, 2, 1, 1, "1f1b", 1, 1, True, "none", True, False, True, False, 64)
    assert ".o1010." in layout.key
