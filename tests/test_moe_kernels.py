"""The router and permutation kernels of a MoE layer (llmsim.moe, issue #41): where they
sit in the forward and backward passes and what they cost, in closed form."""

from __future__ import annotations

import pytest
from helpers import make_scenario

from llmsim.experts import FP32_BYTES
from llmsim.moe import ROUTER_PASSES
from llmsim.workload import build_workload

MOE = {"experts": 8, "top_k": 2, "ffn_hidden": 1024}
ROUTING = ("router", "router_topk", "moe_permute", "moe_unpermute")


def first_chunk(**overrides):
    s = make_scenario(parallelism__pp=1, parallelism__ep=2,
                      parallelism__sequence_parallel=True, **overrides)
    work = build_workload(s.model, s.parallelism, s.training, s.dp)
    return s, work.chunks[(0, 0)]


def one_layer(names: list[str], first: str) -> list[str]:
    """The names of the first MoE layer's MLP: from ``first`` up to its next appearance."""
    start = names.index(first)
    end = names.index(first, start + 1) if names.count(first) > 1 else len(names)
    return names[start:end]


def test_the_forward_routes_permutes_dispatches_computes_combines_and_unpermutes() -> None:
    _, chunk = first_chunk(model__moe=MOE)
    layer = one_layer([op.name for op in chunk.forward], "router")
    order = ["router", "router_topk", "moe_permute", "moe_dispatch", "expert_up", "expert_act",
             "expert_down", "moe_combine", "moe_unpermute"]
    assert [name for name in layer if name in order] == order


def test_the_backward_runs_them_in_reverse() -> None:
    _, chunk = first_chunk(model__moe=MOE)
    layer = one_layer([op.name for op in chunk.backward], "moe_unpermute_bwd")
    order = ["moe_unpermute_bwd", "moe_combine_bwd", "expert_down_dx", "expert_up_dx",
             "moe_dispatch_bwd", "moe_permute_bwd", "router_topk_bwd", "router_dx"]
    assert [name for name in layer if name in order] == order


def test_router_and_permutation_bytes_closed_forms() -> None:
    """A micro-batch of T = 512 tokens, TP 2 with sequence parallelism: each rank routes
    T_s = 256 tokens of h = 512 to k = 2 of E = 8 experts, in BF16. Router GEMM T_s × E × h;
    its top-k makes 3 FP32 passes over the T_s·E logits; the permutation reads and writes
    T_s·k rows of h; the un-permutation reads the k outputs of each token and writes their
    sum, (T_s·k + T_s) rows."""
    s, chunk = first_chunk(model__moe=MOE)
    ts, k, experts, h, e = 256, 2, 8, 512, 2
    assert s.training.seq_len * s.parallelism.micro_batch // s.parallelism.tp == ts
    ops = {op.name: op for op in chunk.forward}
    assert ops["router"].mnk == (ts, experts, h)
    assert ops["router"].flops == 2 * ts * experts * h
    assert ops["router_topk"].bytes == ts * experts * FP32_BYTES * ROUTER_PASSES == ts * 8 * 4 * 3
    assert ops["moe_permute"].bytes == 2 * ts * k * h * e
    assert ops["moe_unpermute"].bytes == (ts * k + ts) * h * e


@pytest.mark.parametrize("top_k", [1, 2, 4])
def test_permutation_grows_with_top_k_and_the_router_does_not(top_k: int) -> None:
    _, one = first_chunk(model__moe=MOE | {"top_k": 1})
    _, many = first_chunk(model__moe=MOE | {"top_k": top_k})
    a = {op.name: op for op in one.forward}
    b = {op.name: op for op in many.forward}
    assert b["moe_permute"].bytes == top_k * a["moe_permute"].bytes
    assert b["router"].flops == a["router"].flops
    assert b["router_topk"].bytes == a["router_topk"].bytes


def test_one_expert_has_no_router_and_no_permutation() -> None:
    s = make_scenario(model__moe={"experts": 1, "top_k": 1, "ffn_hidden": 2048})
    work = build_workload(s.model, s.parallelism, s.training, s.dp)
    names = {op.name for chunk in work.chunks.values() for op in chunk.ops}
    assert "expert_up" in names
    assert not names & {*ROUTING, "router_topk_bwd", "moe_permute_bwd", "moe_unpermute_bwd"}
