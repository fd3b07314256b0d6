"""Context parallelism (llmsim.context): ring attention's exposed time, the split of the
sequence, its memory and its gradient group."""

from __future__ import annotations

import pytest
from helpers import load_script, make_scenario
from hypothesis import given, settings
from hypothesis import strategies as st

import llmsim
from llmsim.context import RingBlock, ring_blocks, ring_exposed_s
from llmsim.errors import UserError
from llmsim.memory import memory_per_stage
from llmsim.plan import Plan
from llmsim.workload import build_workload


def test_ring_exposed_closed_form():
    """g/cp + (cp − 1)·max(g/cp, c) − g: hidden while a step's transfer is shorter than
    its block of attention, (cp − 1)·(c − g/cp) beyond."""
    assert ring_exposed_s(1.0, 8.0, 4) == 0.0
    assert ring_exposed_s(3.0, 8.0, 4) == pytest.approx(3 * (3.0 - 2.0))
    assert ring_exposed_s(5.0, 8.0, 1) == 0.0


@given(c=st.floats(0, 10), g=st.floats(0, 10), steps=st.integers(1, 64))
@settings(max_examples=60)
def test_ring_exposed_is_between_nothing_and_the_whole_transfer(c, g, steps):
    exposed = ring_exposed_s(c, g, steps)
    assert -1e-12 <= exposed <= (steps - 1) * c + 1e-12


def workload(cp: int, **extra):
    s = make_scenario(nodes=2, parallelism__cp=cp, parallelism__pp=2,
                      training__seq_len=4096, **extra)
    return s, build_workload(s.model, s.parallelism, s.training, s.dp)


def test_each_rank_holds_one_cp_th_of_the_sequence():
    _, one = workload(1)
    _, four = workload(4)
    ops1 = {op.name: op for op in one.chunks[(0, 0)].forward}
    ops4 = {op.name: op for op in four.chunks[(0, 0)].forward}
    assert ops4["qkv"].mnk[0] == ops1["qkv"].mnk[0] // 4 == 1024
    assert ops4["attn"].flops == pytest.approx(ops1["attn"].flops / 4, rel=1e-12)
    assert ops4["attn"].attention_shape == (1024, 64)
    ring = ops4["cp_kv_ring"]
    # K and V of 1024 tokens, 8 heads / tp 2 of 64, in bf16.
    assert (ring.axis, ring.ring_steps, ring.bytes) == ("cp", 4, 2 * 1024 * 2 * 4 * 64)
    bwd = next(op for op in four.chunks[(0, 0)].backward if op.name == "cp_kv_ring_bwd")
    assert bwd.bytes == 2 * ring.bytes
    assert four.pp_message_bytes == one.pp_message_bytes / 4
    assert "cp_kv_ring" not in ops1


@pytest.mark.parametrize("cp", [2, 4])
def test_model_flops_per_step_do_not_depend_on_cp(cp):
    _, one = workload(1)
    _, split = workload(cp)
    assert split.model_flops() == pytest.approx(one.model_flops(), rel=1e-12)


def test_activations_divide_by_cp():
    s1 = make_scenario(parallelism__pp=1, parallelism__tp=1, training__seq_len=4096)
    s4 = make_scenario(parallelism__pp=1, parallelism__tp=1, parallelism__cp=4,
                       training__seq_len=4096)
    accel = s1.system.node.accelerator
    (one,) = memory_per_stage(s1.model, s1.parallelism, s1.training, 2, accel)
    (four,) = memory_per_stage(s4.model, s4.parallelism, s4.training, 2, accel)
    assert four.activations_bytes == pytest.approx(one.activations_bytes / 4, rel=1e-12)


def test_the_gradient_group_grows_by_cp():
    s, work = workload(2)
    (axis, ranks), _ = work.grad_groups
    assert (axis, ranks) == ("cp+ep+dp", 2 * s.dp)
    assert {op.axis for op in work.dp_grad_ops(work.chunks[(0, 0)])} == {"cp+ep+dp"}
    assert Plan.from_scenario(s).placement("cp+ep+dp").size == 2 * s.dp


def test_the_ring_is_its_own_part_of_the_breakdown():
    s, _ = workload(4)
    result = llmsim.simulate(s)
    assert sum(result.breakdown_s.values()) == pytest.approx(result.step_time_s, rel=1e-9)
    assert result.breakdown_s["cp_comm"] >= 0.0
    assert {"cp_kv_ring", "cp_kv_ring_bwd"} <= set(result.to_dataframe()["name"])


def test_cp_needs_a_fused_attention_kernel():
    with pytest.raises(UserError, match=r"parallelism\.cp: 2 needs a fused attention kernel"):
        make_scenario(parallelism__pp=2, parallelism__cp=2,
                      training__attention_kernel="unfused")


@pytest.mark.parametrize("extra", [{"parallelism__zero": 3},
                                   {"parallelism__zero": 1,
                                    "parallelism__overlap_param_gather": True}])
def test_weight_gathers_span_the_cp_dp_group(extra):
    """ZeRO-3's, and the overlapped ZeRO-1 parameter gather's, per-layer all-gathers run
    over the cp·dp ranks that shard the weights (Megatron-Core's data-parallel group
    with context parallelism), each the chunk's weights over its layers."""
    s, work = workload(2, **extra)
    chunk = work.chunks[(0, 0)]
    gathers = work.weight_gathers(chunk)
    assert len(gathers) == chunk.units
    assert {op.axis for op in gathers} == {"cp+ep+dp"}
    assert work.gather_group == ("cp+ep+dp", 2 * s.dp)
    assert gathers[0].bytes == pytest.approx(
        chunk.params * work.param_bytes_per_param / chunk.units / work.gather_messages,
        rel=1e-12)
    assert work.gathers_before("F", 0)
    result = llmsim.simulate(s)
    assert sum(result.breakdown_s.values()) == pytest.approx(result.step_time_s, rel=1e-9)


def test_weight_gathers_without_cp_are_over_dp():
    s, work = workload(1, parallelism__zero=3)
    assert work.gather_group == ("dp", s.dp)
    assert {op.axis for op in work.weight_gathers(work.chunks[(0, 0)])} == {"dp"}


# -- a ring that attention does not hide ---------------------------------------------------


def exposed_scenario(seq_len: int):
    """Llama 3 8B with tp 8 filling each DGX A100 and cp 4 across four nodes (Megatron's
    rank order tp, cp: the ring's neighbours are on different nodes, one InfiniBand NIC
    each): a rank holds 4 of the 32 heads and one of the 8 key/value heads."""
    return make_scenario(nodes=4, model="llama3-8b", parallelism__tp=8, parallelism__pp=1,
                         parallelism__cp=4, parallelism__sequence_parallel=True,
                         training__seq_len=seq_len, training__global_batch=8,
                         training__precision="bf16")


def ring_and_attention(scenario):
    """(ring op, attention op, the forward ops, the cost model) of one block's forward."""
    from llmsim.costs import HardwareCosts

    work = build_workload(scenario.model, scenario.parallelism, scenario.training,
                          scenario.dp)
    ops = work.chunks[(0, 0)].forward
    i = next(k for k, op in enumerate(ops) if op.name == "cp_kv_ring")
    costs = HardwareCosts.from_scenario(scenario, Plan.from_scenario(scenario))
    return ops[i], ops[i + 1], ops, costs


@pytest.mark.parametrize("seq_len, exposed", [(4096, True), (32768, False)])
def test_a_cross_node_ring_is_exposed_at_short_blocks_and_hidden_at_long_ones(seq_len, exposed):
    """Each ring step sends the rank's K and V block, e·(s/cp)·2·d bytes (one key/value
    head of d = 128 on this TP rank), over the network to the next node: α + bytes/β.
    Attention per step grows with (s/cp)², the block with s/cp: at 4,096 tokens (1,024 a
    rank) the transfer outlasts a step's attention and the block shows
    (cp − 1)·(c − g/cp) of it; at 32,768 it hides. The block's span is that closed form."""
    from llmsim.blocks import Block
    from llmsim.costs.collectives import group_path

    s = exposed_scenario(seq_len)
    ring, attention, ops, costs = ring_and_attention(s)
    plan = Plan.from_scenario(s)
    assert plan.placement("cp").nodes_spanned == 4
    assert ring.bytes == 2 * (seq_len // 4) * 2 * 128  # bf16, K and V, one head
    path = group_path(s.system, plan.placement("cp"), plan)
    launch = s.system.node.accelerator.kernel_launch_us * 1e-6
    c = path.inter_latency_s + ring.bytes / path.sender_inter_bytes_per_s + launch
    assert costs.comm_s(ring) == pytest.approx(c, rel=1e-12)
    g = costs.compute_s(attention)
    block = Block.of(ops, costs)
    span = block.spans[ops.index(ring)].duration_s
    assert span == pytest.approx(max(0.0, 3 * (c - g / 4)), rel=1e-9, abs=1e-15)
    assert (span > 0) == exposed
    cp_s = llmsim.simulate(s).breakdown_s["cp_comm"]
    assert (cp_s > 0) == exposed


def _nemo_llama2_flops(gbs: int, s: int, layers: int, h: int, heads: int, groups: int,
                       ffn: int, vocab: int) -> float:
    """NeMo's FLOPsMeasurementCallback._llama2 (nemo/collections/common/metrics/
    perf_metrics.py at NVIDIA/NeMo 0aa2671, the long-sequence page's commit): the full
    s × s attention, forward and backward (its ``12·s/h`` term)."""
    return gbs * s * layers * h * h * (12 + 12 * groups / heads + 18 * ffn / h + 12 * s / h
                                       + 6 * vocab / (layers * h))


def test_nemo_long_sequence_rows_count_flops_as_nemo_did() -> None:
    """The NEMOLS rows' convention (choices.yaml): llmsim's model FLOPs are NeMo's
    callback formula of the page's time, and the 24.03.01 launcher's GPT-3 formula
    (compare_throughput.calculate_tflops, = narayanan72) is within 0.5 % of both; the
    causal half NeMo counted from 2025 would be 12-49 % less on these rows."""
    from llmsim.validation.predictions import narayanan_flops
    from llmsim.validation.runs import load_runs
    from llmsim.validation.scenarios import scenario_for

    runs = load_runs("NEMOLS")
    assert len(runs) == 8
    for run in runs:
        scenario = scenario_for(run)
        m, row = scenario.model, run.row
        gbs, s = int(row["global_batch"]), int(row["seq_len"])
        assert run.value("flops_convention") == "model"
        nemo = _nemo_llama2_flops(gbs, s, m.layers, m.hidden, m.heads, m.n_kv_heads,
                                  m.ffn_hidden, int(row["vocab"]))
        got = llmsim.simulate(scenario).model_flops_per_step
        assert got == pytest.approx(nemo, rel=1e-3)
        launcher = narayanan_flops(gbs, s, m.layers, m.hidden, int(row["vocab"]), False)
        assert launcher == pytest.approx(nemo, rel=5e-3)
        causal = nemo - 6 * gbs * s * s * m.hidden * m.layers
        assert 0.5 < causal / nemo < 0.88


@given(cp=st.integers(1, 32), chunk=st.integers(1, 64), data=st.data())
@settings(max_examples=60)
def test_every_ring_rank_computes_the_causal_half_over_cp(cp, chunk, data):
    """The load-balanced ring's kernels on any rank: one causal diagonal and cp − 1 full
    rectangles, s²/(2·cp) query-key pairs in all, the area the single s/cp kernel llmsim
    prices executes (half of (s/cp)² · cp)."""
    seq = 2 * cp * chunk
    rank = data.draw(st.integers(0, cp - 1))
    blocks = ring_blocks(seq, cp, rank)
    assert len(blocks) == cp
    assert [b.causal for b in blocks] == [True] + [False] * (cp - 1)
    assert sum(b.executed_area for b in blocks) == pytest.approx(seq * seq / (2 * cp))
    assert sum(b.q_tokens for b in blocks[1:]) + sum(b.kv_tokens for b in blocks[1:]) == \
        3 * chunk * (cp - 1)


def test_ring_blocks_of_a_four_rank_ring():
    """Rank 1 of 4 (chunks 1 and 6 of 8): its own two chunks causal, the block of rank 0
    against both its queries, those of ranks 2 and 3 against its second chunk only."""
    c = 1024
    assert ring_blocks(8 * c, 4, 1) == [RingBlock(2 * c, 2 * c, True), RingBlock(2 * c, c, False),
                                        RingBlock(c, 2 * c, False), RingBlock(c, 2 * c, False)]


def test_a_rings_measured_rate_weights_its_blocks_by_their_flops():
    """benchmarks/nemols_attention_rate.py: a cp-2 ring of 8,192 tokens (c = 2,048) runs,
    on each rank, a causal 4,096² diagonal (area 4,096²/2) and one full 4,096 × 2,048 or
    2,048 × 4,096 rectangle (the same area): the harmonic mean of the rates, by FLOPs."""
    script = load_script("benchmarks/nemols_attention_rate.py")
    rates = {("cudnn", True, 8, 4096, 4096): 400.0, ("cudnn", False, 8, 4096, 2048): 600.0,
             ("cudnn", False, 8, 2048, 4096): 600.0, ("cudnn", True, 4, 4096, 4096): 100.0}
    tflops, substituted = script.ring_rate(rates, "cudnn", 8, 8192, 2)
    assert tflops == pytest.approx(2 / (1 / 400 + 1 / 600)) and not substituted
    # 4 heads a device: the diagonal measured at 4, the rectangles only at 8.
    tflops, substituted = script.ring_rate(rates, "cudnn", 4, 8192, 2)
    assert tflops == pytest.approx(2 / (1 / 100 + 1 / 600)) and substituted
