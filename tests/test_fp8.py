"""FP8 as Transformer Engine runs it: the cast(-transpose) and amax kernels around each
FP8 GEMM scale with the tensors they cast, and FP8 weights halve the weight gathers."""

from __future__ import annotations

import pytest
from helpers import make_scenario

from llmsim.errors import UserError
from llmsim.workload import build_workload, pass_ops

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
