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


@pytest.mark.parametrize("name", ["selene-gpt3", "frontier"])
def test_the_candidate_stages_give_the_peak_of_every_stage_exactly(name: str, monkeypatch) -> None:
    """:class:`PeakMemory` looks only at the stages that can hold the peak (of stages
    alike, the one holding the most activations): the same number, bit for bit, as
    looking at every stage."""
    from llmsim.search import fit
    from llmsim.search.layout_scenario import parallelism_of

    base = llmsim.load_scenario(name).model_copy(update={"fidelity": "reduced"})
    space = [c for c in cores(base, SpaceOptions(fixed={}), state_fits(base, 0.1))
             if c.pp > 2 and (c.schedule not in PLACED or c.pp * walk_key(c)[3] <= 1024)]
    sample = random.Random(5).sample(space, 300)
    fast = fit.PeakMemory(base)
    got = [fast.peak_bytes(*parallelism_of(base, c), c.dp) for c in sample]
    assert fit._candidates(8, [[12]] * 8, [8, 7, 6, 5, 4, 3, 2, 1]) == [0, 1, 7]
    monkeypatch.setattr(fit, "_candidates", lambda p, split, held: range(p))
    monkeypatch.setattr(fit, "_placed_candidates", lambda p, stages: stages)
    every = fit.PeakMemory(base)
    assert got == [every.peak_bytes(*parallelism_of(base, c), c.dp) for c in sample]
    assert {c.schedule for c in sample} >= {"1f1b", "interleaved-1f1b", "zb-v"}


def test_the_peak_follows_the_norm_and_up_projection_recompute_switch() -> None:
    """With ``recompute_norms_and_up_proj`` on, a selective-recompute layout's peak is
    memory_per_stage's own: its re-materialised layer re-materialises the norms and
    up-projections too (the fast path once kept a copy of the activation parts that
    ignored the switch and missed on interleaved selene-gpt3 layouts)."""
    from test_search_fast import _sample

    scenario, sample = _sample("selene-gpt3", 80)
    par = scenario.parallelism.model_copy(update={"recompute": "selective",
                                                  "recompute_norms_and_up_proj": True})
    scenario = scenario.model_copy(update={"parallelism": par})
    assert check_peak_memory(scenario, sample) > 40
