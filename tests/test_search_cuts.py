"""The whole space's batches cut from its branches (:func:`llmsim.search.batching.cuts`),
their layouts made where they are priced: the same batches as :func:`.batching.batches`
of the enumerated layouts, layout for layout and in order (the store's batch numbers, so
``--resume``), and the same rows priced on a pool."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import llmsim
from llmsim.search import batching, runner
from llmsim.search.batching import Cut, batches, cuts, most_devices, widest
from llmsim.search.draw import draw_batches, draw_layouts
from llmsim.search.price import state_fits
from llmsim.search.space import SpaceOptions, branch_slice, branches, cores

CASES = [
    ("selene-gpt3", {"tp": 8}, {}),
    ("selene-gpt3", {"pp": 8}, {"asynchronous": True, "max_parameter_servers": 4}),
    ("selene-gpt3", {"tp": 4, "zero": 1}, {"batch_range": (1024, 1536, 256)}),
    ("frontier-moe", {"pp": 4}, {}),
]
"""(scenario, --fix, other options): a dense and an MoE model, parameter servers,
PipeDream, a batch range; each a few thousand to tens of thousands of core layouts."""


def _space(name: str, fixed: dict, extra: dict) -> tuple:
    base = llmsim.load_scenario(name).model_copy(update={"fidelity": "reduced"})
    options = SpaceOptions(fixed=fixed, **extra)
    fits = state_fits(base, 0.1)
    return base, options, fits, list(cores(base, options, fits)), \
        list(branches(base, options, fits))


@pytest.mark.parametrize("bounded", [False, True])
@pytest.mark.parametrize(("name", "fixed", "extra"), CASES)
def test_cuts_are_the_batches_of_the_enumerated_layouts(name, fixed, extra, bounded):
    _, _, _, space, branch_list = _space(name, fixed, extra)
    expected = batches(space, bounded)
    cut = cuts(branch_list, bounded)
    assert len(space) > 1000 and len(expected) > 1
    assert [c.layouts(branch_list, fixed) for c in cut] == expected
    assert [len(c) for c in cut] == [len(b) for b in expected]
    assert [c.pp for c in cut] == [b[0].pp for b in expected]
    assert [most_devices(c) for c in cut] == [most_devices(b) for b in expected]
    assert [[core.devices for core in widest(c, branch_list, fixed)] for c in cut] \
        == [[max(core.devices for core in b)] for b in expected]


@pytest.mark.parametrize("most", [16, 37])
def test_a_walk_key_longer_than_a_batch_is_cut_in_a_branch(monkeypatch, most):
    """No walk key of selene-gpt3 has more layouts than a batch holds; with a smaller
    batch many do, and are cut in the middle of a branch's plan."""
    monkeypatch.setattr(batching, "MAX_BATCH_CORES", most)
    _, options, _, space, branch_list = _space(*CASES[0])
    cut = cuts(branch_list)
    assert [c.layouts(branch_list, options.fixed) for c in cut] == batches(space)
    assert any(len(c) == most for c in cut)
    assert any(first % (b.size // len(b.plans)) or end % (b.size // len(b.plans))
               for c in cut for b, first, end in
               ((branch_list[i], f, e) for i, f, e in c.ranges))


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_a_branch_slice_is_that_slice_of_its_layouts(data):
    _, options, _, _, branch_list = _space(*CASES[1])
    branch = data.draw(st.sampled_from(branch_list))
    first = data.draw(st.integers(0, branch.size - 1))
    end = data.draw(st.integers(first + 1, branch.size))
    from llmsim.search.space import branch_layouts

    assert list(branch_slice(branch, options.fixed, first, end)) \
        == list(branch_layouts(branch, options.fixed))[first:end]


@pytest.mark.parametrize("max_layouts", [None, 500])
def test_draw_batches_is_draw_layouts_cut(max_layouts):
    """The whole space as Cuts, a sample as lists: the same batches either way."""
    base, options, fits, _, _ = _space(*CASES[0])
    drawn = draw_batches(base, options, fits, max_layouts, 7, bounded=False)
    layouts, count, sampled = draw_layouts(base, options, fits, max_layouts, 7)
    assert (drawn.space_layouts, drawn.sampled) == (count, sampled)
    assert drawn.core_layouts == len(layouts)
    assert all(isinstance(b, Cut) for b in drawn.batches) == (max_layouts is None)
    made = [b.layouts(drawn.branches, options.fixed) if isinstance(b, Cut) else b
            for b in drawn.batches]
    assert made == batches(layouts)


def test_a_pool_prices_cuts_as_it_prices_their_layouts():
    """The pool's workers make a Cut's layouts from the branches they were given: the
    same rows as the same batches sent as layouts, priced in this process."""
    base, options, _, _, branch_list = _space(*CASES[0])
    cut = list(enumerate(cuts(branch_list)))[:6]
    listed = [(i, c.layouts(branch_list, options.fixed)) for i, c in cut]
    pooled = dict(runner.run_pool(base, cut, dict(options.fixed), 0.1, 2,
                                  branches=branch_list))
    serial = dict(runner.run_serial(base, listed, dict(options.fixed), 0.1))
    assert sorted(pooled) == sorted(serial) == [i for i, _ in cut]
    for i in serial:
        for name, values in serial[i].columns.items():
            assert pooled[i].columns[name].tolist() == values.tolist(), name  # text: Arrow
