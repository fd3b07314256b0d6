"""Session s15's pricing shortcuts (branch ``speedG``) give the numbers of the code they
replace, bit for bit: the memory model's buffers memoised across layouts
(:meth:`llmsim.search.fit.PeakMemory._buffer_bytes`), the warm-up walk of posted sends
(:func:`llmsim.search.posted_sends.first_backward_s`) and a batch's columns read with
one ``attrgetter`` per layout (:func:`llmsim.search.price.columns`)."""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import llmsim
from llmsim.memory import _buffer_bytes
from llmsim.search.fit import PeakMemory
from llmsim.search.posted_sends import first_backward_s

_BASE = llmsim.load_scenario("selene-gpt3").model_copy(update={"fidelity": "reduced"})

_LAYOUT = st.fixed_dictionaries({
    "tp": st.sampled_from([1, 2, 4, 8]), "pp": st.sampled_from([1, 2, 3, 4, 8, 16]),
    "virtual_stages": st.sampled_from([1, 2, 3]),
    "micro_batch": st.sampled_from([1, 2, 4]), "zero": st.integers(0, 3),
    "sequence_parallel": st.booleans(), "prefetch_weights": st.sampled_from(
        [True, False, "forward"]), "dp_bucket_mb": st.sampled_from([25.0, 40.0]),
})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layouts=st.lists(st.tuples(_LAYOUT, st.sampled_from([1, 2, 8, 64]),
                                  st.integers(0, 15), st.integers(0, 12)),
                        min_size=1, max_size=30),
       precision=st.sampled_from(["bf16", "fp32"]))
def test_memoised_buffers_equal_the_memory_models_in_any_order(layouts: list,
                                                              precision: str) -> None:
    """Property: one :class:`PeakMemory` asked for the buffers of random layouts, stages
    and layer counts in a random order gives :func:`llmsim.memory._buffer_bytes`' own
    number for each (the memo's key holds everything that function reads)."""
    memory = PeakMemory(_BASE)
    training = _BASE.training.model_copy(update={"precision": precision})
    for fields, dp, stage, layers in layouts:
        fields = {**fields, "schedule": "interleaved-1f1b" if fields["virtual_stages"] > 1
                  else "1f1b", "grad_reduce_launch": "bucket_ready"}
        par = _BASE.parallelism.model_copy(update=fields)
        stage = stage % par.pp
        if 0 < stage < par.pp - 1:  # a middle stage holds layers (the ends may not)
            layers = max(layers, 1)
        want = _buffer_bytes(_BASE.model, par, training, dp, stage, layers)
        assert memory._buffer_bytes(par, training, dp, stage, layers) == want


def _first_backward_reference(forward_s: list, hop_s: list, gathers: list | None) -> float:
    """:func:`first_backward_s`'s walk as its docstring states the rules, each wait a
    ``max()`` and every start kept (its loop before session s15): the reference."""
    p, v = len(forward_s), len(forward_s[0])
    last = (v - 1) * p
    size = last + p
    start = [[0.0] * size for _ in range(p)]
    end = [[0.0] * size for _ in range(p)]
    sent = [[0.0] * size for _ in range(p)]
    for k in range(size):
        stages = range(min(p, k + 1))
        for s in stages:
            j = k - s
            row, done, out = end[s], sent[s], forward_s[s]
            c = j // p
            t = max(row[j - 1], done[j - 1]) if j else 0.0
            arrival = sent[s - 1][j] if s else (sent[p - 1][j - p] if c else 0.0)
            t = max(t, arrival)
            f = out[c]
            if gathers is not None and j % p == 0:
                layer_s, layers = gathers[s][c]
                t = max(t, (start[s][j - 1] if j else 0.0) + layer_s)
                if layers > 1 and layer_s > f / layers:
                    f += (layers - 1) * (layer_s - f / layers)
            start[s][j] = t
            row[j] = t + f
        for s in stages:
            j = k - s
            if s == p - 1 and j >= last:
                continue
            posted = (end[s + 1][j - 1] if j else 0.0) if s < p - 1 else end[0][j + p - 1]
            done = sent[s]
            t = max(end[s][j], posted)
            if j:
                t = max(t, done[j - 1])
            done[j] = t + hop_s[s]
    return end[p - 1][last]


@settings(max_examples=150, deadline=None)
@given(p=st.integers(2, 8), v=st.integers(2, 6), seed=st.integers(0, 10**6),
       gathered=st.booleans())
def test_the_warm_up_walk_equals_its_reference(p: int, v: int, seed: int,
                                               gathered: bool) -> None:
    """Property: random unequal forwards, sends and gathers (some zero, some equal, so
    that ties occur): the walk gives the reference's number exactly."""
    rng = random.Random(seed)

    def some() -> float:
        return rng.choice([0.0, 1e-3, 2e-3, rng.uniform(0.0, 5e-3)])

    forward = [[some() + 1e-4 for _ in range(v)] for _ in range(p)]
    hops = [some() for _ in range(p)]
    gathers = [[(some(), rng.randint(1, 4)) for _ in range(v)] for _ in range(p)] \
        if gathered else None
    assert first_backward_s(forward, hops, gathers) == \
        _first_backward_reference(forward, hops, gathers)
