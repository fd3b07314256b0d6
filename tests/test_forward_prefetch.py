"""``prefetch_weights: forward``: weight gathers one layer ahead in the forward passes only.

A host that blocks on every collective (``NCCL_BLOCKING_WAIT``, oneCCL's ``CCL_OP_SYNC``)
still has the previous layer's forward kernels queued while it waits for a gather, but in
the backward it first waits out each layer's reduce-scatter, so the gather finds the compute
stream empty: the forward's gathers hide behind the compute, the backward's (and its
recompute's) are each waited for. The engine's three loops and the search's estimator must
price it alike.
"""

from __future__ import annotations

import pytest
from test_engine import _GatherOnlyCosts, _zero3
from test_search import TINY

import llmsim
from llmsim import simulate
from llmsim.errors import UserError
from llmsim.search.estimate import Estimator
from llmsim.search.zero3_queue import blended_wait_s, reduce_scatter_wait_s
from llmsim.specs.parallelism import Parallelism, prefetched


def test_forward_prefetches_the_forward_passes_only() -> None:
    assert [prefetched(mode, kind) for mode in (True, "forward", False)
            for kind in "FBW"] == [True, True, True, True, False, False, False, False, False]


def test_the_value_is_true_false_or_forward() -> None:
    assert Parallelism(prefetch_weights="forward").prefetch_weights == "forward"
    assert Parallelism(prefetch_weights="false").prefetch_weights is False
    assert Parallelism(prefetch_weights=True).prefetch_weights is True
    with pytest.raises(UserError, match=r"prefetch_weights = 'backward'.*true, false or "
                                        r"'forward'"):
        llmsim.load_scenario(TINY, ["parallelism.prefetch_weights=backward"])


def _passes(result, kind: str) -> int:
    return len({(r.microbatch, r.chunk) for r in result.trace.records
                if r.stream == "compute" and r.kind == kind})


@pytest.mark.parametrize("extra", [{}, {"parallelism__recompute": "full",
                                        "parallelism__regather_for_recompute": True}])
def test_only_the_backward_waits_for_its_gathers(extra) -> None:
    """Gathers of a tenth of a forward layer: with ``true`` only the step's first layer
    waits for its gather; with ``forward`` so does every layer of every backward (twice
    with a regather for the recompute); with ``false`` every layer of every pass."""
    layers = 8
    f_layer = _zero3(_GatherOnlyCosts(0.0), **extra).trace.blocks[(0, 0, "F")].duration_s \
        / layers
    g = f_layer / 10
    free = _zero3(_GatherOnlyCosts(0.0), **extra)
    steps = {mode: _zero3(_GatherOnlyCosts(g), prefetch=mode, **extra)
             for mode in (True, "forward", False)}
    forwards, backwards = _passes(free, "F"), _passes(free, "B")
    per_backward = layers * (2 if extra else 1)
    expected = {True: g, "forward": g + backwards * per_backward * g,
                False: (forwards * layers + backwards * per_backward) * g}
    for mode, result in steps.items():
        assert result.step_time_s == pytest.approx(free.step_time_s + expected[mode],
                                                   rel=1e-9), mode
        assert result.breakdown_s["dp_comm"] == pytest.approx(expected[mode], rel=1e-9)
    waits = steps["forward"].trace.dp_waits
    assert len(waits) == 1 + backwards * per_backward


@pytest.mark.parametrize("gather_layers", [0.5, 2.0, 5.0])
def test_forward_lies_between_the_ends(gather_layers: float) -> None:
    f_layer = _zero3(_GatherOnlyCosts(0.0)).trace.blocks[(0, 0, "F")].duration_s / 8
    steps = [_zero3(_GatherOnlyCosts(gather_layers * f_layer), prefetch=mode).step_time_s
             for mode in (True, "forward", False)]
    assert steps[0] < steps[1] < steps[2]


def test_the_wait_after_a_w_takes_each_next_pass_s_own_prefetch() -> None:
    """A W followed by a forward (share 1 − cooled) waits as with prefetch, one followed
    by a backward as without; with a regather the backward starts with its recompute,
    whose gather is the backward's, not ahead."""
    args = ((3, 0.1), 0.2, 0.25, 0.7)
    ahead = reduce_scatter_wait_s((3, 0.1), 0.2, 0.25, prefetch=True)
    waited = reduce_scatter_wait_s((3, 0.1), 0.2, 0.7, prefetch=False)
    for cooled in (0.0, 0.3, 1.0):
        for regather in (False, True):
            assert blended_wait_s(*args, cooled, regather=regather, prefetch="forward") \
                == pytest.approx(cooled * waited + (1 - cooled) * ahead)


@pytest.mark.parametrize("sets", [
    ["pp=1"], ["pp=1", "recompute=full"],
    ["pp=1", "recompute=full", "regather_for_recompute=true"], [],
    ["recompute=full", "regather_for_recompute=true"]])
def test_the_estimator_agrees_with_the_engine(sets: list[str]) -> None:
    scenario = llmsim.load_scenario(TINY, ["parallelism.zero=3", "parallelism.micro_batch=2",
                                           "parallelism.prefetch_weights=forward",
                                           *(f"parallelism.{s}" for s in sets)])
    assert Estimator().estimate(scenario).step_time_s == pytest.approx(
        simulate(scenario).step_time_s, rel=0.01)

