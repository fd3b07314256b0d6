"""llmsim.moe_host (issue #41): Transformer Engine GroupedLinear's per-expert kernels as
host launches (training.expert_host_loop), priced by the host issue queue
(ComputeOp.host_loop_kernels at HostIssue.loop_interval_s)."""

from __future__ import annotations

import pytest
from helpers import make_scenario
from hypothesis import given, settings
from hypothesis import strategies as st

from llmsim import validation as v
from llmsim.blocks import Block
from llmsim.costs import HardwareCosts
from llmsim.costs.host_issue import host_kernels, op_host_s, pass_waits_s, queue_waits_s
from llmsim.moe_host import grouped_linear_launches
from llmsim.ops import ComputeOp
from llmsim.plan import Plan
from llmsim.simulation import simulate
from llmsim.workload import build_workload

FC1_FORWARD = ("fp8_amax_expert_up", "fp8_cast_expert_up", "expert_up")
FC2_BACKWARD = ("fp8_amax_expert_down_grad", "fp8_cast_expert_down_grad", "expert_down_dx",
                "expert_down_dw")


def _scenario(local: int, loop: bool, scaling: str = "current", ffn: int = 1024,
              hidden: int | None = None, graphs: bool = False,
              capacity: float | None = None):
    """A MoE model in FP8 on EP 2 of an H100 system, ``local`` experts a rank."""
    extra = {} if hidden is None else {"model__hidden": hidden}
    moe = {"experts": 2 * local, "top_k": 2, "ffn_hidden": ffn}
    if capacity is not None:
        moe["capacity_factor"] = capacity
    return make_scenario(system="eos", parallelism__pp=1, parallelism__tp=1,
                         parallelism__ep=2, model__moe=moe,
                         training__precision="fp8", training__fp8_scaling=scaling,
                         training__expert_host_loop=loop, training__cuda_graphs=graphs,
                         **extra)


def _layer_ops(s):
    chunk = build_workload(s.model, s.parallelism, s.training, s.dp).chunks[(0, 0)]
    return list(chunk.forward), list(chunk.backward) + list(chunk.weight)


def _launches(ops, names) -> tuple[int, int]:
    """(host calls, loop kernels) of the first op of each name."""
    first = [next(op for op in ops if op.name == name) for name in names]
    return (sum(host_kernels(op) for op in first),
            sum(op.host_loop_kernels for op in first))


@pytest.mark.parametrize("local", [1, 2, 4, 8])
def test_a_grouped_linear_pass_issues_the_closed_form_of_its_local_experts(local):
    fwd, bwd = _layer_ops(_scenario(local, loop=True))
    assert grouped_linear_launches(local, "current", "F") == (3, 5 * local - 3)
    assert grouped_linear_launches(local, "current", "B") == (4, 6 * local - 4)
    assert _launches(fwd, FC1_FORWARD) == (3, 5 * local - 3)
    assert _launches(bwd, FC2_BACKWARD) == (4, 6 * local - 4)


@pytest.mark.parametrize("local", [1, 4, 8])
def test_delayed_scaling_and_bf16_launch_one_gemm_an_expert(local):
    assert grouped_linear_launches(local, "delayed", "F") == (2, local - 1)
    assert grouped_linear_launches(local, None, "F") == (1, local - 1)
    assert grouped_linear_launches(local, None, "B") == (2, 2 * (local - 1))
    fwd, _ = _layer_ops(_scenario(local, loop=True, scaling="delayed"))
    assert _launches(fwd, ("fp8_cast_expert_up", "expert_up")) == (2, local - 1)


def test_switch_off_declares_no_loop_kernels():
    fwd, bwd = _layer_ops(_scenario(8, loop=False))
    assert not any(getattr(op, "host_loop_kernels", 0) for op in fwd + bwd)
    assert not any(op.name.startswith("fp8_cast_qkv") and op.host_loop_kernels
                   for op in _layer_ops(_scenario(8, loop=True))[0])  # dense ops keep theirs


def _passes_s(s) -> list[float]:
    costs = HardwareCosts.from_scenario(s, Plan.from_scenario(s))
    return [Block.of(tuple(ops), costs).duration_s for ops in _layer_ops(s)]


def test_short_experts_wait_for_the_host_and_cuda_graphs_never_do():
    """Tiny experts (hidden 256, expert FFN 128): the host's 5·8 − 3 launches a forward
    outrun their kernels, so the switch lengthens the passes; replayed from graphs the
    queue is gone and the switch changes nothing."""
    off, on = (_passes_s(_scenario(8, loop, ffn=128, hidden=256)) for loop in (False, True))
    assert all(b >= a for a, b in zip(off, on, strict=True)) and on[0] > off[0]
    graphs = [_passes_s(_scenario(8, loop, ffn=128, hidden=256, graphs=True))
              for loop in (False, True)]
    assert graphs[0] == graphs[1]


def test_a_device_bound_layer_is_not_moved():
    """Long expert GEMMs (hidden 4,096, expert FFN 14,336) and no host sync in the layer
    (a capacity factor: the all-to-all's splits are known without the token counts): the
    host issues each op well before the device reaches it, so the passes keep their time
    to the last bit."""
    off, on = (_passes_s(_scenario(8, loop, ffn=14336, hidden=4096, capacity=1.0))
               for loop in (False, True))
    assert on == off


def test_after_the_dispatch_sync_only_the_first_quantisation_is_exposed():
    """Dropless, the host waits for the token counts before the dispatch and issues from
    there: with long GEMMs what the device can wait for is at most the first
    GroupedLinear's quantisation launches, (4·E − 2) loop kernels a layer's forward."""
    s = _scenario(8, False, ffn=14336, hidden=4096)
    off, on = (_passes_s(_scenario(8, loop, ffn=14336, hidden=4096)) for loop in (False, True))
    loop_s = s.system.node.accelerator.host_dispatch_us * 1e-6
    assert 0 < on[0] - off[0] <= s.model.layers * (4 * 8 - 2) * loop_s
    assert on[1] == off[1]  # the backward reuses the counts: no sync, the host ahead


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(0.0, 1e-4), min_size=1, max_size=20), st.floats(1e-6, 5e-5))
def test_equal_gaps_are_the_uniform_queue(durations_s, interval_s):
    gaps = [interval_s] * len(durations_s)
    assert queue_waits_s(durations_s, interval_s, gaps_s=gaps) == pytest.approx(
        queue_waits_s(durations_s, interval_s), abs=1e-15)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.floats(0.0, 2e-4), st.integers(1, 6), st.integers(0, 8)),
                min_size=1, max_size=8), st.floats(1e-6, 4e-5))
def test_a_loop_kernel_at_the_interval_is_one_more_dispatch(ops_spec, interval_s):
    """An op of one call and ``n`` loop kernels, loop launches priced at the dispatch
    interval, queues as an op of ``n + 1`` dispatches."""
    looped = [ComputeOp("k", "memory", "F", 0.0, 1.0, splits=c + n, host_calls=c,
                        host_loop_kernels=n) for _, c, n in ops_spec]
    plain = [ComputeOp("k", "memory", "F", 0.0, 1.0, splits=c + n) for _, c, n in ops_spec]
    durations = [d for d, _, _ in ops_spec]
    assert [op_host_s(op, interval_s, interval_s) for op in looped] == pytest.approx(
        [op_host_s(op, interval_s) for op in plain])
    assert pass_waits_s(looped, durations, interval_s, loop_interval_s=interval_s) == \
        pytest.approx(pass_waits_s(plain, durations, interval_s), abs=1e-15)


def test_the_row_prices_the_loop_and_stays_device_bound():
    """MBRIDGE-2604-MOE-02 (8 local experts, FP8 current scaling): the host issues a pass
    in well under the device's time, so the launches do not move the step; at the module
    dispatch per launch (33.8 us, an upper bound no measurement supports) they would."""
    run = {r.id: r for r in v.load_runs("MBRIDGE")}["MBRIDGE-2604-MOE-02"]
    s = v.scenario_for(run)
    assert s.training.expert_host_loop
    costs = HardwareCosts.from_scenario(s, Plan.from_scenario(s))
    issue = costs.host_issue
    for ops in _layer_ops(s):
        host = sum(op_host_s(op, issue.interval_s, issue.loop_interval_s) for op in ops)
        assert host < 0.7 * Block.of(tuple(ops), costs).duration_s
    off = s.model_copy(update={"training": s.training.model_copy(
        update={"expert_host_loop": False})})
    assert simulate(s).step_time_s == simulate(off).step_time_s
    acc = s.system.node.accelerator
    slow = acc.model_copy(update={"host_dispatch_us": acc.host_module_dispatch_us})
    system = s.system.model_copy(update={"node": s.system.node.model_copy(
        update={"accelerator": slow})})
    assert simulate(s.model_copy(update={"system": system})).step_time_s > \
        1.1 * simulate(s).step_time_s


def test_the_prepared_benchmark_counts_the_launches_an_expert_adds():
    """benchmarks/time_grouped_linear_host.py divides its slope by the loop launches one
    more expert adds: the closed form's increments."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))
    import time_grouped_linear_host as bench

    for fp8, scaling in ((True, "current"), (False, None)):
        per = [grouped_linear_launches(9, scaling, p)[1] - grouped_linear_launches(8, scaling, p)[1]
               for p in ("F", "B")]
        assert bench.launches_per_expert(fp8) == tuple(per)
    assert bench.slope_us([1, 2, 4, 8], [10.0, 14.0, 22.0, 38.0]) == pytest.approx(4.0)
    with pytest.raises(ValueError):
        bench.slope_us([8], [1.0])
