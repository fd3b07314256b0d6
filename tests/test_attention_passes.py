"""FlashAttention-2's forward and backward at their own measured rates
(``flash_attention_fwd_tflops`` / ``_bwd_tflops``, llmsim.costs.flash_curve.flash_pass_flops),
with the combined forward + backward curve as the fallback beyond the shapes they timed."""

from __future__ import annotations

import pytest
from helpers import make_scenario
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from llmsim.costs.compute import ComputeModel
from llmsim.costs.flash_curve import flash_attention_flops, flash_pass_flops
from llmsim.loader import load_spec
from llmsim.specs import Accelerator
from llmsim.workload import LayerBuilder

A100: Accelerator = load_spec("accelerators", "a100-sxm4-80gb")


def test_inside_the_timed_shapes_each_pass_is_its_own_curve():
    # Dao 2023 Figs. 5d and 6d, causal, head dim 128, 2k: forward 187, backward 145 TFLOP/s
    fwd, bwd, both = (A100.flash_attention_fwd_tflops, A100.flash_attention_bwd_tflops,
                      A100.flash_attention_tflops)
    assert flash_pass_flops(both, fwd, 2048, 128) == pytest.approx(187e12)
    assert flash_pass_flops(both, bwd, 2048, 128) == pytest.approx(145e12)
    # beyond 8k: the combined curve at 16k (189) times the pass's ratio to it at 8k
    assert flash_pass_flops(both, fwd, 16384, 128) == pytest.approx(189e12 * 200 / 182)
    # head dim 64 (no per-pass panel transcribed): the head-dim-128 ratio on the 64 curve
    assert flash_pass_flops(both, bwd, 4096, 64) == pytest.approx(156e12 * 165 / 173)
    # no per-pass curve: the combined one
    assert flash_pass_flops(both, None, 4096, 64) == flash_attention_flops(both, 4096, 64)


@pytest.mark.parametrize("name", ["a100-sxm4-80gb", "a100-sxm4-40gb"])
def test_the_passes_reproduce_the_combined_curve(name):
    """The benchmark's forward + backward rate is 3.5 / (1/fwd + 2.5/bwd) (the backward
    executes 2.5x the forward's FLOPs): the per-pass bars give the combined bars of the
    same figure set within 1.1 % at every length they share."""
    acc = load_spec("accelerators", name)
    both = acc.flash_attention_tflops
    for seq, fwd in acc.flash_attention_fwd_tflops[128].items():
        bwd = acc.flash_attention_bwd_tflops[128][seq]
        assert 3.5 / (1 / fwd + 2.5 / bwd) == pytest.approx(both[128][seq], rel=0.011)


@given(seq=st.integers(min_value=256, max_value=1 << 18),
       head_dim=st.integers(min_value=32, max_value=256))
def test_the_forward_is_faster_and_the_backward_slower_than_combined(seq, head_dim):
    both = A100.flash_attention_tflops
    combined = flash_attention_flops(both, seq, head_dim)
    assert flash_pass_flops(both, A100.flash_attention_fwd_tflops, seq, head_dim) > combined
    assert flash_pass_flops(both, A100.flash_attention_bwd_tflops, seq, head_dim) < combined


def test_forward_and_recompute_ops_run_at_the_forward_rate_and_backward_at_the_backward():
    sc = make_scenario(**{"model.hidden": 4096, "model.heads": 32, "model.max_seq_len": 2048,
                          "training.seq_len": 2048, "parallelism.tp": 1,
                          "training.global_batch": 16, "parallelism.recompute": "full"})
    fwd, rec, bwd, _ = LayerBuilder(sc.model, sc.parallelism, sc.training).layer()
    flash = ComputeModel(A100, "fp16", attention_kernel="flash")
    flash1 = ComputeModel(A100, "fp16", attention_kernel="flash1")
    for op in (o for o in [*fwd, *rec] if o.kind == "attention"):
        assert flash.attention_math_s(op) == pytest.approx(op.executed_flops / 187e12)
    b = next(o for o in bwd if o.kind == "attention")
    assert flash.attention_math_s(b) == pytest.approx(b.executed_flops / 145e12)
    # flash1's ratio to FlashAttention-2 was timed forward + backward: it keeps the combined
    assert flash1.flash_passes == {}


def test_a_forward_curve_without_a_backward_one_is_refused():
    raw = A100.model_dump()
    raw["flash_attention_bwd_tflops"] = None
    with pytest.raises(ValidationError, match="flash_attention_fwd_tflops and "
                                              "flash_attention_bwd_tflops go together"):
        Accelerator.model_validate(raw)
