"""A warm estimator prices a layout as a fresh one does: its memos key on everything
they read. On frontier-moe this fails without the layer shape's memo keyed on whether
DualPipe's pairs hide the MoE all-to-alls (``SharedParts._layer_parts``,
:func:`llmsim.moe.pairs_overlap`): an interleaved and a DualPipe layout of one layer
shape shared their blocks, 8 of the sampled layouts 1–4 % off."""

from __future__ import annotations

import random

import pytest
from test_search_fast import _valid_layouts

import llmsim
from llmsim.search.estimate import Estimator
from llmsim.search.price import state_fits
from llmsim.search.space import SpaceOptions, cores


@pytest.mark.parametrize("name", ["frontier-moe", "deepseek-v3"])
def test_a_warm_estimator_prices_each_layout_as_a_fresh_one(name: str) -> None:
    """Every estimate equal (==) from one estimator pricing seeded layouts (every
    schedule, the switch variants) in the search's order and from a fresh one each."""
    scenario = llmsim.load_scenario(name).model_copy(update={"fidelity": "reduced"})
    fixed = {"tp": scenario.parallelism.tp, "micro_batch": 1}
    space = list(cores(scenario, SpaceOptions(fixed=fixed), state_fits(scenario, 0.1)))
    sample = sorted(random.Random(5).sample(space, min(len(space), 60)))
    warm, compared = Estimator(), 0
    for layout, sc in _valid_layouts(scenario, sample):
        assert warm.estimate(sc) == Estimator().estimate(sc), layout.key
        compared += 1
    assert compared > 40
