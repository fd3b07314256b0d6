"""FUGAKU-DEV-14 (TP 4 over a node's four CMGs) beside FUGAKU-DEV-13 (DP 4 over the same
CMGs): what DEV-14's collectives would have to cost once DEV-13's shortfall is taken as
common to both (``benchmarks/fugaku_tp_shortfall.py``; docs/validation.md, section 8, "The
TP rows on the CMGs")."""

from __future__ import annotations

import importlib.util
import math
import sys
from types import ModuleType

import pytest
from helpers import ROOT


def _script() -> ModuleType:
    """The benchmark script as a module, registered under its name first (its dataclasses
    look their module up in ``sys.modules``)."""
    name = "fugaku_tp_shortfall"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


script = _script()
Shortfall = script.Shortfall


def test_readings_closed_form() -> None:
    """A pair that is its partner four times over in ops, with the same FLOPs and priced
    compute, and misses four times as much: the per-op reading leaves nothing for its
    collectives, the per-FLOP and per-priced-second readings leave three quarters."""
    alone = Shortfall(measured_s=150.0, step_s=100.0, microbatches=256, ops=1_000,
                      flops=1e15, compute_s=100.0)
    pair = Shortfall(measured_s=300.0, step_s=100.0, microbatches=1_024, ops=4_000,
                     flops=1e15, compute_s=100.0, collectives=3_000)
    common = script.common_shortfall_s(pair, alone)
    assert common["per op"] == pytest.approx(200.0)
    assert common["per FLOP"] == pytest.approx(50.0)
    assert common["per priced compute second"] == pytest.approx(50.0)
    residual = script.residual_per_collective_ms(pair, alone)
    assert residual["per op"] == pytest.approx(0.0, abs=1e-12)
    assert residual["per FLOP"] == pytest.approx(1e3 * 150.0 / 3_000)


@pytest.fixture(scope="module")
def pair() -> tuple[Shortfall, Shortfall]:
    """(DEV-14, DEV-13) as llmsim prices them today."""
    by_label = {case.label: case for case in script.CASES}
    return script.shortfall(by_label["DEV-14"]), script.shortfall(by_label["DEV-13"])


def test_pair_runs_the_same_flops_a_process(pair: tuple[Shortfall, Shortfall]) -> None:
    """TP 4 over 1,024 micro-batches and DP 4 over 256 give each process the same model
    FLOPs a step (the vocabulary padded to 128 × TP adds 0.2 %): the per-FLOP reading's
    premise."""
    tp, dp = pair
    assert tp.microbatches == 4 * dp.microbatches
    assert math.isclose(tp.flops, dp.flops, rel_tol=0.01)


def test_pair_cannot_tell_a_per_collective_cost(pair: tuple[Shortfall, Shortfall]) -> None:
    """What the doc says of the pair: with DEV-13's shortfall common per op, DEV-14's
    collectives need well under a millisecond each beyond llmsim's price; common per FLOP
    or per priced second, several milliseconds. The pair alone cannot choose."""
    residual = script.residual_per_collective_ms(*pair)
    assert abs(residual["per op"]) < 0.5
    assert residual["per FLOP"] > 5.0
    assert residual["per priced compute second"] > 5.0
