"""The cyclic garbage collector paused while the search prices a batch
(:func:`llmsim.search.price.price_batch` under :func:`llmsim.simulation.collector_paused`)."""

from __future__ import annotations

import gc
import subprocess
import sys
from pathlib import Path

import pytest

import llmsim
from llmsim.search.batching import batches as walk_batches
from llmsim.search.price import price_batch, state_fits
from llmsim.search.space import SpaceOptions, cores


def _by_schedule(name: str) -> tuple[llmsim.specs.Scenario, list[list]]:
    """The scenario's search base and, per schedule, its batches smallest first."""
    base = llmsim.load_scenario(name).model_copy(update={"fidelity": "reduced"})
    by_schedule: dict[str, list] = {}
    for batch in walk_batches(list(cores(base, SpaceOptions(fixed={}),
                                         state_fits(base, 0.1)))):
        by_schedule.setdefault(batch[0].schedule, []).append(batch)
    return base, [sorted(batches, key=len) for batches in by_schedule.values()]


def test_price_batch_leaves_the_collector_as_it_found_it() -> None:
    base, ordered = _by_schedule("selene-gpt3")
    batch = ordered[0][0]
    assert gc.isenabled()
    first = price_batch(base, batch, {}, 0.1)
    assert gc.isenabled()
    gc.disable()
    try:
        again = price_batch(base, batch, {}, 0.1)
        assert not gc.isenabled()  # off before: left off
    finally:
        gc.enable()
    assert list(first.columns["key"]) == list(again.columns["key"])
    assert list(first.columns["est_step_time_s"]) == list(again.columns["est_step_time_s"])


_NO_CYCLES = """
import gc, sys
sys.path.insert(0, {tests!r})
from test_search_collector import _by_schedule
from llmsim.search.price import price_batch
base, ordered = _by_schedule({name!r})
assert len(ordered) >= 6
for batches in ordered:
    price_batch(base, batches[0], {{}}, 0.1)
gc.collect()
gc.disable()
priced = sum(len(price_batch(base, batches[1], {{}}, 0.1)) for batches in ordered
             if len(batches) > 1)
print(priced, gc.collect())
"""


@pytest.mark.parametrize("name", ["selene-gpt3", "frontier-moe"])
def test_pricing_makes_no_cyclic_garbage(name: str) -> None:
    """Why pausing the collector costs no memory: pricing leaves nothing for it to free,
    every dropped object goes by reference counting (a batch's survivors go straight to
    the oldest generation, which a full collection seldom walks). The smallest batch of
    each schedule of the scenario's space is priced first (the libraries' one-time
    set-up: pydantic builds a model's schema the first time it meets the model, and its
    signature parsing leaves cycles, 317 objects on frontier-moe), then the next smallest
    of each, their own layouts priced for the first time. In a fresh interpreter: the
    event loops of Dask clusters that earlier tests closed leave cycles of their own
    from their threads, which a collection in this process would count."""
    code = _NO_CYCLES.format(tests=str(Path(__file__).parent), name=name)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    priced, unreachable = map(int, out.stdout.split())
    assert priced > 0
    assert unreachable == 0
