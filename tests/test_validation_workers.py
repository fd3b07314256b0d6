"""``llmsim validate`` on several processes: the same frame as on one, in the runs' order."""

from __future__ import annotations

import gc

import pandas as pd
import pytest
from test_cli import run_cli as cli

from llmsim import validation as v
from llmsim.errors import UserError
from llmsim.simulation import collector_paused

BY_ID = {r.id: r for r in v.load_runs()}
CHEAP = ["MEGREADME-2009-V100-1", "MEGREADME-H100-01", "ZB24-T4-01", "AURORA26-01"]
"""Cheap rows of different sources and engine paths (ci rows of test_validation_steps)."""


def test_two_workers_give_the_frame_of_one_in_the_runs_order():
    runs = [BY_ID[i] for i in reversed(CHEAP)]
    alone = v.validate(runs, progress=False, workers=1)
    pooled = v.validate(runs, progress=False, workers=2)
    assert list(pooled["id"]) == list(reversed(CHEAP))
    pd.testing.assert_frame_equal(pooled, alone, check_exact=True)


def test_a_worker_count_below_one_is_refused():
    with pytest.raises(UserError, match="workers 0"):
        v.validate([BY_ID[CHEAP[0]]], progress=False, workers=0)


def test_the_collector_pause_nests_and_restores_the_collector():
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the inner pause leaves the outer one paused
    assert gc.isenabled()


def test_the_collector_pause_leaves_the_callers_frozen_objects_frozen():
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with collector_paused():
            kept = [(i, float(i)) for i in range(1000)]
        assert gc.get_freeze_count() == frozen and len(kept) == 1000
    finally:
        gc.unfreeze()


def test_objects_alive_after_the_pause_are_collectable():
    with collector_paused():
        cycle: list = []
        cycle.append(cycle)
        kept = [(i, float(i)) for i in range(1000)]
    assert gc.get_freeze_count() == 0 and len(kept) == 1000
    del cycle
    assert gc.collect() >= 1  # the cycle made inside, found by a full collection


def test_cli_validate_with_workers(capsys):
    code, out, _ = cli(["validate", "--subset", "MEGREADME-2009-V100-1", "--workers", "2"],
                       capsys)
    assert code == 0 and "MEGREADME-2009-V100-1" in out
    code, _, err = cli(["validate", "--workers", "0"], capsys)
    assert code == 2 and "--workers" in err and "Traceback" not in err


def test_a_platform_that_cannot_fork_simulates_the_rows_here(monkeypatch):
    import multiprocessing

    def no_fork(method=None):
        raise ValueError(f"cannot find context for {method!r}")  # as on Windows

    monkeypatch.setattr(multiprocessing, "get_all_start_methods", lambda: ["spawn"])
    monkeypatch.setattr(multiprocessing, "get_context", no_fork)
    runs = [BY_ID[CHEAP[0]], BY_ID[CHEAP[2]]]
    pooled = v.validate(runs, progress=False, workers=2)
    alone = v.validate(runs, progress=False, workers=1)
    pd.testing.assert_frame_equal(pooled, alone, check_exact=True)
