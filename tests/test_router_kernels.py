"""llmsim.workload.router_kernels: the MoE block input's gradient sum and the framework's
bookkeeping kernels around the router (training.moe_router_kernels)."""

from __future__ import annotations

import pytest

from llmsim import validation as v
from llmsim.costs import HardwareCosts
from llmsim.plan import Plan
from llmsim.simulation import simulate
from llmsim.workload import build_workload

RUNS = {r.id: r for r in v.load_runs()}


def _scenario(kernels: tuple[int, int], path: str = "bare", shared: int = 0):
    s = v.scenario_for(RUNS["MBRIDGE-2604-MOE-02"])
    model = s.model.model_copy(update={"moe": s.model.moe.model_copy(
        update={"shared_experts": shared})})
    return s.model_copy(update={"model": model, "training": s.training.model_copy(
        update={"moe_router_kernels": kernels, "host_path": path})})


def _chunk(s):
    c = build_workload(s.model, s.parallelism, s.training, s.dp).chunks[(0, 0)]
    return list(c.forward), list(c.backward)


def test_the_row_takes_the_counts_read_from_megatron_core():
    s = v.scenario_for(RUNS["MBRIDGE-2604-MOE-02"])
    assert s.training.moe_router_kernels == (8, 6) and s.training.host_path == "modules"


@pytest.mark.parametrize("shared", [0, 1])
def test_each_extra_reader_of_the_block_input_adds_one_three_pass_sum(shared):
    s = _scenario((0, 0), shared=shared)
    fwd, bwd = _chunk(s)
    layers = s.model.layers
    sums = [op for op in bwd if op.name.startswith("moe_input_grad_sum")]
    assert len(sums) == layers * (1 + shared)
    tokens = s.training.seq_len * s.parallelism.micro_batch  # tp 1: the whole sequence
    assert {op.bytes for op in sums} == {3 * tokens * s.model.hidden * 2}  # BF16 gradients
    names = [op.name for op in bwd]
    at = names.index("router_dx")
    assert names[at + 1:at + 2 + shared] == ["moe_input_grad_sum",
                                             *(["moe_input_grad_sum1"] if shared else [])]
    assert names[at + 2 + shared] == "ln2_bwd"
    assert not any(op.name.startswith("moe_router_kernels") for op in fwd + bwd)


def test_bookkeeping_kernels_sit_by_the_router_as_kernels_of_no_traffic():
    s = _scenario((8, 6))
    fwd, bwd = _chunk(s)
    f = [op for op in fwd if op.name == "moe_router_kernels"]
    b = [op for op in bwd if op.name == "moe_router_kernels_bwd"]
    assert len(f) == len(b) == s.model.layers
    assert {(op.splits, op.bytes, op.flops) for op in f} == {(8, 0.0, 0.0)}
    assert {(op.splits, op.bytes, op.flops) for op in b} == {(6, 0.0, 0.0)}
    names_f, names_b = [op.name for op in fwd], [op.name for op in bwd]
    assert names_f[names_f.index("moe_router_kernels") - 1] == "router_topk"
    assert names_b[names_b.index("moe_router_kernels_bwd") + 1] == "router_topk_bwd"
    costs = HardwareCosts.from_scenario(s, Plan.from_scenario(s))
    gap_s = s.system.node.accelerator.kernel_launch_us * 1e-6
    assert costs.compute_s(f[0]) == pytest.approx(8 * gap_s)  # the device's gap each


def test_more_bookkeeping_kernels_never_shorten_the_step_and_the_host_path_adds_to_them():
    steps = {(k, p): simulate(_scenario(k, p)).step_time_s
             for k in ((0, 0), (8, 6), (120, 120)) for p in ("bare", "modules")}
    for p in ("bare", "modules"):
        assert steps[((0, 0), p)] < steps[((8, 6), p)] < steps[((120, 120), p)]
    for k in ((0, 0), (8, 6), (120, 120)):
        assert steps[(k, "modules")] >= steps[(k, "bare")]
    # 120 more dispatches of 33.8 us a layer outrun its device time: the host shows
    assert (steps[((120, 120), "modules")] - steps[((120, 120), "bare")]
            > steps[((8, 6), "modules")] - steps[((8, 6), "bare")])
