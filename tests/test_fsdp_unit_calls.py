"""FSDP1's gathers as DistFlashAttn's code makes them (docs/validation.md §10, DFA24):
each unit gathered at each call of it (``parallelism.gathers_per_call``), again for its
recompute (``regather_for_recompute``), the recompute's gather issued when the recompute
is reached (``prefetch_recompute_gather`` false). Counts and waits read from the trace."""

from __future__ import annotations

from itertools import pairwise

import pytest

from llmsim import simulate
from llmsim import validation as v

RUNS = {r.id: r for r in v.load_runs() if r.id.startswith(("DFA24", "FRONTIER24"))}
LAYERS = 32


def _scenario(row: str, **par):
    sc = v.scenario_for(RUNS[row])
    return sc.model_copy(update={"parallelism": sc.parallelism.model_copy(update=par)})


def _gathers(result) -> list:
    return sorted((r for r in result.trace.records if r.device == 0 and r.stream == "dp"
                   and r.name.startswith("z3_ag")), key=lambda r: r.start_s)


@pytest.mark.parametrize(("row", "calls"), [("DFA24-19", 2), ("DFA24-13", 1)])
def test_each_call_of_a_unit_gathers_it(row, calls):
    """A unit called ``calls`` times a forward is gathered that many times in the forward
    and twice that in the backward (each recompute call and the pre-backward hook after
    it): 32 layers × 3 × calls all-gathers of one unit's 404.8 MB (202.4 M FP16
    parameters) over the box's 8 ranks, each as long as any other."""
    result = simulate(_scenario(row))
    gathers = _gathers(result)
    assert len(gathers) == LAYERS * 3 * calls
    durations = [r.end_s - r.start_s for r in gathers]
    assert max(durations) - min(durations) < 1e-12


def test_one_call_a_pass_is_the_unit_gathered_once():
    """``gathers_per_call`` 1 gathers each unit once a forward: half of DistFlashAttn's
    patch's count, and the dp stream's gather time halves with it."""
    two = _gathers(simulate(_scenario("DFA24-01")))
    one = _gathers(simulate(_scenario("DFA24-01", gathers_per_call=1)))
    assert len(two) == 2 * len(one)
    assert sum(r.end_s - r.start_s for r in two) == pytest.approx(
        2 * sum(r.end_s - r.start_s for r in one), rel=1e-12)


def _recompute_waits(row: str, **par) -> list[float]:
    """Device 0's compute idle inside its backward pass (between two of its part records),
    s."""
    records = simulate(_scenario(row, **par)).trace.records
    backward = sorted((r for r in records if r.device == 0 and r.stream == "compute"
                       and r.name == "B0"), key=lambda r: r.start_s)
    return [b.start_s - a.end_s for a, b in pairwise(backward) if b.start_s > a.end_s + 1e-12]


def test_a_recompute_gathered_when_reached_waits_for_its_first_call():
    """At 8K tokens a GPU every kernel run outlasts a gather, so only a gather issued when
    its part is reached can be waited for: with the recompute's gather issued at the
    recompute (FSDP1 under a reentrant checkpoint), each of the 31 later layers' recompute
    waits one call's gather (1.6 ms; the second call's runs under the first call's
    compute; the first layer's wait comes before the pass's first record); prefetched one
    part ahead, no recompute waits. The reductions after the backward here; issued in it,
    each wait also holds one (``tests/test_fsdp_unit_reductions.py``)."""
    gather_s = _gathers(simulate(_scenario("DFA24-01")))[0]
    one_gather_s = gather_s.end_s - gather_s.start_s
    waits = _recompute_waits("DFA24-01", reduce_in_backward=False)
    assert waits == pytest.approx([one_gather_s] * (LAYERS - 1), rel=1e-6)
    assert _recompute_waits("DFA24-01", prefetch_recompute_gather=True,
                            reduce_in_backward=False) == []


def _forward_waits(sc) -> list[float]:
    records = simulate(sc).trace.records
    forward = sorted((r for r in records if r.device == 0 and r.stream == "compute"
                      and r.name == "F0"), key=lambda r: r.start_s)
    return [b.start_s - a.end_s for a, b in pairwise(forward) if b.start_s > a.end_s + 1e-12]


def test_a_gather_issued_when_reached_waits_for_its_first_call_only():
    """Not prefetched (``prefetch_weights`` false), each forward layer of DFA24-01 (8K
    tokens a GPU, two calls a layer) waits for its first call's gather only, 1.6 ms, the
    second call's running under the first call's kernels (as FSDP1 issues each call's
    gather at the call); such a step runs on SimPy, whose loop this is."""
    from llmsim.engine import uncontended
    from llmsim.simulation import build_engine

    sc = _scenario("DFA24-01", prefetch_weights=False)
    gather = _gathers(simulate(sc))[0]
    waits = _forward_waits(sc)
    assert waits == pytest.approx([gather.end_s - gather.start_s] * (LAYERS - 1), rel=1e-6)
    frontier = _scenario("FRONTIER24-01", gathers_per_call=2)
    assert uncontended.simpy_reason(build_engine(frontier, None)) == (
        "a gather per call of a layer")
