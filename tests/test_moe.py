"""Mixture-of-experts models: parameter counts, FLOPs, memory, the MoE block's ops,
the expert-parallel gradient groups (llmsim.experts, llmsim.moe, llmsim.params)."""

from __future__ import annotations

import math

import pytest
import yaml
from helpers import make_scenario
from hypothesis import given, settings
from hypothesis import strategies as st

import llmsim
from llmsim.blocks import Block
from llmsim.catalog import folder
from llmsim.costs import HardwareCosts
from llmsim.errors import UserError
from llmsim.experts import busiest_rank_factor, expert_rows
from llmsim.memory import memory_per_stage
from llmsim.plan import Plan
from llmsim.specs import Model, Parallelism, Training
from llmsim.workload import build_workload

MOE = {"experts": 8, "top_k": 2, "ffn_hidden": 1024}


def catalog_model(name: str) -> Model:
    return Model.model_validate(yaml.safe_load(
        (folder("models") / f"{name}.yaml").read_text()))


# -- parameter counts against the published figures ---------------------------------


def test_mixtral_8x7b_has_46_7_b_parameters_12_9_b_active():
    """Jiang et al. 2024 §2.1: 46.7 B parameters, 12.9 B used per token."""
    m = catalog_model("mixtral-8x7b")
    assert m.params == pytest.approx(46.7e9, rel=2e-3)
    assert m.active_params_per_token == pytest.approx(12.9e9, rel=2e-3)


def test_mixtral_8x22b_has_141_b_parameters_39_b_active():
    m = catalog_model("mixtral-8x22b")
    assert m.params == pytest.approx(141e9, rel=5e-3)
    assert m.active_params_per_token == pytest.approx(39e9, rel=5e-3)


def test_deepseek_v3_has_671_b_parameters_37_b_active():
    """DeepSeek-V3 report: 671 B total, 37 B activated; the weights' README: 36.6 B
    activated counting the output head but not the embedding lookup."""
    m = catalog_model("deepseek-v3")
    assert m.params == pytest.approx(671e9, rel=1e-3)
    assert m.active_params_per_token == pytest.approx(37e9, rel=2e-2)
    assert m.active_params_per_token - m.vocab * m.hidden == pytest.approx(36.6e9, rel=1e-3)


def test_gpt4_moe_proxy_meets_the_rumoured_totals():
    """The rumour (SemiAnalysis 2023): ~1.8 T parameters, ~280 B used per token."""
    m = catalog_model("gpt4-proxy-moe")
    assert m.params == pytest.approx(1.8e12, rel=0.05)
    assert m.active_params_per_token == pytest.approx(280e9, rel=0.01)
    assert "UNCONFIRMED" in m.sources["rumour"]


def test_mla_params_closed_form():
    """DeepSeek-V3's MLA block: 7168·1536 + 1536 + 1536·128·192 + 7168·576 + 512
    + 512·128·256 + 128·128·7168 weights."""
    m = catalog_model("deepseek-v3")
    expected = (7168 * 1536 + 1536 + 1536 * 128 * 192 + 7168 * 576 + 512
                + 512 * 128 * 256 + 128 * 128 * 7168)
    assert m.mla_params == expected == 187_107_328


def test_moe_layer_pattern():
    m = catalog_model("deepseek-v3")
    assert [m.moe.is_moe_layer(i) for i in range(5)] == [False, False, False, True, True]
    assert m.moe_layer_count == 58
    every_other = m.moe.model_copy(update={"first_dense_layers": 0, "layer_freq": 2})
    assert every_other.moe_layers(6) == 3 and every_other.is_moe_layer(0)


# -- one expert is the dense model ----------------------------------------------------


@pytest.mark.parametrize("extra", [
    {},
    {"parallelism__sequence_parallel": True},
    {"parallelism__zero": 1, "nodes": 2},
    {"parallelism__recompute": "full", "training__precision": "fp8",
     "system": "eos"},
])
def test_one_expert_without_ep_is_the_dense_model(extra):
    """One expert of the dense width, top-1, ep = 1: the same parameters, FLOPs, memory
    and step time as the dense model, through the MoE code path."""
    dense = make_scenario(**extra)
    moe = make_scenario(model__moe={"experts": 1, "top_k": 1, "ffn_hidden": 2048}, **extra)
    assert moe.model.params == dense.model.params
    a, b = llmsim.simulate(dense), llmsim.simulate(moe)
    assert any(op.name == "expert_up" for c in b.workload.chunks.values() for op in c.ops)
    assert b.model_flops_per_step == pytest.approx(a.model_flops_per_step, rel=1e-12)
    assert b.step_time_s == pytest.approx(a.step_time_s, rel=1e-12)
    for x, y in zip(a.memory, b.memory, strict=True):
        assert y.total_bytes == pytest.approx(x.total_bytes, rel=1e-12)


# -- FLOPs per token -----------------------------------------------------------------------


def test_moe_flops_are_the_dense_flops_of_top_k_experts_plus_the_router():
    """Model FLOPs of a top-k MoE = those of a dense model whose MLP is k experts wide,
    plus the router's 6·h·E per token and MoE layer (forward, input and weight
    gradients), whatever ep does to the busiest rank."""
    wide = make_scenario(model__ffn_hidden=2 * 1024, parallelism__tp=1)
    for ep in (1, 2, 4):
        moe = make_scenario(model__moe=MOE, parallelism__tp=1, parallelism__pp=2,
                            parallelism__ep=ep)
        work = build_workload(moe.model, moe.parallelism, moe.training, moe.dp)
        dense = build_workload(wide.model, wide.parallelism, wide.training, wide.dp)
        tokens = moe.training.tokens_per_step
        router = 6 * moe.model.hidden * 8 * tokens * moe.model.layers
        assert work.model_flops() == pytest.approx(dense.model_flops() + router, rel=1e-12)


# -- routing arithmetic ------------------------------------------------------------------


def test_busiest_rank_factor_closed_form():
    assert busiest_rank_factor(1e6, 1) == 1.0
    rows, ep = 8 * 4096 * 2, 8
    expected = 1 + math.sqrt(2 * math.log(ep) * (1 - 1 / ep) / (rows / ep))
    assert busiest_rank_factor(rows, ep) == pytest.approx(expected, rel=1e-12)


@given(rows=st.floats(1e2, 1e8), ep=st.integers(2, 256))
@settings(max_examples=40)
def test_more_tokens_balance_the_load(rows, ep):
    assert 1.0 < busiest_rank_factor(2 * rows, ep) < busiest_rank_factor(rows, ep)


def test_capacity_factor_pads_every_expert_to_capacity():
    model = Model.model_validate({"name": "m", "layers": 2, "hidden": 512, "heads": 8,
                                  "ffn_hidden": 2048, "vocab": 1024,
                                  "moe": MOE | {"capacity_factor": 1.25}})
    par, trn = Parallelism(ep=4), Training(global_batch=16, seq_len=512)
    local, rows = expert_rows(model, par, trn)
    assert local == 2 and rows == math.ceil(1.25 * 4 * 512 * 2 / 8)


def test_dispatch_all_to_all_bytes_per_rank():
    """Each rank sends its T/t routed tokens' k copies, the busiest rank's excess
    included: T/t·k·λ·h·e bytes."""
    s = make_scenario(model__moe=MOE, parallelism__pp=1, parallelism__ep=2,
                      parallelism__sequence_parallel=True)
    work = build_workload(s.model, s.parallelism, s.training, s.dp)
    op = next(o for o in work.chunks[(0, 0)].forward if o.name == "moe_dispatch")
    T, k, h = 512, 2, 512
    lam = busiest_rank_factor(2 * T * k, 2)
    assert (op.collective, op.axis) == ("all_to_all", "ep")
    assert op.bytes == pytest.approx(T / 2 * k * lam * h * 2, rel=1e-12)
    names = [o.name for o in work.chunks[(0, 0)].ops]
    assert names.count("moe_dispatch") == names.count("moe_combine") == s.model.layers
    assert names.count("moe_dispatch_bwd") == s.model.layers


# -- gradient and ZeRO groups --------------------------------------------------------------


def test_expert_gradients_reduce_over_their_own_group():
    s = make_scenario(model__moe=MOE, nodes=2, parallelism__pp=1, parallelism__ep=2,
                      parallelism__sequence_parallel=True)
    work = build_workload(s.model, s.parallelism, s.training, s.dp)
    chunk = work.chunks[(0, 0)]
    ops = work.dp_grad_ops(chunk)
    by_axis = {a: sum(o.bytes for o in ops if o.axis == a) for a in ("cp+ep+dp", "cp+dp")}
    g = work.grad_bytes_per_param
    assert by_axis["cp+dp"] == pytest.approx(chunk.expert_params * g, rel=1e-12)
    assert by_axis["cp+ep+dp"] == pytest.approx((chunk.params - chunk.expert_params) * g,
                                                rel=1e-12)
    # 4 routed experts of 8 on each rank, each 2·h·f/tp weights, the up projection's
    # f/tp biases and the down projection's h (the tiny GPT has biases).
    assert chunk.expert_params == s.model.layers * 4 * (2 * 512 * 1024 // 2 + 1024 // 2 + 512)


def test_zero_1_shards_dense_and_expert_state_over_their_groups():
    s = make_scenario(model__moe=MOE, nodes=2, parallelism__pp=1, parallelism__ep=2,
                      parallelism__sequence_parallel=True, parallelism__zero=1)
    dp, ep = s.dp, 2
    (mem,) = memory_per_stage(s.model, s.parallelism, s.training, dp,
                              s.system.node.accelerator)
    dense = mem.params - mem.expert_params
    assert mem.optimizer_bytes == pytest.approx(12 * (dense / (dp * ep) + mem.expert_params / dp),
                                                rel=1e-12)
    assert mem.expert_state_bytes == pytest.approx(mem.expert_params * (4 + 12 / dp), rel=1e-12)


# -- memory property ----------------------------------------------------------------------


@given(experts=st.sampled_from([2, 4, 8, 16, 32]), more=st.sampled_from([2, 4]),
       top_k=st.integers(1, 2), zero=st.integers(0, 2), ep=st.sampled_from([1, 2]))
@settings(max_examples=30, deadline=None)
def test_more_experts_at_fixed_active_parameters_never_lower_memory(experts, more, top_k,
                                                                      zero, ep):
    def peak(e: int) -> float:
        model = Model.model_validate({"name": "m", "layers": 4, "hidden": 512, "heads": 8,
                                      "ffn_hidden": 2048, "vocab": 1024, "moe": {
                                          "experts": e, "top_k": top_k, "ffn_hidden": 1024}})
        par = Parallelism(ep=ep, zero=zero)
        stages = memory_per_stage(model, par, Training(global_batch=16, seq_len=512), 2,
                                  make_scenario().system.node.accelerator)
        return max(m.total_bytes for m in stages)

    assert peak(experts * more) >= peak(experts)


# -- the whole step ---------------------------------------------------------------------


def test_all_to_all_is_its_own_part_of_the_breakdown():
    s = make_scenario(model__moe=MOE, nodes=2, parallelism__pp=2, parallelism__ep=4,
                      parallelism__sequence_parallel=True)
    result = llmsim.simulate(s)
    parts = result.breakdown_s
    assert parts["ep_all_to_all"] > 0
    assert sum(parts.values()) == pytest.approx(result.step_time_s, rel=1e-9)
    assert "moe_dispatch" in set(result.to_dataframe()["name"])


def test_the_timeline_draws_every_all_to_all():
    """Each device's row holds its 4 all-to-alls (dispatch and combine, forward and
    backward) per MoE layer and micro-batch in the MoE colour; none with ep = 1."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.colors as mc

    from llmsim.plots import COLOURS

    base = {"model__moe": MOE, "nodes": 2, "parallelism__pp": 2,
            "parallelism__sequence_parallel": True}
    for ep in (4, 1):
        s = make_scenario(**base, parallelism__ep=ep)
        result = llmsim.simulate(s)
        ax = result.plot_timeline().axes[0]
        ep_bars = [len(c.get_paths()) for c in ax.collections
                   if mc.to_hex(c.get_facecolor()[0]) == COLOURS["ep"]]
        drawn = len({r.device for r in result.trace.records})
        layers_per_stage = s.model.layers // s.parallelism.pp
        want = [4 * layers_per_stage * s.micro_batches] * drawn if ep > 1 else []
        assert ep_bars == want


@pytest.mark.parametrize("name, ep", [("mixtral-8x7b", 8), ("deepseek-v3", 64)])
def test_model_flops_per_token_follow_the_active_parameters(name, ep):
    """6 FLOPs per active matrix weight and token — not the embedding lookup, the RMSNorm
    scales (2 per layer, the final one, MLA's two latent norms) or the sigmoid router's
    selection biases — plus the attention core's 6·L·s·heads·(d_qk + d_v) (forward
    2·s·heads·(d_qk + d_v) per token, backward twice that): Mixtral's d_qk = d_v = 128,
    DeepSeek-V3's MLA 192 and 128. DeepSeek-V3's multi-token prediction module adds one
    more MoE block, its 2h × h projection and a second pass through the LM head."""
    m = catalog_model(name)
    seq = 4096
    work = build_workload(m, Parallelism(ep=ep), Training(global_batch=ep, seq_len=seq), 1)
    per_token = work.model_flops() / (ep * seq)
    if m.mla is None:
        d_qk = d_v = m.head_dim
    else:
        d_qk, d_v = m.mla.qk_nope_head_dim + m.mla.qk_rope_head_dim, m.mla.v_head_dim
    attention = 6 * (m.layers + m.mtp_depth) * seq * m.heads * (d_qk + d_v)
    norms = (2 * m.layers + 1) * m.hidden
    block_norms = 2 * m.hidden
    if m.mla is not None:
        norms += m.layers * (m.mla.q_lora_rank + m.mla.kv_lora_rank)
        block_norms += m.mla.q_lora_rank + m.mla.kv_lora_rank
    biases = m.moe_layer_count * m.moe.experts if m.moe.router == "sigmoid" else 0
    weights = 6 * (m.active_params_per_token - m.vocab * m.hidden - norms - biases)
    idle = (m.moe.experts - m.moe.top_k) * m.expert_params
    bias = m.moe.experts if m.moe.router == "sigmoid" else 0
    mtp_block = m.params_per_moe_layer - idle - block_norms - bias
    weights += 6 * m.mtp_depth * (mtp_block + 2 * m.hidden ** 2 + m.vocab * m.hidden)
    assert per_token == pytest.approx(weights + attention, rel=1e-9)


@given(ep=st.sampled_from([1, 2, 4]), pp=st.sampled_from([1, 2]),
       experts=st.sampled_from([4, 8]), top_k=st.integers(1, 2),
       shared=st.integers(0, 1), freq=st.integers(1, 2),
       capacity=st.sampled_from([None, 1.25]), zero=st.integers(0, 2))
@settings(max_examples=12, deadline=None)
def test_any_moe_layout_splits_its_step_into_parts(ep, pp, experts, top_k, shared, freq,
                                                     capacity, zero):
    """The breakdown sums to the step; all-to-all time appears exactly when ep > 1."""
    moe = {"experts": experts, "top_k": top_k, "ffn_hidden": 512, "shared_experts": shared,
           "layer_freq": freq, "capacity_factor": capacity}
    s = make_scenario(nodes=2, model__moe=moe, parallelism__pp=pp, parallelism__ep=ep,
                      parallelism__sequence_parallel=True, parallelism__zero=zero)
    result = llmsim.simulate(s)
    parts = result.breakdown_s
    assert sum(parts.values()) == pytest.approx(result.step_time_s, rel=1e-9)
    assert (parts["ep_all_to_all"] > 0) == (ep > 1)
    assert all(m.expert_params > 0 for m in result.memory)


def test_shared_expert_overlap_hides_the_all_to_alls_behind_its_gemms():
    """Megatron-Core --moe-shared-expert-overlap: the dispatch beside the shared expert's
    first projection, the combine beside its second; each costs max(c, g) − g."""
    moe = MOE | {"shared_experts": 1}
    base = {"nodes": 2, "model__moe": moe, "parallelism__pp": 1, "parallelism__ep": 8,
            "parallelism__sequence_parallel": True}
    plain = make_scenario(**base)
    hidden = make_scenario(**base, parallelism__moe_shared_expert_overlap=True)
    work = build_workload(hidden.model, hidden.parallelism, hidden.training, hidden.dp)
    names = [op.name for op in work.chunks[(0, 0)].forward]
    i = names.index("moe_dispatch")
    assert names[i + 1] == "shared_up" and names[names.index("moe_combine") + 1] == "shared_down"
    costs = HardwareCosts.from_scenario(hidden, Plan.from_scenario(hidden))
    ops = work.chunks[(0, 0)].forward
    c, g = costs.comm_s(ops[i]), costs.compute_s(ops[i + 1])
    block = Block.of(ops[:i + 2], costs)
    assert block.spans[i].duration_s == pytest.approx(max(c, g) - g, rel=1e-12)
    a, b = llmsim.simulate(plain), llmsim.simulate(hidden)
    assert b.breakdown_s["ep_all_to_all"] < a.breakdown_s["ep_all_to_all"]
    assert b.step_time_s < a.step_time_s
    assert b.model_flops_per_step == a.model_flops_per_step


def test_shared_expert_overlap_needs_shared_experts():
    with pytest.raises(UserError,
                       match=r"moe_shared_expert_overlap: true needs a MoE model with shared"):
        make_scenario(model__moe=MOE, parallelism__pp=1, parallelism__ep=2,
                      parallelism__sequence_parallel=True,
                      parallelism__moe_shared_expert_overlap=True)
