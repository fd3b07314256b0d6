"""ZeRO-3's reductions issued in the backward, unit by unit, as FSDP1's post-backward hook
issues them (``parallelism.reduce_in_backward``), and a unit's gradient reduced once for
each nested backward that reaches it (``reduce_scatters_per_unit``: 2 under
DistFlashAttn's checkpointing patch, docs/validation.md §10, DFA24). Counts, order and
the step's change read from the trace."""

from __future__ import annotations

import pytest

from llmsim import simulate
from llmsim import validation as v
from llmsim.blocks import Block
from llmsim.simulation import build_engine
from llmsim.workload import build_workload

RUNS = {r.id: r for r in v.load_runs() if r.id.startswith("DFA24")}
LAYERS = 32


def _scenario(row: str, **par):
    sc = v.scenario_for(RUNS[row])
    return sc.model_copy(update={"parallelism": sc.parallelism.model_copy(update=par)})


def _dp(result) -> list:
    return sorted((r for r in result.trace.records if r.device == 0 and r.stream == "dp"),
                  key=lambda r: r.start_s)


def _reductions(result) -> list:
    return [r for r in _dp(result) if r.name.startswith("dp_rs")]


@pytest.mark.parametrize(("row", "per_unit"), [("DFA24-19", 2), ("DFA24-13", 1)])
def test_each_unit_is_reduced_once_a_nested_backward(row, per_unit):
    """32 layers × ``per_unit`` reductions, all inside the backward, none queued after it
    (off: the chunk's buckets after it); each of one layer's share of the chunk's
    gradients (the chunk's bytes split evenly over its layers, as its gathers are), so
    the units' reductions carry ``per_unit`` times the buckets' bytes."""
    sc = _scenario(row)
    on = _reductions(simulate(sc))
    assert len(on) == LAYERS * per_unit
    assert {r.name for r in on} == {"dp_rs_c0_unit"}
    off = _reductions(simulate(_scenario(row, reduce_in_backward=False)))
    assert off and all(r.name.startswith("dp_rs_c0_b") for r in off)
    work = build_workload(sc.model, sc.parallelism, sc.training, sc.dp)
    chunk = work.chunks[(0, 0)]
    unit_bytes = sum(op.bytes for op in work.unit_grad_ops(chunk))
    assert unit_bytes * LAYERS == pytest.approx(
        sum(op.bytes for op in work.dp_grad_ops(chunk)), rel=1e-12)


def test_a_unit_s_reductions_as_fsdp1_orders_them():
    """DistFlashAttn's patch at 8K tokens a GPU (DFA24-01), the dp stream in order: each
    layer's first reduction as its backward ends, then the next layer's gathers (its
    recompute's two calls, issued when the recompute is reached, and its backward's two),
    then the first layer's second reduction, which ran under that layer's backward in
    the code, and that layer's own first; the last layer's second after the pass."""
    names = [r.name for r in _dp(simulate(_scenario("DFA24-01")))]
    first = names.index("dp_rs_c0_unit")
    rs = "dp_rs_c0_unit"
    assert names[first:first + 13] == [rs, *["z3_ag_c0_l30"] * 4, rs, rs,
                                       *["z3_ag_c0_l29"] * 4, rs, rs]
    assert names[-8:] == [rs, *["z3_ag_c0_l0"] * 4, rs, rs, rs]


@pytest.mark.parametrize("row", ["DFA24-01", "DFA24-13", "DFA24-19", "DFA24-20"])
def test_the_step_changes_by_the_reductions_the_recomputes_wait_for(row):
    """The step with the reductions in the backward less the step with them after it: each
    of the 31 later layers' recompute waits one layer's reduction ``r`` ahead of its
    gather, the last layer's ``n`` run under the weight-gradient pass ``W`` and the
    chunk's reductions after the backward (``A``) are gone: ``31 r + max(0, n r − W) − A``
    (−1.66 ms at DistFlashAttn's LLaMA-7B units; the second reduction of each unit, under
    the patch, runs under the next unit's backward at every length)."""
    sc = _scenario(row)
    work = build_workload(sc.model, sc.parallelism, sc.training, sc.dp)
    costs = build_engine(sc).costs
    chunk = work.chunks[(0, 0)]
    r = sum(costs.comm_s(op) for op in work.unit_grad_ops(chunk))
    after = sum(costs.comm_s(op) for op in work.dp_grad_ops(chunk))
    w = Block.of(chunk.weight, costs, sc.parallelism.overlap_tp_comm, 0).duration_s
    expected = (LAYERS - 1) * r + max(0.0, work.unit_reductions * r - w) - after
    on = simulate(sc).step_time_s
    off = simulate(_scenario(row, reduce_in_backward=False)).step_time_s
    assert on - off == pytest.approx(expected, abs=1e-9)
    assert expected < 0


def test_off_by_default_and_without_zero3():
    """The switch is off in the specs, and ZeRO-1/2 has no gathered backward to reduce in
    (the workload asks for no reductions in it)."""
    sc = _scenario("DFA24-19")
    assert not type(sc.parallelism)().reduce_in_backward
    for zero, expected in ((3, 2), (2, 0), (0, 0)):
        par = sc.parallelism.model_copy(update={"zero": zero})
        assert build_workload(sc.model, par, sc.training, sc.dp).unit_reductions == expected
