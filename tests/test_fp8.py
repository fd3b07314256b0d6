"""FP8 as Transformer Engine runs it: the cast(-transpose) and amax kernels around each
FP8 GEMM scale with the tensors they cast, and FP8 weights halve the weight gathers."""

from __future__ import annotations

import pytest
from helpers import make_scenario
from hypothesis import given, settings
from hypothesis import strategies as st

from llmsim.blocks import _paired_gemm
from llmsim.costs.compute import ComputeModel
from llmsim.errors import UserError
from llmsim.loader import load_spec
from llmsim.moe_fp8 import split_quantize_kernels
from llmsim.ops import CommOp, ComputeOp
from llmsim.workload import build_workload, pass_ops
from llmsim.workload.fp8 import AMAX_BYTES, TP_AMAX_REDUCTIONS

H100 = load_spec("accelerators", "h100-sxm5-80gb")

LINEARS = ("qkv", "proj", "up", "down")


def layer_ops(**overrides):
    s = make_scenario(system="eos", parallelism__tp=1, parallelism__pp=1,
                      training__precision="fp8", **overrides)
    forward, _, backward, _ = pass_ops(s.model, s.parallelism, s.training).dense
    return s, list(forward), list(backward)


def named(ops, prefix):
    return {op.name.removeprefix(prefix): op for op in ops if op.name.startswith(prefix)}


def test_every_fp8_linear_casts_its_input_and_output_gradient() -> None:
    _, forward, backward = layer_ops()
    casts_f, casts_b = named(forward, "fp8_cast_"), named(backward, "fp8_cast_")
    gemms = {op.name: op for op in forward if op.kind == "gemm"}
    assert set(casts_f) == set(gemms) and len(casts_b) == len(gemms) == len(LINEARS)
    for name, cast in casts_f.items():
        m, _, k = gemms[name].mnk
        assert cast.kind == "memory" and cast.bytes == 4.0 * m * k  # read 2, write 1 + 1
    bf16 = make_scenario(system="eos", training__precision="bf16")
    assert not any(op.name.startswith("fp8_") for op in pass_ops(
        bf16.model, bf16.parallelism, bf16.training).dense[0])


@pytest.mark.parametrize(("key", "factor"), [("training__seq_len", 2),
                                             ("parallelism__micro_batch", 2)])
def test_cast_bytes_scale_with_the_tokens(key: str, factor: int) -> None:
    s, forward, backward = layer_ops()
    base = getattr(s.training if key.startswith("training") else s.parallelism,
                   key.split("__")[1])
    _, more_f, more_b = layer_ops(**{key: base * factor})
    for before, after in ((forward, more_f), (backward, more_b)):
        old, new = named(before, "fp8_cast_"), named(after, "fp8_cast_")
        assert {n: new[n].bytes for n in new} == {n: factor * old[n].bytes for n in old}


def test_cast_bytes_scale_with_the_hidden_size() -> None:
    _, forward, _ = layer_ops()
    _, wide, _ = layer_ops(model__hidden=1024, model__ffn_hidden=4096)
    old, new = named(forward, "fp8_cast_"), named(wide, "fp8_cast_")
    assert all(new[n].bytes == 2 * old[n].bytes for n in old)


def test_current_scaling_reads_each_tensor_for_its_amax_first() -> None:
    _, delayed_f, _ = layer_ops()
    _, forward, backward = layer_ops(training__fp8_scaling="current")
    assert not named(delayed_f, "fp8_amax_")
    for ops in (forward, backward):
        amax, casts = named(ops, "fp8_amax_"), named(ops, "fp8_cast_")
        assert set(amax) == set(casts)
        for name in casts:
            assert amax[name].bytes == casts[name].bytes / 2  # a 16-bit read of the tensor
            names = [op.name for op in ops]
            assert names.index(f"fp8_amax_{name}") < names.index(f"fp8_cast_{name}")


@pytest.mark.parametrize("zero", [1, 3])
def test_fp8_weights_halve_the_weight_gathers(zero: int) -> None:
    def gather_bytes(fp8_params: bool) -> float:
        s = make_scenario(system="eos", nodes=2, parallelism__tp=2, parallelism__pp=1,
                          parallelism__zero=zero, parallelism__overlap_param_gather=zero == 1,
                          training__precision="fp8", training__fp8_param_gather=fp8_params)
        work = build_workload(s.model, s.parallelism, s.training, s.dp)
        gather = work.weight_gather(work.chunks[(0, 0)])
        assert gather is not None
        return gather.bytes

    assert gather_bytes(True) == gather_bytes(False) / 2


def test_fp8_param_gather_needs_fp8() -> None:
    with pytest.raises(UserError, match="fp8_param_gather"):
        make_scenario(training__fp8_param_gather=True)


@pytest.mark.parametrize("scaling", ["current", "delayed"])
def test_each_quantised_tensor_runs_te_kernels_closed_form(scaling: str) -> None:
    """Per quantised tensor of a dense layer: under current scaling a zero-fill and an amax
    kernel reading the 16-bit tensor (2 bytes an element), then the scale and the
    cast-transpose (read 2, write 1 + 1), four kernels from one C++ call each pair
    (``Float8CurrentScalingQuantizer::quantize_impl``); delayed scaling: the cast alone."""
    _, forward, backward = layer_ops(training__fp8_scaling=scaling)
    assert {n.removesuffix("_b") for n in named(backward, "fp8_cast_")} == set(
        named(forward, "fp8_cast_"))
    gemms = {op.name: op for op in forward if op.kind == "gemm"}
    for ops, width in ((forward, lambda n, k: k), (backward, lambda n, k: n)):
        amax, casts = named(ops, "fp8_amax_"), named(ops, "fp8_cast_")
        for name, cast in casts.items():
            m, n, k = gemms[name.removesuffix("_b")].mnk
            elements = m * width(n, k)
            assert cast.bytes == 4.0 * elements and cast.host_calls == 1
            if scaling == "current":
                assert amax[name].bytes == 2.0 * elements and amax[name].host_calls == 1
                assert amax[name].splits + cast.splits == 4
            else:
                assert name not in amax and cast.splits == 1


def test_delayed_scaling_casts_are_one_plain_kernel() -> None:
    """Delayed scaling prices as before: one cast-transpose kernel of 4 bytes an element,
    the same time as a default (one kernel, one dispatch) op of those bytes."""
    model = ComputeModel(H100, "fp8")
    _, forward, backward = layer_ops()
    for cast in (*named(forward, "fp8_cast_").values(), *named(backward, "fp8_cast_").values()):
        plain = ComputeOp(cast.name, "memory", cast.phase, 0.0, cast.bytes)
        assert model.compute_s(cast) == model.compute_s(plain)


@settings(max_examples=25, deadline=None)
@given(tokens=st.integers(64, 1 << 16), width=st.sampled_from([512, 1024, 4096, 16384]),
       more=st.integers(1, 8))
def test_current_scaling_quantisation_time_grows_with_the_tensor(tokens: int, width: int,
                                                                 more: int) -> None:
    """Priced as TE runs it, a dense tensor's current-scaling quantisation takes the
    four kernels' floor plus 6 bytes an element at the stream rate, and more elements
    never take less time."""
    model = ComputeModel(H100, "fp8")

    def quantise_s(elements: int) -> float:
        amax, cast = split_quantize_kernels(1, "current")
        return (model.compute_s(ComputeOp("a", "memory", "F", 0.0, 2.0 * elements,
                                          splits=amax))
                + model.compute_s(ComputeOp("c", "memory", "F", 0.0, 4.0 * elements,
                                            splits=cast)))

    small = quantise_s(tokens * width)
    assert quantise_s((tokens + more) * width) > small
    assert small == pytest.approx(4 * H100.kernel_launch_us * 1e-6 + 6.0 * tokens * width
                                  / model.memory_rates["stream"], rel=1e-12)


def tp_amax_ops(ops):
    return [op for op in ops if op.name.startswith("tp_amax_")]


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_current_scaling_with_sp_all_reduces_four_amaxes_per_layer_closed_form(
        recompute: str) -> None:
    """TE release_v2.16 (``_customize_quantizers_float8_current_scaling``): with sequence
    parallelism the column-parallel inputs (QKV, MLP up) and the row-parallel output
    gradients (attention output, MLP down) share one scale over the TP group: one 4-byte
    MAX all-reduce each, before the tensor's cast (which waits for it) and, as TE
    quantises before gathering, before the SP all-gather, which still pairs with its GEMM."""
    s = make_scenario(system="eos", parallelism__tp=2, parallelism__pp=1,
                      parallelism__sequence_parallel=True, parallelism__recompute=recompute,
                      training__precision="fp8", training__fp8_scaling="current")
    forward, again, backward, _ = pass_ops(s.model, s.parallelism, s.training).dense
    fwd, bwd = tp_amax_ops(forward), tp_amax_ops(backward)
    assert (len(fwd), len(bwd)) == TP_AMAX_REDUCTIONS == (2, 2)
    assert [op.name for op in fwd] == ["tp_amax_qkv", "tp_amax_mlp_up"]
    assert [op.name for op in bwd] == ["tp_amax_mlp_down", "tp_amax_attn_proj"]
    for ops, reduced, gathers, suffix in ((forward, fwd, ("tp_ag_attn", "tp_ag_mlp"), ""),
                                          (backward, bwd, ("tp_ag_mlp_bwd", "tp_ag_attn_bwd"),
                                           "_b")):
        names = [op.name for op in ops]
        for op, gather in zip(reduced, gathers, strict=True):
            assert isinstance(op, CommOp) and op.collective == "all_reduce"
            assert op.axis == "tp" and op.bytes == AMAX_BYTES == 4 and op.phase in "FB"
            i = names.index(op.name)
            tensor = op.name.removeprefix("tp_amax_") + suffix
            assert names[i + 1] == gather and names[i + 2] == f"fp8_amax_{tensor}"
            assert _paired_gemm(tuple(ops), i + 1) is not None  # the gather still pairs
    # Full recompute runs the forward's quantisation again, reductions included.
    assert len(tp_amax_ops(again)) == (2 if recompute == "full" else 0)


@pytest.mark.parametrize("change", [
    {"training__fp8_scaling": "delayed"},
    {"parallelism__tp": 1},
    {"parallelism__sequence_parallel": False},
    {"training__precision": "bf16"},
])
def test_no_tp_amax_reduction_without_current_scaling_sp_and_tp(change: dict) -> None:
    settings_ = {"system": "eos", "parallelism__tp": 2, "parallelism__pp": 1,
                 "parallelism__sequence_parallel": True, "training__precision": "fp8",
                 "training__fp8_scaling": "current"} | change
    s = make_scenario(**settings_)
    forward, again, backward, _ = pass_ops(s.model, s.parallelism, s.training).dense
    assert not tp_amax_ops([*forward, *again, *backward])
