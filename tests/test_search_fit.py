"""The peak memory of placed and two-pipeline schedules (ZB-V, Chimera, DualPipe) by
:class:`~llmsim.search.fit.PeakMemory`'s own path equals :func:`memory_per_stage`'s
largest stage exactly (its sums in its order)."""

from __future__ import annotations

import random

import pytest
from test_search_fast import check_peak_memory

import llmsim
from llmsim.search.batching import walk_key
from llmsim.search.price import state_fits
from llmsim.search.space import SpaceOptions, cores

PLACED = ("zb-v", "chimera", "dualpipe")


@pytest.mark.parametrize("name", ["selene-gpt3", "frontier"])
def test_placed_schedules_peak_equals_the_memory_model_exactly(name: str) -> None:
    base = llmsim.load_scenario(name).model_copy(update={"fidelity": "reduced"})
    options = SpaceOptions(fixed={"micro_batch": 1, "recompute": "selective"})
    space = [c for c in cores(base, options, state_fits(base, 0.1)) if c.schedule in PLACED
             and c.pp * walk_key(c)[3] <= 1024]  # small orders: quick to build
    sample = random.Random(11).sample(space, min(80, len(space)))
    assert check_peak_memory(base, sample, rel=0) > 30
    assert {c.schedule for c in sample} == set(PLACED)
