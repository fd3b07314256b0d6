"""The local pool's feed (:func:`llmsim.search.runner.run_pool`): every batch is priced
exactly once; a worker has at most one batch queued behind the one it prices (a queued
batch is in its process's call queue, where no other worker can take it), and the last
batches go to whichever worker is free first."""

from __future__ import annotations

import os
import time

import llmsim
from llmsim.search import runner
from llmsim.search.layout import Layout
from llmsim.search.price import BatchResult

SLOW = (0, 1, 2)
"""Batches that sleep; the others do not."""


def _layout(index: int) -> Layout:
    """A layout that carries its batch's index (in ``nodes``); one pipeline depth, so
    all batches are one affinity group."""
    return Layout(index + 1, 1, 1, 1, 1, "1f1b", 1, 0, False, "none", False, False, False,
                  False, 8)


def _sleepy(cores: list[Layout], fixed: dict, headroom: float) -> BatchResult:
    index = cores[0].nodes - 1
    time.sleep(0.4 if index in SLOW else 0.0)
    out = BatchResult()
    out.columns = {"key": [f"{index}"], "pid": [os.getpid()]}
    return out


def test_every_batch_once_and_the_last_to_the_free_worker(monkeypatch):
    """Worker 0 takes the group and is sent batches 0 and 1 (AHEAD + 1: slow); worker 1
    takes 7 and 6 from the group's end, and then, the feed at its last batches, one at a
    time as it is free: 5, 4, 3 and the slow 2, while worker 0 prices 0 and 1. At
    c7b064b worker 0 was sent 0–4 and its process queued 0–2, so 2 waited behind 0 and 1
    while worker 1 idled."""
    monkeypatch.setattr(runner, "_price_on_worker", _sleepy)  # the workers are forked
    assert runner.AHEAD == 1 and runner.LAST * 2 == 4
    batches = [(i, [_layout(i)]) for i in range(8)]
    base = llmsim.load_scenario("selene-gpt3")
    results = list(runner.run_pool(base, batches, {}, 0.1, workers=2))
    assert sorted(index for index, _ in results) == list(range(8))
    assert all(r.columns["key"] == [f"{index}"] for index, r in results)
    pid = {index: r.columns["pid"][0] for index, r in results}
    assert len(set(pid.values())) == 2
    assert pid[0] == pid[1] != pid[2]
    assert {i for i in pid if pid[i] != pid[0]} == {2, 3, 4, 5, 6, 7}


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
