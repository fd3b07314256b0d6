"""FP8 around the routed experts' grouped GEMMs (llmsim.moe_fp8, issue #41): the operands'
quantisation as Transformer Engine's ``GroupedLinear`` runs it (kernel counts, bytes, a split
quantisation priced as the sum of its per-expert parts, one host call) and Megatron-Core's
FP8 alignment copies of the routed rows; and DeepSeek-V3's FP8 dispatch, each token cast once
before its all-to-all (DSV3-01)."""

from __future__ import annotations

import pytest
from helpers import make_scenario
from hypothesis import given, settings
from hypothesis import strategies as st

from llmsim.costs.compute import ComputeModel
from llmsim.costs.host_issue import pass_waits_s
from llmsim.experts import expert_rows, routed_rows
from llmsim.loader import load_spec
from llmsim.moe_fp8 import FP8_ALIGN_ROWS, split_quantize_kernels
from llmsim.ops import ComputeOp
from llmsim.workload import build_workload

H100 = load_spec("accelerators", "h100-sxm5-80gb")
MOE = {"experts": 8, "top_k": 2, "ffn_hidden": 1024}
# (operand, phase, width): the up projection's input and the down projection's output
# gradient are h wide, the down projection's input the expert width f, the up
# projection's output gradient f, or 2f with SwiGLU's gate and up.
OPERANDS = (("expert_up", "forward", "h"), ("expert_down", "forward", "f"),
            ("expert_down_grad", "backward", "h"), ("expert_up_grad", "backward", "up"))


def expert_ops(scaling: str, activation: str = "gelu", ep: int = 2):
    """The first chunk's ops of a 4-expert-per-rank MoE model in FP8, EP ``ep``, TP 1."""
    s = make_scenario(system="eos", parallelism__pp=1, parallelism__tp=1, parallelism__ep=ep,
                      model__moe=MOE, model__activation=activation,
                      training__precision="fp8", training__fp8_scaling=scaling)
    work = build_workload(s.model, s.parallelism, s.training, s.dp)
    chunk = work.chunks[(0, 0)]
    return s, {"forward": chunk.forward, "backward": chunk.backward}


@pytest.mark.parametrize("local", [1, 4, 8, 32])
def test_kernel_counts_closed_form(local: int) -> None:
    """Current scaling: per expert a zero-fill and an amax kernel, a scale and a
    cast-transpose (4·local); delayed scaling: one fused multi-tensor cast-transpose."""
    amax, cast = split_quantize_kernels(local, "current")
    assert (amax, cast) == (2 * local, 2 * local) and amax + cast == 4 * local
    assert split_quantize_kernels(local, "delayed") == (0, 1)


@pytest.mark.parametrize("activation", ["gelu", "swiglu"])
@pytest.mark.parametrize("scaling", ["current", "delayed"])
def test_each_operand_is_quantised_with_its_bytes_and_kernels(scaling: str,
                                                             activation: str) -> None:
    s, ops = expert_ops(scaling, activation)
    assert s.model.activation == activation
    h, f = s.model.hidden, MOE["ffn_hidden"]
    local = MOE["experts"] // s.parallelism.ep
    widths = {"h": h, "f": f, "up": f * (2 if s.model.activation == "swiglu" else 1)}
    for operand, pass_name, width in OPERANDS:
        named = {op.name: op for op in ops[pass_name]}
        cast = named[f"fp8_cast_{operand}"]
        elements = routed_rows(s.model, s.parallelism, s.training) * widths[width]
        assert cast.bytes == pytest.approx(4.0 * elements)  # read 2, write 1 + 1
        assert cast.host_calls == 1
        if scaling == "current":
            amax = named[f"fp8_amax_{operand}"]
            assert amax.bytes == pytest.approx(2.0 * elements)  # one more 16-bit read
            assert amax.splits == cast.splits == 2 * local
            names = [op.name for op in ops[pass_name]]
            assert names.index(amax.name) < names.index(cast.name)
        else:
            assert f"fp8_amax_{operand}" not in named and cast.splits == 1


def test_bf16_quantises_nothing() -> None:
    s = make_scenario(system="eos", parallelism__pp=1, parallelism__tp=1, parallelism__ep=2,
                      model__moe=MOE)
    work = build_workload(s.model, s.parallelism, s.training, s.dp)
    assert not any(op.name.startswith("fp8_") for op in work.chunks[(0, 0)].ops)


@settings(max_examples=40, deadline=None)
@given(local=st.integers(1, 32), rows=st.integers(128, 16384), width=st.sampled_from(
    [768, 1536, 2048, 4096, 7168]))
def test_split_quantisation_is_the_sum_of_its_per_expert_parts(local: int, rows: int,
                                                                width: int) -> None:
    """Priced whole (one op of ``4·local`` kernels over all the bytes), a current-scaling
    split quantisation takes exactly as long as its ``local`` experts' quantisations
    priced one by one (each a zero-fill, an amax, a scale and a cast of its own block)."""
    model = ComputeModel(H100, "fp8")
    amax_k, cast_k = split_quantize_kernels(local, "current")
    elements = local * rows * width
    whole = (model.compute_s(ComputeOp("amax", "memory", "F", 0.0, 2.0 * elements,
                                       splits=amax_k))
             + model.compute_s(ComputeOp("cast", "memory", "F", 0.0, 4.0 * elements,
                                         splits=cast_k)))
    one_amax, one_cast = split_quantize_kernels(1, "current")
    parts = local * (model.compute_s(ComputeOp("amax", "memory", "F", 0.0,
                                               2.0 * rows * width, splits=one_amax))
                     + model.compute_s(ComputeOp("cast", "memory", "F", 0.0,
                                                 4.0 * rows * width, splits=one_cast)))
    assert whole == pytest.approx(parts, rel=1e-12)
    launch = H100.kernel_launch_us * 1e-6
    assert whole - 4 * local * launch == pytest.approx(6.0 * elements / model.memory_rates[
        "stream"], rel=1e-12)


def test_one_host_call_issues_a_split_quantisation() -> None:
    """The host queue counts a C++ loop of ``splits`` kernels as the one dispatch that
    issues them: with ``host_calls`` 1 it waits as one short kernel does, not as 32."""
    interval = 30e-6
    looped = ComputeOp("cast", "memory", "F", 0.0, 1.0, splits=32, host_calls=1)
    single = ComputeOp("cast", "memory", "F", 0.0, 1.0)
    eager = ComputeOp("cast", "memory", "F", 0.0, 1.0, splits=32)
    gemm = ComputeOp("gemm", "memory", "F", 0.0, 1.0)
    durations = [20e-6, 100e-6]
    assert (pass_waits_s([looped, gemm], durations, interval)
            == pass_waits_s([single, gemm], durations, interval))
    assert sum(pass_waits_s([eager, gemm], durations, interval)) > sum(
        pass_waits_s([looped, gemm], durations, interval))


PADDING = ("expert_pad", "expert_unpad", "expert_unpad_bwd", "expert_pad_bwd")


def padding_ops(**overrides):
    """A scenario (FP8, EP 2, the all-to-all dispatcher unless overridden) and its first
    chunk's alignment copies by name."""
    settings = {"system": "eos", "parallelism__pp": 1, "parallelism__tp": 1,
                "parallelism__ep": 2, "model__moe": MOE, "training__precision": "fp8"}
    s = make_scenario(**(settings | overrides))
    work = build_workload(s.model, s.parallelism, s.training, s.dp)
    chunk = work.chunks[(0, 0)]
    ops = {op.name: op for op in (*chunk.forward, *chunk.backward)
           if op.name.startswith(PADDING)}
    return s, ops


def test_fp8_alignment_copies_of_the_routed_rows_closed_form() -> None:
    """Megatron-Core's Fp8Padding / Fp8Unpadding under the all-to-all dispatcher: four
    copies a layer of the R routed rows of h (read and write, 2 bytes each), and the
    FP32 probabilities padded forward and unpadded backward (4 bytes a row, twice)."""
    s, ops = padding_ops()
    rows = routed_rows(s.model, s.parallelism, s.training)
    h = s.model.hidden
    assert set(ops) == {*PADDING, "expert_pad_probs", "expert_pad_bwd_probs"}
    for name in PADDING:
        assert ops[name].bytes == pytest.approx(2 * 2.0 * rows * h)
    for name in ("expert_pad_probs", "expert_pad_bwd_probs"):
        assert ops[name].bytes == pytest.approx(2 * 4.0 * rows)


@pytest.mark.parametrize("overrides", [
    {"parallelism__moe_dispatcher": "hybridep"},  # HybridEP pads in its dispatch
    {"training__precision": "bf16"},
    {"model__moe": MOE | {"capacity_factor": 1.0}},  # a multiple of 16 rows an expert
])
def test_no_alignment_copies_where_megatron_core_skips_them(overrides) -> None:
    s, ops = padding_ops(**overrides)
    if s.model.moe.capacity_factor is not None:
        assert expert_rows(s.model, s.parallelism, s.training)[1] % FP8_ALIGN_ROWS == 0
    assert not ops


def test_a_capacity_off_the_alignment_is_padded() -> None:
    s, ops = padding_ops(model__moe=MOE | {"capacity_factor": 1.01})
    assert expert_rows(s.model, s.parallelism, s.training)[1] % FP8_ALIGN_ROWS != 0
    assert set(ops) >= set(PADDING)


def dsv3_ops(top_k: int, cache: bool = True):
    """The first chunk's ops of the 8-expert model in FP8 with current scaling, EP 2, TP 1,
    with or without DeepSeek-V3's FP8 dispatch (``training.fp8_activation_cache``)."""
    s = make_scenario(system="eos", parallelism__pp=1, parallelism__tp=1, parallelism__ep=2,
                      model__moe={**MOE, "top_k": top_k}, training__precision="fp8",
                      training__fp8_scaling="current", training__fp8_activation_cache=cache)
    chunk = build_workload(s.model, s.parallelism, s.training, s.dp).chunks[(0, 0)]
    return s, {"forward": chunk.forward, "backward": chunk.backward, "weight": chunk.weight}


@pytest.mark.parametrize("top_k", [1, 2, 4])
def test_dsv3_casts_each_token_once_before_its_fp8_all_to_all(top_k: int) -> None:
    """DeepSeek-V3 §3.3.3: the up-projections' input is cast to FP8 before the dispatch and
    the down-projections' output gradient before the combine's gradient all-to-all, once
    a token (``T·h`` values, whatever ``top_k``), one kernel reading 2 and writing
    ``1 + 4/128`` bytes a value; the weight gradients re-quantise the received ``R × h``
    rows transposed (§3.5.2, ``2·(1 + 4/128)`` bytes a value). The casts of the expert-side
    operands (the down projection's input, the up projection's output gradient) keep
    Transformer Engine's per-expert split."""
    s, ops = dsv3_ops(top_k)
    h, local = s.model.hidden, MOE["experts"] // s.parallelism.ep
    tokens = s.parallelism.micro_batch * s.training.seq_len  # T_s: TP 1, no CP
    rows = routed_rows(s.model, s.parallelism, s.training)  # R
    e8 = 1 + 4 / 128
    for operand, pass_name, before in (("expert_up", "forward", "moe_dispatch"),
                                       ("expert_down_grad", "backward", "moe_combine_bwd")):
        names = [op.name for op in ops[pass_name]]
        cast = ops[pass_name][names.index(f"fp8_cast_{operand}")]
        assert cast.bytes == pytest.approx((2 + e8) * tokens * h)
        assert (cast.splits, cast.host_calls) == (1, 1)
        assert f"fp8_amax_{operand}" not in names
        assert names.index(cast.name) < names.index(before)
        assert names.count(cast.name) == s.model.layers  # one a layer, none after the a2a
        requant = next(op for op in ops["weight"] if op.name == f"fp8_requant_{operand}")
        assert requant.bytes == pytest.approx(2 * e8 * rows * h)
        assert (requant.phase, requant.splits) == ("W", 1)
    for operand, pass_name in (("expert_down", "forward"), ("expert_up_grad", "backward")):
        named = {op.name: op for op in ops[pass_name]}
        assert named[f"fp8_cast_{operand}"].splits == 2 * local
        assert named[f"fp8_amax_{operand}"].splits == 2 * local


def test_dsv3_cast_moves_fewer_bytes_than_the_per_expert_one_from_top_2() -> None:
    """With ``top_k ≥ 2`` the dispatch's routed rows outnumber the tokens: the token-side
    cast, even with its transposed re-quantisation, moves fewer bytes than Transformer
    Engine's split quantisation of the routed rows (amax read 2, cast-transpose 4 bytes)."""
    def fp8_bytes(ops: dict, operand: str) -> float:
        return sum(op.bytes for pass_ops in ops.values() for op in pass_ops
                   if op.name.endswith(f"_{operand}") and op.name.startswith("fp8_"))
    for top_k in (2, 4):
        _, new = dsv3_ops(top_k)
        _, old = dsv3_ops(top_k, cache=False)
        for operand in ("expert_up", "expert_down_grad"):
            assert fp8_bytes(new, operand) < fp8_bytes(old, operand)


def test_without_the_fp8_dispatch_nothing_is_cast_per_token() -> None:
    """The Megatron-Core / Transformer Engine path (no ``fp8_activation_cache``, every
    MBRIDGE row) keeps its per-expert casts after the dispatch and gets no re-quantisation."""
    _, ops = dsv3_ops(2, cache=False)
    names = [op.name for pass_ops in ops.values() for op in pass_ops]
    assert not any(n.startswith("fp8_requant_") for n in names)
    fwd = [op.name for op in ops["forward"]]
    assert fwd.index("moe_dispatch") < fwd.index("fp8_amax_expert_up") < fwd.index(
        "fp8_cast_expert_up")
