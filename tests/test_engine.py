"""Engine: pipeline bubbles against closed forms, invariants of the trace, fidelity modes."""

from __future__ import annotations

import itertools
import json
import math
from collections import Counter

import pytest
from helpers import LayerOnlyCosts, make_scenario

from llmsim import simulate
from llmsim.costs.collectives import posted_p2p_units
from llmsim.errors import UserError
from llmsim.params import layer_params_per_device
from llmsim.simulation import build_engine
from llmsim.workload import build_workload


def _pipeline(schedule: str, p: int, m: int, v: int = 1, **extra):
    layers = 2 * p * v
    return make_scenario(nodes=p, model__layers=layers, parallelism__tp=8, parallelism__pp=p,
                         parallelism__schedule=schedule, parallelism__virtual_stages=v,
                         training__global_batch=m, **extra)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p", [2, 4, 8])
@pytest.mark.parametrize("m", [1, 4, 8, 13])
def test_bubble_matches_closed_form(schedule, p, m):
    result = simulate(_pipeline(schedule, p, m), costs=LayerOnlyCosts())
    expected = (p - 1) / (m + p - 1)
    for fraction in result.bubble_fraction_per_stage:
        assert fraction == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("p", [2, 4])
@pytest.mark.parametrize("m", [4, 8])
@pytest.mark.parametrize("v", [2, 3])
def test_interleaved_bubble_matches_closed_form(p, m, v):
    result = simulate(_pipeline("interleaved-1f1b", p, m, v), costs=LayerOnlyCosts())
    expected = (p - 1) / (v * m + p - 1)
    for fraction in result.bubble_fraction_per_stage:
        assert fraction == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("p, m", [(4, 8), (8, 8), (8, 24)])
def test_zero_bubble_h1_is_smaller_than_1f1b(p, m):
    one = simulate(_pipeline("1f1b", p, m), costs=LayerOnlyCosts())
    zb = simulate(_pipeline("zb-h1", p, m), costs=LayerOnlyCosts())
    assert zb.bubble_fraction < one.bubble_fraction
    assert zb.step_time_s < one.step_time_s


@pytest.mark.parametrize("schedule, v", [("gpipe", 1), ("1f1b", 1), ("interleaved-1f1b", 2),
                                         ("zb-h1", 1)])
def test_every_microbatch_gets_one_f_and_one_b_per_stage(schedule, v):
    result = simulate(_pipeline(schedule, 4, 8, v), costs=LayerOnlyCosts())
    passes = Counter((r.stage, r.kind, r.microbatch, r.chunk) for r in result.trace.records
                     if r.stream == "compute" and r.kind in "FBW")
    assert set(passes.values()) == {1}
    assert len(passes) == 3 * 4 * 8 * v


@pytest.mark.parametrize(("mode", "bytes_per_param", "accumulating"), [
    ("fused", 0, lambda m: 0),
    ("autograd", 6, lambda m: m - 1),     # the first micro-batch's gradient is param.grad
    ("fp32_cast_add", 18, lambda m: m),
])
@pytest.mark.parametrize("m", [1, 3])
def test_gradient_accumulation_adds_one_pass_per_accumulating_microbatch(
        mode, bytes_per_param, accumulating, m):
    # One stage, no data parallelism: the step is m passes, plus one pass over the
    # layers' parameters for each micro-batch whose gradients are added to the buffer.
    def step(grad_accumulation):
        s = _pipeline("1f1b", 1, m, training__precision="fp16",
                      training__grad_accumulation=grad_accumulation)
        return s, simulate(s, costs=LayerOnlyCosts(bytes_per_s=1e12))

    s, result = step(mode)
    params = s.model.layers * layer_params_per_device(s.model, s.parallelism.tp)
    extra_s = accumulating(m) * params * bytes_per_param / 1e12
    assert result.step_time_s - step("fused")[1].step_time_s == pytest.approx(extra_s)
    accumulated = [r for r in result.trace.expand() if r.name == "grad_accum"]
    assert sorted(r.microbatch for r in accumulated) == list(range(m - accumulating(m), m))


def test_busy_plus_idle_is_step_time_on_every_stream(tiny):
    result = simulate(tiny)
    usage = result.stream_usage()
    total = (usage.busy_s + usage.idle_s).tolist()
    assert total == pytest.approx([result.step_time_s] * len(usage))
    assert (usage.idle_s >= -1e-12).all()


def test_breakdown_sums_to_step_time(tiny):
    result = simulate(tiny)
    for stage in result.stages:
        assert sum(stage.as_dict().values()) == pytest.approx(result.step_time_s, rel=1e-9)


def test_dp_of_one_has_no_dp_traffic():
    result = simulate(make_scenario(nodes=1, parallelism__tp=2, parallelism__pp=4,
                                    parallelism__zero=1))
    assert result.scenario.dp == 1
    assert not [r for r in result.trace.records if r.stream == "dp"]
    assert result.breakdown_s["dp_comm"] == 0.0


def test_dp_traffic_when_replicated():
    result = simulate(make_scenario(nodes=2, parallelism__tp=2, parallelism__pp=4))
    assert result.scenario.dp == 2
    assert [r for r in result.trace.records if r.stream == "dp"]


@pytest.mark.parametrize("overrides", [
    {},
    {"parallelism__zero": 1},
    {"parallelism__zero": 3, "parallelism__pp": 1, "parallelism__tp": 4},
    {"parallelism__schedule": "interleaved-1f1b", "parallelism__virtual_stages": 2},
    {"parallelism__schedule": "interleaved-1f1b", "parallelism__virtual_stages": 2,
     "parallelism__overlap_pp_comm": True},  # posted sends and receives holding units
    {"parallelism__schedule": "zb-h1", "parallelism__overlap_dp_comm": False},
    {"model__tied_embeddings": True},
    {"parallelism__zero": 3, "system__node__collective_units": 32},
])
def test_reduced_and_full_fidelity_agree(overrides):
    base = {"nodes": 2, "parallelism__pp": 2, "training__global_batch": 16} | overrides
    reduced = simulate(make_scenario(**base))
    full = simulate(make_scenario(**base, fidelity="full"))
    assert full.scenario.devices == 16
    assert full.trace.devices() == list(range(16))
    assert full.step_time_s == pytest.approx(reduced.step_time_s, rel=1e-9, abs=0)
    for a, b in zip(full.stages, reduced.stages, strict=True):
        for x, y in zip(a.as_dict().values(), b.as_dict().values(), strict=True):
            assert x == pytest.approx(y, rel=1e-9, abs=1e-12)


def test_same_seed_same_json(tiny):
    first = simulate(tiny).to_json()
    second = simulate(tiny).to_json()
    assert first == second
    assert json.loads(first)["step_time_s"] > 0


def test_cost_does_not_grow_with_dp():
    small = simulate(make_scenario(nodes=2, parallelism__pp=2, training__global_batch=64))
    large = simulate(make_scenario(nodes=64, parallelism__pp=2, training__global_batch=2048))
    assert len(small.trace.records) == len(large.trace.records)


def test_blocking_pipeline_sends_expose_pp_comm():
    blocking = simulate(make_scenario(nodes=4, parallelism__tp=8, parallelism__pp=4,
                                      parallelism__overlap_pp_comm=False))
    overlapped = simulate(make_scenario(nodes=4, parallelism__tp=8, parallelism__pp=4,
                                        parallelism__overlap_pp_comm=True))
    assert blocking.step_time_s > overlapped.step_time_s
    assert blocking.breakdown_s["pp_comm"] > overlapped.breakdown_s["pp_comm"]


class _SendCosts(LayerOnlyCosts):
    """Layer ops by FLOPs and bytes; a pipeline send costs ``within`` between two devices
    of one node and ``across`` between nodes; nothing else costs."""

    def __init__(self, within: float, across: float) -> None:
        super().__init__()
        self.within, self.across = within, across

    def comm_s(self, op):
        if op.collective != "send_recv":
            return 0.0
        return self.within if op.within_node else self.across


@pytest.mark.parametrize("schedule", ["1f1b", "interleaved-1f1b"])
def test_pipeline_sends_cross_the_network_only_between_nodes(schedule):
    # pp = 16 on two 8-GPU nodes: stages 0-7 on one, 8-15 on the other. Only 7 <-> 8 (and,
    # interleaved, the wrap from stage 15 to stage 0's next chunk) leave a node.
    scenario = make_scenario(nodes=2, parallelism__tp=1, parallelism__pp=16,
                             parallelism__schedule=schedule,
                             parallelism__virtual_stages=2 if schedule != "1f1b" else 1,
                             model__layers=32, training__global_batch=32)
    result = simulate(scenario, _SendCosts(within=1e-4, across=1e-3))
    sends = [r for r in result.trace.records if r.name == "pp_send"]
    assert {round(r.end_s - r.start_s, 9) for r in sends} == {1e-4, 1e-3}
    slow = Counter(r.stage for r in sends if r.end_s - r.start_s > 5e-4)
    m = result.workload.microbatches
    if schedule == "1f1b":  # 7 -> 8 forward, 8 -> 7 backward
        assert slow == {7: m, 8: m}
    else:  # both chunks cross 7 <-> 8; chunk 0's end (15) feeds chunk 1's start (0)
        assert slow == {7: 2 * m, 8: 2 * m, 15: m, 0: m}


class _GatherCosts(LayerOnlyCosts):
    """Layer ops by FLOPs and bytes; a pipeline send costs 1 ms, the receivers' all-gather
    over their TP group 0.5 ms; nothing else costs."""

    def comm_s(self, op):
        if op.collective == "send_recv":
            return 1e-3
        return 5e-4 if op.name == "pp_gather" and op.axis == "tp" else 0.0


@pytest.mark.parametrize(("framework", "before_backward"), [("megatron", 1), ("deepspeed", 2)])
def test_scatter_gather_rebuilds_every_received_message_before_its_pass(framework,
                                                                        before_backward):
    scenario = make_scenario(nodes=2, parallelism__tp=8, parallelism__pp=2,
                             parallelism__pp_scatter_gather=framework, training__global_batch=32)
    result = simulate(scenario, _GatherCosts())
    plain = simulate(scenario.model_copy(update={"parallelism": scenario.parallelism.model_copy(
        update={"pp_scatter_gather": "none"})}), _GatherCosts())
    m = result.workload.microbatches
    gathers = [r for r in result.trace.records if r.name == "pp_gather"]
    # Stage 1 rebuilds m activations before its forwards; stage 0 m gradients before its
    # backwards, and with DeepSpeed its own partitioned output too.
    assert Counter(r.stage for r in gathers) == {0: m, 1: m}
    span = {s: {round(r.end_s - r.start_s, 12) for r in gathers if r.stage == s} for s in (0, 1)}
    assert span == {0: {before_backward * 5e-4}, 1: {5e-4}}
    assert not [r for r in plain.trace.records if r.name == "pp_gather"]
    # The device waits for them: pipeline time, and a longer step than the same sends alone.
    assert result.step_time_s > plain.step_time_s
    assert result.breakdown_s["pp_comm"] >= plain.breakdown_s["pp_comm"] + m * 5e-4 - 1e-9


def test_fp8_keeps_attention_in_bf16_and_adds_casts():
    fp8 = make_scenario(system="eos", nodes=1, parallelism__tp=8, parallelism__pp=1,
                        training__precision="fp8")
    from llmsim.workload import build_workload

    work = build_workload(fp8.model, fp8.parallelism, fp8.training, fp8.dp)
    ops = [op for c in work.chunks.values() for op in (*c.forward, *c.backward)]
    assert {op.dtype for op in ops if getattr(op, "kind", None) == "attention"} == {"bf16"}
    assert any(op.name.startswith("fp8_cast") for op in ops)
    bf16 = simulate(make_scenario(system="eos", nodes=1, parallelism__tp=8, parallelism__pp=1,
                                  training__precision="bf16", model__hidden=4096,
                                  model__ffn_hidden=16384, model__heads=32,
                                  training__seq_len=2048))
    fast = simulate(make_scenario(system="eos", nodes=1, parallelism__tp=8, parallelism__pp=1,
                                  training__precision="fp8", model__hidden=4096,
                                  model__ffn_hidden=16384, model__heads=32,
                                  training__seq_len=2048))
    # FP8 doubles the GEMM peak but not attention, casts or communication.
    assert bf16.step_time_s / 2 < fast.step_time_s < bf16.step_time_s


class _GatherOnlyCosts(LayerOnlyCosts):
    """Blocks priced by FLOPs and bytes; every layer's weight gather (ZeRO-3 or the
    overlapped ZeRO-1 parameter gather) and the post-optimizer gather take ``gather_s``."""

    def __init__(self, gather_s: float) -> None:
        super().__init__()
        self.gather_s = gather_s

    def comm_s(self, op):
        return self.gather_s if op.name.startswith(("z3_ag", "dp_ag_params")) else 0.0


def _zero3(costs=None, prefetch=True, nodes=2, **extra):
    scenario = make_scenario(nodes=nodes, parallelism__zero=3, parallelism__pp=1,
                             parallelism__tp=4, training__global_batch=16,
                             parallelism__prefetch_weights=prefetch, **extra)
    return simulate(scenario, costs)


def test_zero3_gathers_each_layer_before_its_forward_and_backward():
    result = _zero3()
    layers = result.scenario.model.layers  # pp = 1: one chunk holds every layer
    gathers = [r for r in result.trace.records if r.name.startswith("z3_ag")]
    passes = [r for r in result.trace.records if r.stream == "compute" and r.kind in "FB"]
    assert len(gathers) == len({(r.microbatch, r.kind) for r in passes}) * layers
    assert len({r.name for r in gathers}) == layers


def test_zero3_prefetch_hides_gathers_shorter_than_a_layer():
    f_layer = _zero3(_GatherOnlyCosts(0.0)).trace.blocks[(0, 0, "F")].duration_s / 8
    free = _zero3(_GatherOnlyCosts(0.0))
    cheap = _zero3(_GatherOnlyCosts(f_layer / 10))
    # Only the very first layer's gather has nothing to hide behind.
    assert cheap.step_time_s == pytest.approx(free.step_time_s + f_layer / 10, rel=1e-9)
    assert cheap.breakdown_s["dp_comm"] == pytest.approx(f_layer / 10, rel=1e-9)


def test_zero3_forward_is_gather_bound_when_gathers_are_slow():
    costs = _GatherOnlyCosts(0.0)
    f_layer = _zero3(costs).trace.blocks[(0, 0, "F")].duration_s / 8
    slow = _zero3(_GatherOnlyCosts(10 * f_layer))
    first_forward = [r for r in slow.trace.records
                     if r.stream == "compute" and r.kind == "F" and r.microbatch == 0]
    # Gathers run back to back, one per layer; the last layer computes after the last.
    assert max(r.end_s for r in first_forward) == pytest.approx(8 * 10 * f_layer + f_layer)
    assert sum(r.end_s - r.start_s for r in first_forward) == pytest.approx(8 * f_layer)
    ops = [r for r in slow.trace.expand() if r.microbatch == 0 and r.kind == "F"]
    assert sum(r.end_s - r.start_s for r in ops) == pytest.approx(8 * f_layer)
    assert max(r.end_s for r in ops) == pytest.approx(8 * 10 * f_layer + f_layer)
    usage = slow.stream_usage()
    assert (usage.busy_s + usage.idle_s).tolist() == pytest.approx(
        [slow.step_time_s] * len(usage))
    for stage in slow.stages:
        assert sum(stage.as_dict().values()) == pytest.approx(slow.step_time_s, rel=1e-9)


def test_zero3_without_prefetch_exposes_every_gather():
    f_layer = _zero3(_GatherOnlyCosts(0.0)).trace.blocks[(0, 0, "F")].duration_s / 8
    free = _zero3(_GatherOnlyCosts(0.0), prefetch=False)
    g = f_layer / 10
    blocking = _zero3(_GatherOnlyCosts(g), prefetch=False)
    gathers = [r for r in blocking.trace.records if r.name.startswith("z3_ag")]
    # Each layer's gather starts when the layer is reached and the compute waits for it.
    assert len(gathers) == 8 * len({(r.microbatch, r.kind) for r in blocking.trace.records
                                    if r.stream == "compute" and r.kind in "FB"})
    assert blocking.step_time_s == pytest.approx(free.step_time_s + len(gathers) * g, rel=1e-9)
    assert blocking.breakdown_s["dp_comm"] == pytest.approx(len(gathers) * g, rel=1e-9)
    prefetched = _zero3(_GatherOnlyCosts(g))
    assert prefetched.step_time_s < blocking.step_time_s
    for stage in blocking.stages:
        assert sum(stage.as_dict().values()) == pytest.approx(blocking.step_time_s, rel=1e-9)


@pytest.mark.parametrize("prefetch", [False, True])
def test_zero3_regather_gathers_each_backward_layer_for_recompute_and_backward(prefetch):
    f_layer = _zero3(_GatherOnlyCosts(0.0)).trace.blocks[(0, 0, "F")].duration_s / 8
    g = f_layer / 10
    full = {"parallelism__recompute": "full"}
    once = _zero3(_GatherOnlyCosts(g), prefetch, **full)
    twice = _zero3(_GatherOnlyCosts(g), prefetch, parallelism__regather_for_recompute=True,
                   **full)
    gathers = sorted((r for r in twice.trace.records if r.name.startswith("z3_ag")),
                     key=lambda r: r.start_s)
    passes = {(r.microbatch, r.kind) for r in twice.trace.records
              if r.stream == "compute" and r.kind in "FB"}
    n_f = sum(1 for _, kind in passes if kind == "F")
    assert len(gathers) == 8 * n_f + 16 * (len(passes) - n_f)
    # A backward pass gathers each layer, last to first, twice in a row.
    names = ",".join(r.name for r in gathers)
    assert ",".join(f"z3_ag_c0_l{j},z3_ag_c0_l{j}" for j in reversed(range(8))) in names
    if not prefetch:  # every gather exposed: one more per backward layer
        extra_gathers = 8 * (len(passes) - n_f)
        assert twice.step_time_s == pytest.approx(once.step_time_s + extra_gathers * g,
                                                  rel=1e-9)
    else:  # prefetched one part ahead, gathers this short hide behind the compute
        assert twice.step_time_s == pytest.approx(once.step_time_s, rel=1e-9)
    for stage in twice.stages:
        assert sum(stage.as_dict().values()) == pytest.approx(twice.step_time_s, rel=1e-9)


def test_zero3_gather_per_module_runs_one_all_gather_per_weight_matrix():
    g = 1e-4
    one = _zero3(_GatherOnlyCosts(g), False)
    per_module = _zero3(_GatherOnlyCosts(g), False, parallelism__gather_per_module=True)
    k = per_module.scenario.model.mlp_matrices + 2  # QKV, attention output, MLP matrices
    assert per_module.workload.gather_messages == k == 4
    count = [len([r for r in res.trace.records if r.name.startswith("z3_ag")])
             for res in (one, per_module)]
    assert count[1] == k * count[0]
    # Every message of every layer is exposed: k times the gathers' time.
    assert per_module.step_time_s == pytest.approx(one.step_time_s + (k - 1) * count[0] * g,
                                                   rel=1e-9)
    # The bytes are split, not repeated.
    chunk = per_module.workload.chunks[(0, 0)]
    ops = per_module.workload.weight_gathers(chunk)
    assert sum(op.bytes for op in ops) * k == pytest.approx(
        chunk.params * per_module.workload.param_bytes_per_param)


def test_zero3_tensor_list_gathers_copy_every_ranks_slice():
    plain = _zero3()
    listed = _zero3(parallelism__tensor_list_gathers=True)
    dp = listed.scenario.dp
    ops = listed.workload.weight_gathers(listed.workload.chunks[(0, 0)])
    assert {op.copies for op in ops} == {dp} and dp > 1
    assert {op.fill_passes for op in ops} == {1}  # the zero-filled output buffer
    plain_ops = plain.workload.weight_gathers(plain.workload.chunks[(0, 0)])
    assert {(op.copies, op.fill_passes) for op in plain_ops} == {(0, 0)}
    assert listed.step_time_s > plain.step_time_s


def test_zero3_tensor_list_host_loop_is_exposed_once_per_gather_and_rank():
    """DeepSpeed 2021's per-rank Python loop runs before every gather, the device idle:
    without prefetch each gather is exposed, so the step grows by gathers × dp × the
    per-rank host time."""
    flags = dict(prefetch=False, parallelism__tensor_list_gathers=True,
                 parallelism__tensor_list_host_us_per_call=0.0)
    base = _zero3(parallelism__tensor_list_host_us_per_rank=0.0, **flags)
    slow = _zero3(parallelism__tensor_list_host_us_per_rank=10.0, **flags)
    dp = slow.scenario.dp
    ops = slow.workload.weight_gathers(slow.workload.chunks[(0, 0)])
    assert [op.host_s for op in ops] == pytest.approx([dp * 10e-6] * len(ops))
    gathers = sum(1 for r in slow.trace.records if r.name.startswith("z3_ag"))
    # Per stage (one per device column): the gathers of one device run one after another.
    per_device = gathers // len(slow.stages)
    assert slow.step_time_s == pytest.approx(base.step_time_s + per_device * dp * 10e-6,
                                             rel=1e-6)
    # Without tensor-list gathers there is no loop to pay for.
    plain = _zero3(prefetch=False, parallelism__tensor_list_host_us_per_rank=10.0)
    assert {op.host_s for op in plain.workload.weight_gathers(
        plain.workload.chunks[(0, 0)])} == {0.0}


def test_zero3_tensor_list_call_cost_is_paid_once_per_gather_whatever_the_ranks():
    """The call's own host time (DeepSpeed 2021's per-parameter bookkeeping and PyTorch's
    call path) adds once to every gather's host time, on top of the per-rank loop."""
    def run(nodes, call_us):
        return _zero3(prefetch=False, nodes=nodes, parallelism__tensor_list_gathers=True,
                      parallelism__tensor_list_host_us_per_rank=10.0,
                      parallelism__tensor_list_host_us_per_call=call_us)

    for nodes in (1, 2):
        base, slow = run(nodes, 0.0), run(nodes, 300.0)
        dp = slow.scenario.dp
        ops = slow.workload.weight_gathers(slow.workload.chunks[(0, 0)])
        assert [op.host_s for op in ops] == pytest.approx([dp * 10e-6 + 300e-6] * len(ops))
        per_device = sum(1 for r in slow.trace.records
                         if r.name.startswith("z3_ag")) // len(slow.stages)
        assert slow.step_time_s == pytest.approx(base.step_time_s + per_device * 300e-6,
                                                 rel=1e-6)


def test_regather_needs_full_recompute():
    g = 1e-4
    plain = _zero3(_GatherOnlyCosts(g), False)
    flagged = _zero3(_GatherOnlyCosts(g), False, parallelism__regather_for_recompute=True)
    assert flagged.step_time_s == plain.step_time_s


# ---------------------------------------------------------------- TP communication overlap


class _TpCosts(LayerOnlyCosts):
    """Layer ops by FLOPs and bytes, every TP collective ``comm_s``, nothing else."""

    def __init__(self, comm_s: float) -> None:
        super().__init__()
        self.tp_comm_s = comm_s

    def comm_s(self, op):
        return self.tp_comm_s if op.axis == "tp" else 0.0


def _sp(overlap: bool, **extra):
    return make_scenario(nodes=2, parallelism__tp=8, parallelism__pp=2,
                         parallelism__sequence_parallel=True,
                         parallelism__overlap_tp_comm=overlap, **extra)


@pytest.mark.parametrize("comm_factor", [0.0, 0.3, 1.0, 3.0])
def test_tp_overlap_exposes_what_the_pipelining_formula_says(comm_factor):
    from llmsim.blocks import exposed_overlap_s

    base = simulate(_sp(False), costs=_TpCosts(0.0)).trace.blocks[(1, 0, "F")]
    qkv = next(s for s in base.spans if s.name == "qkv").duration_s
    c = comm_factor * qkv
    plain = simulate(_sp(False), costs=_TpCosts(c)).trace.blocks[(1, 0, "F")]
    over = simulate(_sp(True), costs=_TpCosts(c)).trace.blocks[(1, 0, "F")]
    gemms = {s.name: s.duration_s for s in base.spans}
    # Transformer Engine's defaults: all-gathers by ring exchange in tp = 8 chunks,
    # reduce-scatters pipelined in 4.
    chunks = {"qkv": 8, "attn_proj": 4, "mlp_up": 8, "mlp_down": 4}
    layers = sum(1 for s in base.spans if s.name == "qkv")
    hidden = layers * sum(c - exposed_overlap_s(c, gemms[g], n) for g, n in chunks.items())
    assert plain.duration_s - over.duration_s == pytest.approx(hidden, rel=1e-9, abs=1e-15)
    assert over.tp_s == pytest.approx(plain.tp_s - hidden, rel=1e-9, abs=1e-15)


def test_every_sequence_parallel_collective_but_the_lookup_and_head_pairs_with_a_gemm():
    from llmsim.blocks import _paired_gemm

    s = _sp(True)
    work = build_workload(s.model, s.parallelism, s.training, s.dp)
    for chunk in work.chunks.values():
        for block in (chunk.forward, chunk.backward):
            for i, op in enumerate(block):
                if getattr(op, "collective", None) in ("all_gather", "reduce_scatter"):
                    j = _paired_gemm(block, i)
                    if op.name == "embed_tp":  # follows the lookup, no GEMM
                        assert op.pairs_with is None and j is None
                    elif op.name == "head_ag":  # the output layer is not a TE module
                        assert op.pairs_with is None
                    else:
                        assert j is not None and block[j].kind == "gemm", op.name


@pytest.mark.parametrize("overlap", [False, True])
def test_tp_overlap_runs_the_gemms_as_transformer_engine_does(overlap):
    s = _sp(overlap)
    work = build_workload(s.model, s.parallelism, s.training, s.dp)
    chunk = work.chunks[(1, 0)]
    gemms = {op.name: (op.splits, op.reserved_units)
             for block in (chunk.forward, chunk.backward, chunk.weight)
             for op in block if getattr(op, "kind", None) == "gemm"}
    ring, pipeline, bulk = (8, 0), (4, 16), (1, 16)  # tp 8; TE's num_splits 4, num_sm 16
    expected = {"qkv": ring, "mlp_up": ring, "attn_proj": pipeline, "mlp_down": pipeline,
                "mlp_down_dx": ring, "attn_proj_dx": ring,
                "mlp_up_dx": bulk, "qkv_dx": bulk, "mlp_up_dw": bulk, "qkv_dw": bulk,
                "mlp_down_dw": (1, 0), "attn_proj_dw": (1, 0)}
    if not overlap:
        expected = dict.fromkeys(expected, (1, 0))
    assert {name: gemms[name] for name in expected} == expected


@pytest.mark.parametrize("together", [1, 3])
def test_only_the_split_gemms_take_the_concurrent_chunks(together):
    s = _sp(True, parallelism__tp_overlap_concurrent_chunks=together)
    work = build_workload(s.model, s.parallelism, s.training, s.dp)
    chunk = work.chunks[(1, 0)]
    concurrent = {op.name: op.concurrent_splits
                  for block in (chunk.forward, chunk.backward, chunk.weight)
                  for op in block if getattr(op, "kind", None) == "gemm"}
    split = {"qkv", "mlp_up", "attn_proj", "mlp_down", "mlp_down_dx", "attn_proj_dx"}
    assert {n for n, c in concurrent.items() if c == together} >= split
    assert all(c == 1 for n, c in concurrent.items() if n not in split)


def test_tp_overlap_comm_units_must_leave_the_gemms_some():
    with pytest.raises(UserError, match="tp_overlap_comm_units: 108 leaves none"):
        _sp(True, parallelism__tp_overlap_comm_units=108)


def test_a_tp_overlap_gemm_must_leave_the_gemms_some_units():
    with pytest.raises(UserError, match=r"tp_overlap_gemms\.qkv_wgrad\.num_sm: 108 leaves none"):
        _sp(True, parallelism__tp_overlap_gemms={"qkv_wgrad": {"method": "bulk", "num_sm": 108}})


def test_tp_overlap_needs_sequence_parallelism():
    with pytest.raises(UserError, match="overlap_tp_comm: true needs sequence_parallel"):
        make_scenario(nodes=2, parallelism__tp=8, parallelism__pp=2,
                      parallelism__overlap_tp_comm=True)


# ---------------------------------------------------------------- overlapped ZeRO-1 gather


def _zero1(overlap: bool, costs=None):
    scenario = make_scenario(nodes=2, parallelism__zero=1, parallelism__pp=1,
                             parallelism__tp=4, parallelism__overlap_param_gather=overlap,
                             training__global_batch=16)
    return simulate(scenario, costs)


def test_overlapped_param_gather_moves_to_the_first_forward():
    blocking, overlapped = _zero1(False), _zero1(True)
    names = [r.name for r in blocking.trace.records if r.stream == "dp"]
    assert names.count("dp_ag_params") == 1  # one gather, after the optimizer
    gathers = [r for r in overlapped.trace.records if r.name.startswith("dp_ag_params")]
    layers = overlapped.scenario.model.layers  # pp = 1: one chunk
    assert len(gathers) == layers and "dp_ag_params" not in {r.name for r in gathers}
    optimizer_end = max(r.end_s for r in overlapped.trace.records if r.name == "optimizer")
    assert overlapped.trace.step_end_s == pytest.approx(optimizer_end)


def test_overlapped_param_gather_hides_all_but_the_first_layer():
    f_layer = _zero1(True, _GatherOnlyCosts(0.0)).trace.blocks[(0, 0, "F")].duration_s / 8
    free = _zero1(False, _GatherOnlyCosts(0.0))
    g = f_layer / 10
    blocking = _zero1(False, _GatherOnlyCosts(8 * g))  # the whole model in one gather
    overlapped = _zero1(True, _GatherOnlyCosts(g))  # one layer at a time
    assert blocking.step_time_s == pytest.approx(free.step_time_s + 8 * g, rel=1e-9)
    assert overlapped.step_time_s == pytest.approx(free.step_time_s + g, rel=1e-9)
    assert overlapped.breakdown_s["dp_comm"] == pytest.approx(g, rel=1e-9)


def test_overlapped_param_gather_needs_a_distributed_optimizer():
    with pytest.raises(UserError, match="overlap_param_gather: true needs zero 1 or 2"):
        make_scenario(nodes=2, parallelism__tp=8, parallelism__pp=2,
                      parallelism__overlap_param_gather=True)


@pytest.mark.parametrize("p", [2, 4])
def test_tied_embeddings_exchange_their_gradient_before_the_optimizer(p):
    from llmsim.costs import HardwareCosts
    from llmsim.plan import Plan

    scenario = make_scenario(nodes=p, parallelism__tp=8, parallelism__pp=p,
                             model__tied_embeddings=True)
    result = simulate(scenario)
    op = result.workload.embedding_grad_allreduce
    model = scenario.model
    assert op is not None and op.collective == "send_recv" and op.axis == "pp"
    assert op.bytes == -(-model.vocab // 8) * model.hidden * 4  # fp32 gradients
    exchange = [r for r in result.trace.records if r.name == "embed_grad_allreduce"]
    assert sorted(r.stage for r in exchange) == [0, p - 1]
    priced = HardwareCosts.from_scenario(scenario, Plan.from_scenario(scenario)).comm_s(op)
    assert [r.end_s - r.start_s for r in exchange] == pytest.approx([priced, priced])
    assert len({r.start_s for r in exchange}) == 1  # both wait for each other's gradients
    optimizer = [r.start_s for r in result.trace.records if r.name == "optimizer"]
    assert min(optimizer) >= max(r.end_s for r in exchange)
    first = result.stages[0]
    assert first.pp_s >= priced
    assert sum(first.as_dict().values()) == pytest.approx(result.step_time_s, rel=1e-9)


@pytest.mark.parametrize("overrides", [
    {"model__tied_embeddings": False, "parallelism__pp": 4},
    {"model__tied_embeddings": True, "parallelism__pp": 1},
])
def test_no_embedding_exchange_without_a_tied_copy_on_another_stage(overrides):
    result = simulate(make_scenario(nodes=4, parallelism__tp=8, **overrides))
    assert result.workload.embedding_grad_allreduce is None
    assert not [r for r in result.trace.records if r.name == "embed_grad_allreduce"]


# ------------------------------------------- compute units held by data-parallel collectives
def _beside_collective(full_s: float, slowed_s: float, shares=()):
    """Run a pass of ``full_s`` (``slowed_s`` beside a collective) while a collective runs
    from 0.2 s to 0.6 s; returns when the pass ended and when each share of it was done."""
    import simpy

    from llmsim.engine.streams import Contention

    env = simpy.Environment()
    held = Contention(env, variable=True)
    done_at: dict[float, float] = {}

    def note(share: float) -> None:
        done_at[share] = env.now

    marks = [(share, lambda share=share: note(share)) for share in shares]
    ends = []

    def compute():
        yield from held.run(lambda units: slowed_s if units else full_s, marks)
        ends.append(env.now)

    def collective():
        yield env.timeout(0.2)
        held.hold(collective=8)
        yield env.timeout(0.4)
        held.hold(collective=-8)

    env.process(compute())
    env.process(collective())
    env.run()
    return ends[0], done_at


def test_compute_runs_at_the_slowed_rate_only_while_a_collective_runs():
    end, _ = _beside_collective(1.0, 2.0)  # 1 s alone, 2 s beside a collective
    # 0.2 s alone (0.2 of the work), 0.4 s at half speed (0.2), then 0.6 s alone (0.6)
    assert end == pytest.approx(1.2)


def _gathering(units: int, **extra):
    return make_scenario(nodes=4, parallelism__tp=2, parallelism__pp=2, parallelism__zero=3,
                         training__global_batch=64, system__node__collective_units=units,
                         **extra)


def test_collective_units_slow_the_compute_that_gathers_run_beside():
    free, held = simulate(_gathering(0)), simulate(_gathering(32))
    assert held.step_time_s > free.step_time_s
    # the slowed compute is data-parallel time; the compute itself is the same work
    assert held.breakdown_s["compute"] == pytest.approx(free.breakdown_s["compute"])
    assert held.breakdown_s["dp_comm"] > free.breakdown_s["dp_comm"]
    for stage in held.stages:
        assert sum(stage.as_dict().values()) == pytest.approx(held.step_time_s, rel=1e-9)
    usage = held.stream_usage()
    assert (usage.busy_s + usage.idle_s).tolist() == pytest.approx(
        [held.step_time_s] * len(usage))


def test_collectives_after_the_compute_hold_no_units_it_needs():
    """Gradients reduced after the last backward (no overlap, no ZeRO-3 gathers) run
    beside no compute: the units they hold cost nothing."""
    layout = {"nodes": 4, "parallelism__tp": 2, "parallelism__pp": 2, "parallelism__zero": 1,
              "parallelism__overlap_dp_comm": False, "training__global_batch": 64}
    free = simulate(make_scenario(system__node__collective_units=0, **layout))
    held = simulate(make_scenario(system__node__collective_units=32, **layout))
    assert held.step_time_s == free.step_time_s


def test_slowed_passes_stretch_their_ops_in_the_timeline():
    result = simulate(_gathering(32))
    trace = result.trace
    slowed = [r for r in trace.records  # whole passes (not cut by a wait for weights)
              if (b := trace.block_of(r)) is not None and r.slowed_s(b) > 0
              and r.block_from_s == 0 and r.block_to_s == math.inf]
    assert slowed
    ops = [r for r in trace.expand() if r.stream in ("compute", "tp")]
    for r in slowed:
        inside = [o for o in ops if o.device == r.device and r.start_s - 1e-12 <= o.start_s
                  and o.end_s <= r.end_s + 1e-12 and (o.microbatch, o.chunk)
                  == (r.microbatch, r.chunk)]
        assert sum(o.end_s - o.start_s for o in inside) == pytest.approx(r.end_s - r.start_s)


def test_collective_units_must_leave_the_compute_some():
    with pytest.raises(UserError, match="collective_units"):
        make_scenario(system__node__collective_units=108)
    with pytest.raises(UserError, match="other kernels hold 60 more"):
        make_scenario(nodes=2, parallelism__tp=8, parallelism__pp=2,
                      parallelism__sequence_parallel=True, parallelism__overlap_tp_comm=True,
                      parallelism__tp_overlap_comm_units=48, system__node__collective_units=60)


# ------------------------------------------------------ gradient buckets as they become final
def test_marks_succeed_when_their_share_of_the_pass_is_done():
    end, done_at = _beside_collective(2.0, 4.0, shares=(0.25, 1.0))
    # 0.2 s alone (10 % of the work), 0.4 s at half speed (10 %), 0.1 s alone: 25 % at 0.7 s
    assert done_at == {0.25: pytest.approx(0.7), 1.0: pytest.approx(2.2)}
    assert end == pytest.approx(2.2)


def _buckets(schedule: str):
    scenario = make_scenario(nodes=4, parallelism__tp=2, parallelism__pp=1, parallelism__zero=1,
                             parallelism__schedule=schedule, parallelism__dp_bucket_mb=1,
                             training__global_batch=64)
    result = simulate(scenario)
    last = result.workload.microbatches - 1
    passes = {r.kind: r for r in result.trace.records
              if r.device == 0 and r.stream == "compute" and r.microbatch == last}
    reductions = [r for r in result.trace.records
                  if r.device == 0 and r.stream == "dp" and r.name.startswith("dp_rs")]
    buckets = len(result.workload.dp_grad_ops(result.workload.chunks[(0, 0)]))
    return passes, reductions, buckets


def test_a_fused_backward_reduces_each_bucket_once_its_share_of_b_and_w_is_done():
    passes, reductions, buckets = _buckets("1f1b")
    assert len(reductions) == buckets > 2
    b, w = passes["B"], passes["W"]
    assert w.start_s == pytest.approx(b.end_s)
    # the last layers' bucket is final after 1/n of the backward, B and W together
    assert reductions[0].start_s == pytest.approx(b.start_s + (w.end_s - b.start_s) / buckets)
    assert reductions[0].start_s < b.end_s
    assert reductions[-1].start_s >= w.end_s - 1e-12


def test_a_split_backward_reduces_its_buckets_during_the_weight_pass():
    passes, reductions, buckets = _buckets("zb-h1")
    assert len(reductions) == buckets
    w = passes["W"]
    assert reductions[0].start_s == pytest.approx(w.start_s + (w.end_s - w.start_s) / buckets)


def _checked(overlap: bool, check: bool):
    scenario = make_scenario(nodes=4, parallelism__tp=2, parallelism__pp=1, parallelism__zero=1,
                             parallelism__dp_bucket_mb=1, training__global_batch=64,
                             parallelism__overlap_dp_comm=overlap,
                             parallelism__grad_bucket_nan_check=check,
                             parallelism__grad_bucket_prescale=check)
    return simulate(scenario)


def _prep_s(result) -> float:
    work = result.workload
    costs = build_engine(result.scenario).costs
    return sum(costs.compute_s(op) for bucket in work.dp_grad_ops(work.chunks[(0, 0)])
               for op in work.grad_sync_prep(bucket))


def test_bucket_checks_pause_the_backward_and_precede_each_reduction():
    result = _checked(overlap=True, check=True)
    records = [r for r in result.trace.records if r.device == 0]
    checks = [r for r in records if r.kind == "D"]
    reductions = [r for r in records if r.stream == "dp" and r.name.startswith("dp_rs")]
    buckets = len(reductions)
    assert buckets > 2 and len(checks) == 2 * buckets  # a NaN check and a scaling each
    assert sum(r.end_s - r.start_s for r in checks) == pytest.approx(_prep_s(result))
    # Each reduction is issued when its bucket's scaling ends, never before.
    scalings = [r for r in checks if r.name == "dp_grad_prescale"]
    for scaling, reduction in zip(scalings, reductions, strict=True):
        assert reduction.start_s >= scaling.end_s - 1e-12
    # The checks run on the compute stream: nothing else computes meanwhile, and the
    # last backward's parts add up to its block.
    compute = sorted((r for r in records if r.stream == "compute"), key=lambda r: r.start_s)
    for a, b in itertools.pairwise(compute):
        assert b.start_s >= a.end_s - 1e-12
    last = result.workload.microbatches - 1
    parts = [r for r in compute if r.microbatch == last and r.kind in "BW"]
    assert len(parts) > 2  # split around the pauses
    assert sum(r.block_share(result.trace.block_of(r)) for r in parts) == pytest.approx(2.0)


def test_bucket_checks_lengthen_the_step_and_count_as_data_parallel_time():
    plain, checked = _checked(overlap=True, check=False), _checked(overlap=True, check=True)
    assert checked.step_time_s > plain.step_time_s
    assert checked.breakdown_s["compute"] == pytest.approx(plain.breakdown_s["compute"])
    assert checked.breakdown_s["dp_comm"] > plain.breakdown_s["dp_comm"]
    assert sum(checked.breakdown_s.values()) == pytest.approx(checked.step_time_s)


def test_without_overlap_each_bucket_is_checked_after_the_previous_reduction():
    plain, checked = _checked(overlap=False, check=False), _checked(overlap=False, check=True)
    records = [r for r in checked.trace.records if r.device == 0]
    reductions = [r for r in records if r.stream == "dp"]
    nan_checks = [r for r in records if r.name == "dp_grad_nan_check"]
    for reduction, next_check in zip(reductions, nan_checks[1:], strict=False):
        assert next_check.start_s >= reduction.end_s - 1e-12
    # The serial checks and reductions: the step grows by the checks' time at least.
    assert checked.step_time_s >= plain.step_time_s + _prep_s(checked) - 1e-9
    assert sum(checked.breakdown_s.values()) == pytest.approx(checked.step_time_s)
    assert checked.breakdown_s["dp_comm"] == pytest.approx(
        plain.breakdown_s["dp_comm"] + checked.step_time_s - plain.step_time_s)


def test_aligned_reductions_are_issued_whole_after_the_backward_step_megatron_picks():
    scenario = make_scenario(nodes=4, parallelism__tp=4, parallelism__pp=2,
                             parallelism__zero=1, parallelism__schedule="interleaved-1f1b",
                             parallelism__virtual_stages=2, parallelism__dp_bucket_mb=1,
                             parallelism__grad_reduce_launch="pp_aligned",
                             parallelism__grad_bucket_nan_check=True,
                             training__global_batch=64)
    result = simulate(scenario)
    engine = build_engine(scenario)
    work = result.workload
    for stage, actions in enumerate(engine.schedule):
        device = next(d.id for d in engine.devices if d.stage == stage)
        records = [r for r in result.trace.records if r.device == device]
        passes = {(r.kind, r.microbatch, r.chunk): r for r in records
                  if r.stream == "compute" and r.kind in "FBW"}
        assert len(passes) == len(actions)  # no pass paused: nothing is issued inside one
        reductions = [r for r in records if r.stream == "dp" and r.name.startswith("dp_rs")]
        for index, chunks in engine.grad_syncs[stage].items():
            after = actions[index]
            end = passes[(after.kind, after.microbatch, after.chunk)].end_s
            for chunk in chunks:
                vs = work.chunks[(stage, chunk)].virtual_stage
                mine = [r for r in reductions if r.name.startswith(f"dp_rs_c{vs}_")]
                assert len(mine) == len(work.dp_grad_ops(work.chunks[(stage, chunk)]))
                assert min(r.start_s for r in mine) >= end - 1e-12


def test_overlapped_buckets_hide_what_a_reduction_after_the_backward_exposes():
    layout = {"nodes": 4, "parallelism__tp": 2, "parallelism__pp": 1, "parallelism__zero": 1,
              "training__global_batch": 64}
    after = simulate(make_scenario(parallelism__overlap_dp_comm=False, **layout))
    during = simulate(make_scenario(parallelism__overlap_dp_comm=True, **layout))
    assert during.breakdown_s["dp_comm"] < after.breakdown_s["dp_comm"]
    assert during.step_time_s < after.step_time_s


# ------------------------------------------- posted pipeline sends and receives hold units
def _interleaved(**extra):
    layout = {"parallelism__schedule": "interleaved-1f1b", "parallelism__virtual_stages": 2,
              "parallelism__overlap_pp_comm": True}
    return make_scenario(**{**layout, **extra})


@pytest.mark.parametrize(("nbytes", "within", "units"), [
    (28.3e6, True, 16),         # 1 MiB .. 256 MiB: half the peer's 32 channels
    (512 * 1024, True, 8),      # chunks of at least 64 KiB: 8 of them
    (64 * 1024, True, 1),
    (300 * 2**20, True, 32),    # 16 chunks would exceed 16 MiB each: doubled
    (28.3e6, False, 2),         # another node: the network's channels per peer
])
def test_a_posted_operation_holds_the_blocks_nccl_splits_it_over(nbytes, within, units):
    system = make_scenario(system__node__p2p_channels_per_peer=32).system
    assert posted_p2p_units(system, nbytes, within) == units


def test_no_units_are_held_where_the_library_kernels_are_not_modelled_so():
    system = make_scenario(system__node__p2p_kernels_hold_units=False).system
    assert posted_p2p_units(system, 28.3e6, True) == posted_p2p_units(system, 28.3e6, False) == 0
    system = make_scenario(system__node__p2p_channels_per_peer=0).system
    assert posted_p2p_units(system, 28.3e6, True) == 0


def test_channels_per_network_peer_are_rounded_up_to_a_power_of_two():
    system = make_scenario(system__network__p2p_channels_per_net_peer=3).system
    assert posted_p2p_units(system, 28.3e6, False) == 4


@pytest.mark.parametrize("extra", [
    {"parallelism__overlap_pp_comm": False},  # blocking sends: the device waits anyway
    {"parallelism__schedule": "1f1b", "parallelism__virtual_stages": 1},
    {"system__node__p2p_kernels_hold_units": False},  # a library whose kernels hold none
])
def test_blocking_or_non_interleaved_pipelines_hold_nothing(extra):
    engine = build_engine(_interleaved(nodes=4, parallelism__tp=8, **extra))
    assert engine.p2p_units == (0, 0)
    # posted one by one only in the overlapped interleaved schedule
    assert engine.rendezvous == ("system__node__p2p_kernels_hold_units" in extra)


def test_the_first_backward_receive_is_posted_after_the_last_warmup_forward():
    engine = build_engine(_interleaved(nodes=1, parallelism__tp=2))
    for dev in engine.devices[:-1]:  # the last stage's first backward receives nothing
        actions = engine.schedule[dev.stage]
        posts = engine._recv_posts(dev, actions)
        first_b = next(j for j, a in enumerate(actions) if a.kind == "B")
        vs = engine.work.chunks[(dev.stage, actions[first_b].chunk)].virtual_stage
        key = (dev.pipe, "B", vs, actions[first_b].microbatch)
        after = next(i for i, keys in posts.items() if any(k == key for k, _ in keys))
        assert after == first_b - 2  # the warmup's last forward, then the steady F
        assert actions[after].kind == actions[after + 1].kind == "F"


@pytest.mark.parametrize(("nodes", "tp", "pp", "v"), [
    (1, 4, 2, 2), (1, 2, 4, 2), (1, 1, 8, 2), (2, 2, 8, 2), (4, 8, 4, 2), (1, 2, 4, 3),
])
def test_posted_pipelines_finish_and_their_held_units_cost_pipeline_time(nodes, tp, pp, v):
    layout = {"nodes": nodes, "parallelism__tp": tp, "parallelism__pp": pp,
              "parallelism__virtual_stages": v, "model__layers": 48,
              "training__global_batch": 8 * pp}
    held = simulate(_interleaved(**layout))
    free = simulate(_interleaved(system__node__p2p_kernels_hold_units=False, **layout))
    assert held.step_time_s >= free.step_time_s
    assert held.breakdown_s["compute"] == pytest.approx(free.breakdown_s["compute"])
    assert held.breakdown_s["pp_comm"] >= free.breakdown_s["pp_comm"] - 1e-12
    assert sum(held.breakdown_s.values()) == pytest.approx(held.step_time_s)


def test_a_step_waits_for_the_previous_step_s_send_of_its_direction():
    """Megatron-LM's overlapped interleaved schedule waits on all of a step's requests,
    its send's too, before the next step of that direction (the fused backward sends
    after its W pass)."""
    result = simulate(_interleaved(nodes=2, parallelism__tp=4))
    checked = 0
    for device in {r.device for r in result.trace.records}:
        records = [r for r in result.trace.records if r.device == device]
        sends = [r for r in records if r.name == "pp_send"]
        passes = sorted((r for r in records if r.stream == "compute" and r.kind in "FBW"
                         and r.block_from_s == 0.0), key=lambda r: r.start_s)
        for kind, sending in (("F", "F"), ("B", "W")):
            steps = [r for r in passes if r.kind == sending]
            nexts = [r for r in passes if r.kind == kind]
            for step in steps:
                sent = [x for x in sends if (x.microbatch, x.chunk, x.kind)
                        == (step.microbatch, step.chunk, kind)]
                later = [r for r in nexts if r.start_s >= step.end_s - 1e-12]
                if sent and later:
                    assert later[0].start_s >= sent[0].end_s - 1e-12
                    checked += 1
    assert checked > 0


def test_peers_on_one_node_hold_more_units_than_peers_across_nodes():
    engine = build_engine(_interleaved(nodes=1, parallelism__tp=2))
    across, within = engine.p2p_units
    assert within > across > 0


def test_posted_operations_must_leave_the_compute_some():
    with pytest.raises(UserError, match="two posted pipeline operations hold 256 of"):
        build_engine(_interleaved(nodes=4, parallelism__tp=8,
                                  system__network__p2p_channels_per_net_peer=108))
    build_engine(_interleaved(nodes=4, parallelism__tp=8,  # held by nothing: fine
                              system__network__p2p_channels_per_net_peer=108,
                              system__node__p2p_kernels_hold_units=False))
    with pytest.raises(UserError, match="and other kernels 106 more"):  # 100 + 6 for TP
        build_engine(_interleaved(nodes=1, parallelism__tp=2,
                                  parallelism__sequence_parallel=True,
                                  parallelism__overlap_tp_comm=True,
                                  parallelism__tp_overlap_comm_units=6,
                                  system__node__collective_units=100))


class _AmaxOnlyCosts(LayerOnlyCosts):
    """Blocks priced by FLOPs and bytes; each FP8 amax all-reduce takes ``amax_s``."""

    def __init__(self, amax_s: float) -> None:
        super().__init__()
        self.amax_s = amax_s

    def comm_s(self, op):
        return self.amax_s if op.name.startswith("fp8_amax_reduce") else 0.0


def _fp8(**extra):
    layout = {"parallelism__tp": 8, "parallelism__pp": 1, **extra}
    return make_scenario(system="eos", nodes=1, training__precision="fp8", **layout)


def test_fp8_amax_reductions_end_each_chunks_forward_and_backward():
    layout = {"parallelism__tp": 2, "parallelism__pp": 4}
    scenario = _fp8(training__fp8_amax_reduction=True, **layout)
    plain = _fp8(**layout)
    work = build_workload(scenario.model, scenario.parallelism, scenario.training, scenario.dp)
    base = build_workload(plain.model, plain.parallelism, plain.training, plain.dp)
    middle = work.chunks[(1, 0)]
    layer_ops = {op.name for op in (*middle.forward, *middle.backward)
                 if not op.name.startswith(("fp8_amax", "fp8_scale_update"))}
    for key, chunk in work.chunks.items():
        for block, plain_block, name, floats in (
                (chunk.forward, base.chunks[key].forward, "fp8_amax_reduce", 3),
                (chunk.backward, base.chunks[key].backward, "fp8_amax_reduce_bwd", 2)):
            at = [i for i, op in enumerate(block) if op.name == name]
            assert len(at) == 1
            op = block[at[0]]
            assert (op.collective, op.axis) == ("all_reduce", "stage")
            assert op.bytes == 4 * floats * 4 * chunk.layers  # one float per FP8 tensor
            assert block[:at[0]] + block[at[0] + 1:] == plain_block  # nothing else changes
            assert not {o.name for o in block[at[0] + 1:]} & layer_ops  # after every layer
    assert not [op for c in base.chunks.values() for op in c.ops
                if op.name.startswith("fp8_amax")]


def test_fp8_amax_reductions_block_the_compute_stream():
    """pp = 1: two reductions per micro-batch, each on the step's path."""
    amax_s = 1e-3
    base = simulate(_fp8(), _AmaxOnlyCosts(amax_s))
    reduced = simulate(_fp8(training__fp8_amax_reduction=True), _AmaxOnlyCosts(amax_s))
    microbatches = 16  # global batch 16, micro-batch 1, one replica
    assert reduced.step_time_s - base.step_time_s == pytest.approx(2 * microbatches * amax_s)


def test_fp8_amax_reduction_needs_fp8():
    with pytest.raises(UserError, match=r"training\.fp8_amax_reduction is true"):
        make_scenario(training__fp8_amax_reduction=True)


def test_progress_of_a_long_run_is_reported_and_changes_no_result() -> None:
    """A watcher reports the share of pipeline actions begun (rising to 1) and leaves
    every record as it was."""
    import llmsim
    from llmsim.simulation import build_engine

    scenario = llmsim.load_scenario("selene-gpt3", ["parallelism.schedule=interleaved-1f1b",
                                                    "parallelism.virtual_stages=4",
                                                    "parallelism.overlap_pp_comm=true"])
    plain = build_engine(scenario).run()
    shares: list[float] = []
    watched = build_engine(scenario).run(progress=shares.append, every_s=0.0)
    assert shares and shares == sorted(shares) and shares[0] > 0 and shares[-1] <= 1
    assert watched.step_end_s == plain.step_end_s
    assert [(r.device, r.name, r.start_s, r.end_s) for r in watched.records] == \
        [(r.device, r.name, r.start_s, r.end_s) for r in plain.records]


def test_uniform_middle_stages_share_their_priced_passes_but_jittered_ones_do_not():
    uniform = _pipeline("1f1b", 4, 8)  # stages 1 and 2 run the same op objects
    engine = build_engine(uniform)
    for kind in ("F", "B", "W"):
        assert engine.blocks[(1, 0, kind)] is engine.blocks[(2, 0, kind)]
    assert engine.blocks[(0, 0, "F")] is not engine.blocks[(1, 0, "F")]  # the embedding
    noisy = build_engine(_pipeline("1f1b", 4, 8, **{"jitter.compute_cv": 0.1, "seed": 3}))
    first, second = noisy.blocks[(1, 0, "F")], noisy.blocks[(2, 0, "F")]
    assert first is not second and first.duration_s != second.duration_s  # a draw each
