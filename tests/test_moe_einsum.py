"""DeepSpeed's GShard-style dispatch and combine (llmsim.moe_einsum): dense GEMMs over
one-hot [tokens, experts, capacity] masks in place of the row permutations, and the gate's
host read of the expert counts, as DeepSpeed v0.5.8's ``deepspeed/moe/sharded_moe.py``
runs them (``USE_EINSUM = True``). Closed forms at DeepSpeed-MoE's 1.3B+MoE-128 row
(DSMOE22-01: 8,192 tokens a GPU, 128 experts, capacity factor 1.0, hidden 2,048)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

import llmsim.moe as moe
from llmsim import validation as v
from llmsim.moe_einsum import MASK_BWD_BYTES_PER_ENTRY, MASK_FWD_BYTES_PER_ENTRY, capacity
from llmsim.ops import CommOp
from llmsim.simulation import simulate
from llmsim.workload import build_workload

RUN = {r.id: r for r in v.load_runs()}["DSMOE22-01"]
S, E, C, H = 8192, 128, 64, 2048
EINSUM_FLOPS = 2.0 * S * E * C * H  # 275 GFLOP, each of the four forward and three backward


def _scenario(dispatcher: str):
    s = v.scenario_for(RUN)
    return s.model_copy(update={"parallelism": s.parallelism.model_copy(
        update={"moe_dispatcher": dispatcher})})


def _chunk(dispatcher: str):
    s = _scenario(dispatcher)
    return build_workload(s.model, s.parallelism, s.training, s.dp).chunks[(0, 0)]


@given(st.integers(1, 1 << 16), st.sampled_from([8, 16, 64, 128]), st.sampled_from([1, 2]),
       st.sampled_from([0.5, 1.0, 1.25, 2.0]))
def test_capacity_is_deepspeeds(tokens, experts, top_k, factor):
    """``_capacity``: ceil(S/E·f), the factor doubled for top-2; never below one row."""
    c = capacity(tokens, experts, top_k, factor)
    assert c == max(1, math.ceil(tokens * top_k * factor / experts))
    assert c * experts >= tokens * top_k * factor  # every routed token has a slot


def test_the_row_routes_64_rows_an_expert():
    assert capacity(S, E, 1, 1.0) == C


def test_einsums_replace_the_permutations():
    """Forward: the masks and the dispatch GEMM [E·C, S]x[S, H] before the all-to-all, the
    combine GEMM [S, E·C]x[E·C, H] after it; the input-gradient pass adds the combine's two
    gradients and the dispatch's one (and, under full recompute, the forward again)."""
    ch = _chunk("deepspeed")
    fwd, bwd = [o.name for o in ch.forward], [o.name for o in ch.backward]
    assert "moe_permute" not in fwd + bwd and "moe_unpermute_bwd" not in bwd
    layer = fwd[fwd.index("moe_einsum_masks"):fwd.index("moe_einsum_masks") + 4]
    assert layer == ["moe_einsum_masks", "moe_dispatch_einsum", "moe_dispatch", "expert_up"]
    assert fwd.index("moe_combine") + 1 == fwd.index("moe_combine_einsum")
    for name in ("moe_dispatch_einsum", "moe_combine_einsum"):
        assert fwd.count(name) == 12  # the 12 MoE layers
    for name in ("moe_combine_einsum_dx", "moe_combine_einsum_dw", "moe_dispatch_einsum_dx"):
        assert bwd.count(name) == 12
    gemms = [o for o in ch.forward + ch.backward if "einsum" in o.name and o.kind == "gemm"]
    assert {o.flops for o in gemms} == {EINSUM_FLOPS}
    assert len(gemms) == 12 * 7  # forward 2, recompute 2, backward 3, per MoE layer
    shapes = {o.name: o.mnk for o in gemms}
    assert shapes["moe_dispatch_einsum"] == (E * C, H, S)
    assert shapes["moe_combine_einsum"] == (S, H, E * C)
    assert shapes["moe_combine_einsum_dw"] == (S, E * C, H)


def test_mask_bytes():
    """18 bytes an [S, E, C] entry forward, 10 backward: 1.21 GB and 0.67 GB a layer."""
    ch = _chunk("deepspeed")
    masks = {o.name: o.bytes for o in ch.forward + ch.backward if "einsum_masks" in o.name}
    assert masks["moe_einsum_masks"] == MASK_FWD_BYTES_PER_ENTRY * S * E * C
    assert masks["moe_einsum_masks_bwd"] == MASK_BWD_BYTES_PER_ENTRY * S * E * C


def test_megatron_core_dispatch_keeps_its_permutations():
    names = [o.name for o in _chunk("alltoall").forward]
    assert "moe_permute" in names and not any("einsum" in n for n in names)


def test_the_gate_reads_the_counts_in_every_forward():
    """``exp_counts ... .to('cpu')`` with a capacity too: one wait before each dispatch of
    the forward and of its recompute, none in the backward's all-to-alls."""
    s = _scenario("deepspeed")
    assert moe.dispatch_syncs_host(s.model.moe, s.parallelism)
    ch = _chunk("deepspeed")
    waits = [(o.name, o.host_s) for o in ch.forward + ch.backward
             if isinstance(o, CommOp) and o.collective == "all_to_all" and o.host_s]
    assert len(waits) == 24 and {n for n, _ in waits} == {"moe_dispatch"}


def test_einsums_cost_time():
    """The same row with Megatron-Core's row permutations is faster by at least the
    einsums' 84 GEMMs of 275 GFLOP at the A100's dense FP16 peak (0.074 s)."""
    floor_s = 84 * EINSUM_FLOPS / 312e12
    gap = simulate(_scenario("deepspeed")).step_time_s - simulate(_scenario("alltoall")).step_time_s
    assert gap > floor_s


def test_deepspeed_needs_a_capacity():
    s = v.scenario_for(RUN)
    data = s.model_dump()
    data["model"]["moe"]["capacity_factor"] = None
    with pytest.raises(ValueError, match="capacity_factor"):
        type(s).model_validate(data)
