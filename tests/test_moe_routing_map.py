"""HybridEP's routing-map all-gather (llmsim.moe: ``MoeBlock._routing_map_gather``): once
per MoE layer's forward, before the dispatch, every rank's ``tokens × experts`` boolean map
gathered over the expert-parallel group and priced on the group's links; and
MBRIDGE-2604-MOE-02's HybridEP choice (32 SMs, from Megatron-Bridge's perf overrides)."""

from __future__ import annotations

import pytest

import llmsim
import llmsim.moe as moe
from llmsim import validation as v
from llmsim.blocks import Block
from llmsim.costs import HardwareCosts
from llmsim.ops import CommOp
from llmsim.plan import Plan
from llmsim.workload import build_workload

RUNS = {r.id: r for r in v.load_runs()}
ROW = "MBRIDGE-2604-MOE-02"


def _scenario(dispatcher: str = "hybridep") -> llmsim.Scenario:
    s = v.scenario_for(RUNS[ROW])
    return s.model_copy(update={"parallelism": s.parallelism.model_copy(
        update={"moe_dispatcher": dispatcher})})


def _gathers(s: llmsim.Scenario) -> tuple[list[CommOp], list[CommOp]]:
    w = build_workload(s.model, s.parallelism, s.training, s.dp)
    chunk = w.chunks[(0, 0)]
    pick = [op for op in chunk.forward + chunk.backward
            if isinstance(op, CommOp) and op.name == "moe_routing_map_ag"]
    return pick, [op for op in chunk.forward if isinstance(op, CommOp)]


def test_gathered_bytes_closed_form():
    """ranks·tokens·experts·1 byte (torch.bool), nccl-tests' all-gather size (the output)."""
    assert moe.routing_map_gather_bytes(4096, 128, 16) == 16 * 4096 * 128 * 1
    assert moe.routing_map_gather_bytes(2048.0, 64, 8) == 8 * 2048 * 64


def test_moe_02_gathers_its_8_mib_map_once_per_moe_layer_forward():
    """Qwen3-30B-A3B, MBS 1 × 4,096 tokens, 128 experts, EP 16 (TP 1: no sequence split):
    16 × 4,096 × 128 B = 8 MiB over the EP group, in the forward only (the backward reuses
    the handle), just before each dispatch."""
    s = _scenario()
    gathers, forward_comm = _gathers(s)
    assert len(gathers) == s.model.layers == 48
    assert {(op.collective, op.axis, op.phase) for op in gathers} == {("all_gather", "ep", "F")}
    assert {op.bytes for op in gathers} == {8 * 2**20}
    names = [op.name for op in forward_comm]
    for i, name in enumerate(names):
        if name == "moe_routing_map_ag":
            assert names[i + 1] == "moe_dispatch"


@pytest.mark.parametrize("dispatcher", ["alltoall", "deepep", "deepep_low_latency"])
def test_other_dispatchers_gather_no_routing_map(dispatcher):
    assert _gathers(_scenario(dispatcher))[0] == []


def test_the_gather_crosses_the_two_nodes_and_counts_with_the_all_to_alls():
    """Priced by the collective model on the EP group's path (two nodes here): slower than
    the same bytes on one node's NVLink alone, and in the pass's all-to-all part."""
    s = _scenario()
    plan = Plan.from_scenario(s)
    costs = HardwareCosts.from_scenario(s, plan)
    op = _gathers(s)[0][0]
    assert costs.collectives.path("ep").nodes == 2
    t = costs.comm_s(op)
    one_node = Plan.from_scenario(s.model_copy(update={"parallelism": s.parallelism.model_copy(
        update={"ep": 8})}))
    assert 0 < HardwareCosts.from_scenario(s, one_node).comm_s(op) < t
    block = Block.of((op,), costs)
    assert block.a2a_s == pytest.approx(t) and block.tp_s == 0.0


def test_the_step_pays_one_gather_per_moe_layer_and_micro_batch(monkeypatch):
    """No pipeline, no all-to-all overlap: every gather is on the critical path, 48 MoE
    layers × 64 micro-batches (1,024 sequences over dp 16), to 1e-3 (the gradient
    reduction overlapped with the last backward shifts a little with it)."""
    s = _scenario()
    costs = HardwareCosts.from_scenario(s, Plan.from_scenario(s))
    each_s = costs.comm_s(_gathers(s)[0][0])
    run = RUNS[ROW]
    with_gathers = v.predict(run).result.step_time_s
    monkeypatch.setattr(moe.MoeBlock, "_routing_map_gather", lambda self: [])
    without = v.predict(run).result.step_time_s
    assert with_gathers - without == pytest.approx(48 * 64 * each_s, rel=1e-3)


def test_moe_02_runs_hybridep_on_32_sms_without_units_held_beside_gemms():
    """The choice records Megatron-Bridge's perf override (32 SMs, not the recipe's 16) and
    its code path; without moe_a2a_overlap no GEMM runs beside the kernels, so llmsim holds
    no compute units for them and the 16-SM measured rate prices them."""
    run = RUNS[ROW]
    choice = run.choices["parallelism.moe_dispatcher"]
    assert choice.value == "hybridep"
    assert "moe_hybridep_num_sms 32" in choice.why
    assert "_set_common_perf_overrides" in choice.why
    par = v.scenario_for(run).parallelism
    assert not par.moe_a2a_overlap and par.moe_comm_units == 0
