"""Transformer Engine's FP8 bookkeeping (llmsim.workload.fp8): the weights' FP8 copies,
once per step or per micro-batch, and the delayed-scaling amax-history update, each sized
from its tensors."""

from __future__ import annotations

import pytest
from helpers import make_scenario

from llmsim import simulate
from llmsim.workload import build_workload

LINEARS_PER_LAYER = 4


def workload(**overrides):
    s = make_scenario(system="eos", training__precision="fp8", **overrides)
    return s, build_workload(s.model, s.parallelism, s.training, s.dp)


def linear_weights_per_layer(s) -> int:
    """Weight elements of one layer's four linear layers on one device (tiny GPT, no GQA)."""
    h, f, t = s.model.hidden, s.model.ffn_hidden, s.parallelism.tp
    return h * 3 * h // t + (h // t) * h + h * f // t + (f // t) * h


def named(ops, prefix):
    return [op for op in ops if op.name.startswith(prefix)]


def test_per_step_weight_casts_add_four_bytes_per_weight_to_each_stage() -> None:
    s, fp8 = workload()
    _, per_mb = workload(training__fp8_weight_cast="per_microbatch")
    layers = {stage: sum(c.layers for (st, _), c in fp8.chunks.items() if st == stage)
              for stage in fp8.optimizer}
    for stage, opt in fp8.optimizer.items():
        added = opt.bytes - per_mb.optimizer[stage].bytes
        assert added == 4 * layers[stage] * linear_weights_per_layer(s)
        assert opt.splits - per_mb.optimizer[stage].splits == LINEARS_PER_LAYER * layers[stage]
    for chunk in fp8.chunks.values():
        assert not named(chunk.forward, "fp8_weight_cast")


def test_per_microbatch_weight_casts_sit_before_each_forward_linear() -> None:
    s, work = workload(training__fp8_weight_cast="per_microbatch")
    chunk = work.chunks[(0, 0)]
    casts = named(chunk.forward, "fp8_weight_cast_")
    assert len(casts) == LINEARS_PER_LAYER * chunk.layers
    assert sum(c.bytes for c in casts) == 4 * chunk.layers * linear_weights_per_layer(s)
    names = [op.name for op in chunk.forward]
    assert names.index("fp8_weight_cast_qkv") < names.index("qkv")


@pytest.mark.parametrize("mode", ["per_step", "per_microbatch"])
def test_current_scaling_reads_each_weight_once_more(mode: str) -> None:
    def cast_bytes(scaling: str) -> float:
        _, w = workload(training__fp8_weight_cast=mode, training__fp8_scaling=scaling)
        if mode == "per_step":
            return w.optimizer[0].bytes
        return sum(op.bytes for op in named(w.chunks[(0, 0)].forward, "fp8_weight_cast_"))

    s, base = workload(training__fp8_weight_cast=mode)
    extra = cast_bytes("current") - cast_bytes("delayed")
    layers = base.chunks[(0, 0)].layers
    assert extra == 2 * layers * linear_weights_per_layer(s)


@pytest.mark.parametrize("factor", [2, 4])
def test_weight_casts_scale_with_the_hidden_size_not_the_tokens(factor: int) -> None:
    def cast_bytes(**overrides) -> float:
        _, w = workload(training__fp8_weight_cast="per_microbatch", **overrides)
        return sum(op.bytes for op in named(w.chunks[(0, 0)].forward, "fp8_weight_cast_"))

    s, _ = workload()
    h, f = s.model.hidden, s.model.ffn_hidden
    assert cast_bytes(model__hidden=h * factor, model__ffn_hidden=f * factor,
                      model__heads=s.model.heads * factor) == factor ** 2 * cast_bytes()
    assert cast_bytes(training__seq_len=s.training.seq_len * 2) == cast_bytes()


def test_amax_history_update_ends_each_chunk_pass_and_scales_with_its_length() -> None:
    s, work = workload()
    chunk = work.chunks[(0, 0)]
    (fwd,), (bwd,) = named(chunk.forward, "fp8_scale_update"), named(chunk.backward,
                                                                     "fp8_scale_update")
    linears = LINEARS_PER_LAYER * chunk.layers
    tensors_f, tensors_b = 3 * linears, 2 * linears
    assert fwd.splits == bwd.splits == 2
    history = s.training.fp8_amax_history_len
    assert fwd.bytes == 4 * tensors_f * (2 + 2 * history + 4)
    assert bwd.bytes == 4 * tensors_b * (2 + 2 * history + 4)
    _, longer = workload(training__fp8_amax_history_len=2 * history)
    (fwd2,) = named(longer.chunks[(0, 0)].forward, "fp8_scale_update")
    assert fwd2.bytes - fwd.bytes == 4 * tensors_f * 2 * history


def test_no_history_update_under_current_scaling_or_without_fp8() -> None:
    _, current = workload(training__fp8_scaling="current")
    bf16 = make_scenario(system="eos", training__precision="bf16")
    plain = build_workload(bf16.model, bf16.parallelism, bf16.training, bf16.dp)
    for w in (current, plain):
        for chunk in w.chunks.values():
            assert not named(chunk.forward + chunk.backward, "fp8_scale_update")


def test_the_bookkeeping_lengthens_the_step() -> None:
    s = make_scenario(system="eos", training__precision="fp8")
    per_step = simulate(s).step_time_s
    per_mb = simulate(make_scenario(system="eos", training__precision="fp8",
                                    training__fp8_weight_cast="per_microbatch")).step_time_s
    short = simulate(make_scenario(system="eos", training__precision="fp8",
                                   training__fp8_amax_history_len=1)).step_time_s
    assert per_mb > per_step > short


@pytest.mark.parametrize(("history", "reduction", "per_module"), [
    (1, False, 2), (1, True, 3), (16, False, 3), (16, True, 4)])
def test_per_module_updates_launch_two_to_four_kernels_per_te_module(
        history: int, reduction: bool, per_module: int) -> None:
    """TE 0.8: each of a layer's three modules (LayerNormLinear, Linear, LayerNormMLP)
    runs the fused update and the history's fill, the roll with a history above one, the
    copy of the reduced amax with the reduction; the bytes are those of the region form."""
    overrides = {"training__fp8_amax_history_len": history,
                 "training__fp8_amax_reduction": reduction}
    _, region = workload(**overrides)
    _, module = workload(training__fp8_amax_update="per_module", **overrides)
    chunk = module.chunks[(0, 0)]
    for pass_ops in ("forward", "backward"):
        (a,) = named(getattr(region.chunks[(0, 0)], pass_ops), "fp8_scale_update")
        (b,) = named(getattr(chunk, pass_ops), "fp8_scale_update")
        assert b.bytes == a.bytes and a.splits == 2
        assert b.splits == 3 * chunk.layers * per_module


@pytest.mark.parametrize(("scaling", "kernels"), [("delayed", 1), ("current", 4)])
def test_each_weight_cast_runs_its_quantizer_kernels(scaling: str, kernels: int) -> None:
    """Per weight matrix: the cast-transpose under delayed scaling; under current scaling
    also the amax's zero-fill and reduction and the scale (four kernels), per step or
    before every forward alike."""
    _, step = workload(training__fp8_scaling=scaling)
    _, per_mb = workload(training__fp8_scaling=scaling, training__fp8_weight_cast="per_microbatch")
    layers = {stage: sum(c.layers for (st, _), c in step.chunks.items() if st == stage)
              for stage in step.optimizer}
    for stage, opt in step.optimizer.items():
        assert (opt.splits - per_mb.optimizer[stage].splits
                == kernels * LINEARS_PER_LAYER * layers[stage])
    casts = named(per_mb.chunks[(0, 0)].forward, "fp8_weight_cast_")
    assert casts and all(c.splits == kernels and c.host_calls == 1 for c in casts)
