"""The cyclic collector held off while the search prices (:mod:`llmsim.search.collector`)."""

from __future__ import annotations

import gc
import weakref

import pytest

import llmsim
from llmsim.search.batching import batches as walk_batches
from llmsim.search.collector import paused
from llmsim.search.price import price_batch, state_fits
from llmsim.search.space import SpaceOptions, cores


class _Node:
    """A container that can hold itself (a reference cycle)."""

    def __init__(self) -> None:
        self.me: object = None


def test_paused_turns_the_collector_off_and_restores_it() -> None:
    assert gc.isenabled()
    with paused():
        assert not gc.isenabled()
        with paused():  # nested: still off, and the outer block restores it
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # off before: left off
    finally:
        gc.enable()


def test_a_cycle_made_and_dropped_inside_is_freed_on_leaving() -> None:
    with paused():
        node = _Node()
        node.me = node
        alive = weakref.ref(node)
        del node
        assert alive() is not None  # only the collector frees a cycle, and it is off
    assert alive() is None


def test_paused_restores_the_collector_when_the_block_raises() -> None:
    with pytest.raises(RuntimeError), paused():
        raise RuntimeError("boom")
    assert gc.isenabled()


@pytest.mark.parametrize("name", ["selene-gpt3", "frontier-moe"])
def test_pricing_makes_no_cyclic_garbage(name: str) -> None:
    """What lets a pool worker freeze what survives each batch (``freeze_survivors``):
    pricing leaves nothing for the collector to free, every dropped object goes by
    reference counting. The smallest batch of each schedule of the scenario's space is
    priced first (the libraries' one-time set-up: pydantic builds a model's schema the
    first time, and its signature parsing leaves cycles), then the next smallest of each,
    their own layouts priced for the first time."""
    base = llmsim.load_scenario(name).model_copy(update={"fidelity": "reduced"})
    by_schedule: dict[str, list] = {}
    for batch in walk_batches(list(cores(base, SpaceOptions(fixed={}),
                                         state_fits(base, 0.1)))):
        by_schedule.setdefault(batch[0].schedule, []).append(batch)
    assert len(by_schedule) >= 6
    ordered = [sorted(batches, key=len) for batches in by_schedule.values()]
    for batches in ordered:
        price_batch(base, batches[0], {}, 0.1)
    gc.collect()
    gc.disable()
    try:
        priced = sum(len(price_batch(base, batches[1], {}, 0.1))
                     for batches in ordered if len(batches) > 1)
        unreachable = gc.collect()
    finally:
        gc.enable()
    assert priced > 0
    assert unreachable == 0
