"""DeepSeek-V3 as it ran: multi-token prediction (llmsim.mtp), DeepEP-style dispatch and
node-limited routing (llmsim.costs.alltoall), the H800 cluster and its scenario."""

from __future__ import annotations

import math

import pytest
import yaml
from helpers import make_scenario
from hypothesis import given, settings
from hypothesis import strategies as st

import llmsim
from llmsim.catalog import folder
from llmsim.costs import HardwareCosts
from llmsim.costs.alltoall import TokenDispatch, all_to_all_s, remote_nodes_per_token
from llmsim.costs.collectives import GroupPath
from llmsim.memory import memory_per_stage
from llmsim.ops import CommOp
from llmsim.params import (
    embedding_params_per_device,
    expert_params_per_device,
    layer_params_per_device,
)
from llmsim.plan import Plan
from llmsim.specs import Model
from llmsim.workload import build_workload

DSV3 = Model.model_validate(yaml.safe_load((folder("models") / "deepseek-v3.yaml").read_text()))


# -- multi-token prediction ---------------------------------------------------------


def test_deepseek_v3_mtp_module_matches_its_weights_file():
    """README_WEIGHTS.md: the MTP module has 11.5 B unique parameters besides the shared
    embedding and head; llmsim's block (a MoE layer, model.layers.61) is 11.507 B, and
    the module adds its 2h × h projection and three RMSNorms."""
    h = DSV3.hidden
    assert DSV3.mtp_depth == 1 and DSV3.mtp_is_moe(0)
    assert DSV3.params_per_moe_layer == pytest.approx(11.5e9, rel=1e-3)
    assert DSV3.mtp_params == DSV3.params_per_moe_layer + 2 * h * h + 3 * h
    assert DSV3.params == pytest.approx(671e9, rel=1e-3)  # the main model's count only


def test_mtp_adds_one_block_a_projection_and_a_head_to_the_model_flops():
    """Per token, one more dense block (6 FLOPs per matrix weight: 4h² + 2hf, and the
    attention core's 12·s·h), the 2h × h projection and the LM head (V·h)."""
    base = make_scenario()
    mtp = make_scenario(model__mtp_depth=1)
    h, f, v = base.model.hidden, base.model.ffn_hidden, base.model.vocab
    s = base.training.seq_len
    tokens = base.training.global_batch * s
    extra = (llmsim.simulate(mtp).model_flops_per_step
             - llmsim.simulate(base).model_flops_per_step) / tokens
    assert extra == pytest.approx(6 * (4 * h * h + 2 * h * f + 2 * h * h + v * h) + 12 * s * h,
                                  rel=1e-9)


def test_mtp_ops_follow_the_head_on_the_last_chunk_only():
    scenario = make_scenario(model__mtp_depth=2)
    work = build_workload(scenario.model, scenario.parallelism, scenario.training, scenario.dp)
    for (stage, _), chunk in work.chunks.items():
        names = [op.name for op in chunk.forward]
        mtp = [n for n in names if n.startswith("mtp")]
        if not chunk.last:
            assert not mtp, stage
            continue
        assert names.index("lm_head") < names.index("mtp1_eh_proj") < names.index("mtp2_eh_proj")
        assert names.count("mtp1_lm_head") == names.count("mtp2_lm_head") == 1
        backward = [op.name for op in chunk.backward]
        assert backward.index("mtp2_lm_head_dx") < backward.index("mtp1_eh_proj_dx") \
            < backward.index("lm_head_dx")


def test_mtp_weights_sit_on_the_last_stage_with_an_embedding_copy():
    """tp 2, pp 4: the last stage gains one block, the projection's 2h·h/t, three
    LayerNorms (2h each, replicated) and — the embedding being on stage 0 — a copy of
    the vocabulary-parallel embedding and the learned positions; the other stages
    nothing. The copies' gradients are summed once a step over the pipeline."""
    base, mtp = make_scenario(), make_scenario(model__mtp_depth=1)
    m, t = base.model, base.parallelism.tp
    acc = base.system.node.accelerator

    def params(s):
        return [st.params for st in memory_per_stage(s.model, s.parallelism, s.training,
                                                     s.dp, acc)]

    before, after = params(base), params(mtp)
    assert after[:-1] == before[:-1]
    assert after[-1] - before[-1] == (layer_params_per_device(m, t) + 2 * m.hidden ** 2 // t
                                      + 6 * m.hidden + embedding_params_per_device(m, t))
    work = llmsim.simulate(mtp).workload
    assert work.embedding_grad_allreduce is not None
    assert llmsim.simulate(base).workload.embedding_grad_allreduce is None


def test_a_tied_head_is_the_mtp_modules_embedding_copy():
    """With tied embeddings the last stage holds the word embedding already (as its head):
    MTP adds no second copy."""
    base = make_scenario(model__tied_embeddings=True)
    mtp = make_scenario(model__tied_embeddings=True, model__mtp_depth=1)
    m, acc = base.model, base.system.node.accelerator
    last = [memory_per_stage(s.model, s.parallelism, s.training, s.dp, acc)[-1].params
            for s in (base, mtp)]
    assert last[1] - last[0] == layer_params_per_device(m, 2) + 2 * m.hidden ** 2 // 2 \
        + 6 * m.hidden


def test_mtp_without_a_pipeline_shares_the_one_embedding():
    base = make_scenario(parallelism__pp=1, parallelism__tp=8)
    mtp = make_scenario(parallelism__pp=1, parallelism__tp=8, model__mtp_depth=1)
    m = base.model
    acc = base.system.node.accelerator
    [a] = memory_per_stage(base.model, base.parallelism, base.training, base.dp, acc)
    [b] = memory_per_stage(mtp.model, mtp.parallelism, mtp.training, mtp.dp, acc)
    assert b.params - a.params == layer_params_per_device(m, 8) + 2 * m.hidden ** 2 // 8 \
        + 6 * m.hidden
    assert b.activations_bytes > a.activations_bytes


def test_a_moe_mtp_block_holds_routed_experts():
    moe = {"experts": 8, "top_k": 2, "ffn_hidden": 1024}
    layout = {"model__moe": moe, "parallelism__ep": 2, "parallelism__pp": 2,
              "parallelism__sequence_parallel": True}
    a, b = make_scenario(**layout), make_scenario(**layout, model__mtp_depth=1)
    work_a, work_b = (llmsim.simulate(s).workload for s in (a, b))
    last_a = next(c for c in work_a.chunks.values() if c.last)
    last_b = next(c for c in work_b.chunks.values() if c.last)
    expert = expert_params_per_device(b.model, 2)  # tp 2 splits each expert
    assert last_b.expert_params - last_a.expert_params == 8 // 2 * expert
    assert any(op.name == "mtp1_moe_dispatch" for op in last_b.forward)


def test_import_hf_reads_the_mtp_depth():
    """DeepSeek-V3's config.json: num_nextn_predict_layers 1 is the catalog's mtp_depth."""
    from pathlib import Path

    from llmsim.hf_config import model_fields

    fields = model_fields(Path(__file__).parent / "data" / "hf" / "deepseek-v3.json")
    assert fields["mtp_depth"] == DSV3.mtp_depth == 1


# -- DeepEP-style dispatch and node-limited routing --------------------------------


def test_remote_nodes_per_token_closed_forms():
    """DeepSeek-V3: top 8 over 8 nodes limited to 4: 4·(1 − (3/4)^8)·7/8 = 3.15 copies
    leave the node, against 4.59 without the limit and 7 routed rows without forwarding."""
    assert remote_nodes_per_token(8, 8, 4) == pytest.approx(4 * (1 - 0.75 ** 8) * 7 / 8)
    assert remote_nodes_per_token(8, 8, 4) == pytest.approx(3.150, abs=1e-3)
    assert remote_nodes_per_token(8, 8) == pytest.approx(8 * (1 - (7 / 8) ** 8) * 7 / 8)
    assert remote_nodes_per_token(8, 1, 4) == 0.0
    assert remote_nodes_per_token(1, 8) == pytest.approx(7 / 8)  # one expert: one row


@given(top_k=st.integers(1, 16), nodes=st.integers(1, 64), limit=st.integers(1, 64))
@settings(max_examples=60, deadline=None)
def test_forwarding_never_sends_more_than_the_routed_rows(top_k, nodes, limit):
    """At most one copy per routed row leaves the node, and a looser node limit never
    lowers the copies."""
    d = remote_nodes_per_token(top_k, nodes, limit)
    assert 0.0 <= d <= top_k * (nodes - 1) / nodes + 1e-12
    assert d <= remote_nodes_per_token(top_k, nodes, limit + 1) + 1e-12


PATH = GroupPath(ranks=64, nodes=8, per_node=8, intra_bytes_per_s=160e9,
                 intra_latency_s=2e-6, inter_bytes_per_s=8 * 50e9, inter_latency_s=10e-6)
S = 64e6


def test_forwarded_all_to_all_closed_form():
    """The network part carries D copies of each token instead of its 8·56/64 rows that
    leave the node; the fabric part forwards S·7/8 (every row not already on its GPU)."""
    dispatch = TokenDispatch(top_k=8, max_nodes=4)
    d = remote_nodes_per_token(8, 8, 4)
    network = 10e-6 + 8 * S * 56 / 64 * d / (8 * 56 / 64) / 400e9
    fabric = 2e-6 + S * 7 / 8 / 160e9
    assert all_to_all_s(S, PATH, dispatch=dispatch) == pytest.approx(max(network, fabric))
    plain = all_to_all_s(S, PATH)
    assert plain == pytest.approx(max(10e-6 + 8 * S * 56 / 64 / 400e9, 2e-6 + S * 7 / 64 / 160e9))
    assert all_to_all_s(S, PATH, dispatch=dispatch) < plain


def test_deepseek_v3_dispatch_is_cheaper_forwarded():
    """On the H800 cluster (EP 64 over 8 nodes) forwarding cuts the all-to-all; the node
    limit cuts it further."""
    base = llmsim.load_scenario("deepseek-v3")

    def price(**par) -> float:
        s = base.model_copy(update={"parallelism": base.parallelism.model_copy(update=par)})
        costs = HardwareCosts.from_scenario(s, Plan.from_scenario(s))
        return costs.comm_s(CommOp("moe_dispatch", "all_to_all", "ep", "F", S))

    plain = price(moe_dispatcher="alltoall", moe_max_nodes=None)
    unlimited = price(moe_dispatcher="deepep", moe_max_nodes=None)
    limited = price(moe_dispatcher="deepep", moe_max_nodes=4)
    assert limited < unlimited < plain


def test_deepseek_v3_scenario_runs_with_its_layout():
    result = llmsim.simulate(llmsim.load_scenario("deepseek-v3"))
    s = result.scenario
    assert (s.parallelism.tp, s.parallelism.pp, s.parallelism.ep, s.dp) == (1, 16, 64, 2)
    assert s.devices == 2048 and s.micro_batches == 120
    assert s.system.node.accelerator.name == "h800-sxm5-80gb"
    assert math.isfinite(result.step_time_s) and result.step_time_s > 0
    assert result.breakdown_s["ep_all_to_all"] > 0
