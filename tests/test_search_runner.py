"""The local pool's feed (:func:`llmsim.search.runner.run_pool`): every batch is priced
exactly once, and a worker left without batches takes one queued on another that has not
started (instead of idling while the other works through its queue)."""

from __future__ import annotations

import os
import time

import llmsim
from llmsim.search import runner
from llmsim.search.layout import Layout
from llmsim.search.price import BatchResult

SLOW = 5
"""The first batches, which the first worker queues, sleep; the others do not."""


def _layout(index: int) -> Layout:
    """A layout that carries its batch's index (in ``nodes``); one pipeline depth, so
    all batches are one affinity group."""
    return Layout(index + 1, 1, 1, 1, 1, "1f1b", 1, 0, False, "none", False, False, False,
                  False, 8)


def _sleepy(cores: list[Layout], fixed: dict, headroom: float) -> BatchResult:
    index = cores[0].nodes - 1
    time.sleep(0.4 if index < SLOW else 0.0)
    out = BatchResult()
    out.columns = {"key": [f"{index}"], "pid": [os.getpid()]}
    return out


def test_every_batch_once_and_idle_worker_takes_queued_ones(monkeypatch):
    """Batches 0–4 (slow) are queued on worker 0 (AHEAD + 1 of them); worker 1 gets the
    other three (fast) from the feed, is then left with none, and takes worker 0's queued
    ones that have not started: it prices more than its three."""
    monkeypatch.setattr(runner, "_price_on_worker", _sleepy)  # the workers are forked
    assert runner.AHEAD + 1 == SLOW
    batches = [(i, [_layout(i)]) for i in range(SLOW + 3)]
    base = llmsim.load_scenario("selene-gpt3")
    results = list(runner.run_pool(base, batches, {}, 0.1, workers=2))
    assert sorted(index for index, _ in results) == list(range(SLOW + 3))
    assert all(r.columns["key"] == [f"{index}"] for index, r in results)
    pids = [r.columns["pid"][0] for _, r in results]
    first = {r.columns["pid"][0] for index, r in results if index == 0}.pop()
    assert len(set(pids)) == 2
    assert sum(pid != first for pid in pids) > 3


def test_interned_base_by_identity_and_by_value():
    """A pool worker's base, given again as the same object, is its first entry without
    its JSON; an equal copy (a batch unpickled on Dask) finds the same entry by value, and
    a different base its own."""
    from llmsim.search.price import interned

    base = llmsim.load_scenario("selene-gpt3").model_copy(update={"fidelity": "reduced"})
    first = interned(base)
    assert interned(base) is first
    copy = base.model_copy(deep=True)
    assert copy is not base and interned(copy) is first
    assert interned(base) is first
    other = base.model_copy(update={"seed": base.seed + 1})
    assert interned(other) is not first and interned(other)[0] is other
    assert interned(base) is first
