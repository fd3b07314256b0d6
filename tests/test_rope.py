"""The rotary embedding on q and k (llmsim.workload.rope): one fused memory-bound kernel on
q and one on k each pass (``training.rope: fused``), or the eager chain
(``unfused``, and always under ``pointwise_ops: hf_eager``); nothing for other position
embeddings."""

from __future__ import annotations

import pytest
from helpers import make_scenario

from llmsim.ops import ComputeOp
from llmsim.simulation import simulate
from llmsim.workload.build import pass_ops
from llmsim.workload.hf_eager import CHAINS

ROPE = {"model.norm": "rmsnorm", "model.position_embedding": "rope",
        "model.activation": "swiglu", "model.bias": False, "parallelism.tp": 2,
        "parallelism.recompute": "full", "training.hidden_dropout": 0.0,
        "training.attention_dropout": 0.0}


def _passes(**overrides):
    sc = make_scenario(**{**ROPE, **overrides})
    return sc, [list(p) for p in pass_ops(sc.model, sc.parallelism, sc.training).dense]


def _named(ops, name):
    return [op for op in ops if isinstance(op, ComputeOp) and op.name == name]


def test_fused_rope_reads_and_writes_q_and_k_once_per_pass():
    sc, (f, r, b, w) = _passes(**{"training.rope": "fused"})
    e = 2
    elements = sc.parallelism.micro_batch * sc.training.seq_len * (
        sc.model.q_dim + sc.model.kv_dim) / sc.parallelism.tp
    for ops, name, phase in ((f, "rope", "F"), (r, "rope", "R"), (b, "rope_bwd", "B")):
        (rope,) = _named(ops, name)
        assert (rope.kind, rope.phase, rope.splits) == ("memory", phase, 2)
        assert rope.bytes == pytest.approx(2 * e * elements)
    assert not _named(w, "rope") and not _named(w, "rope_bwd")
    names = [getattr(op, "name", "") for op in f]
    assert names.index("rope") == names.index("qkv") + 1
    names = [getattr(op, "name", "") for op in b]
    assert names.index("rope_bwd") == names.index("qkv_dx") - 1


def test_unfused_rope_is_the_eager_chain_and_hf_eager_always_runs_it():
    _, unfused = _passes(**{"training.rope": "unfused"})
    _, hf = _passes(**{"training.rope": "fused", "training.pointwise_ops": "hf_eager"})
    for passes in (unfused, hf):
        (fwd,) = _named(passes[0], "rope")
        (bwd,) = _named(passes[2], "rope_bwd")
        assert (fwd.splits, bwd.splits) == (CHAINS["rope"].kernels, CHAINS["rope_bwd"].kernels)
        assert fwd.bytes / bwd.bytes == pytest.approx(10 / 15)


def test_no_rotary_op_without_rope():
    _, passes = _passes(**{"model.position_embedding": "learned"})
    assert not any(_named(p, "rope") or _named(p, "rope_bwd") for p in passes)


def test_unfused_is_slower_than_fused_and_fused_slower_than_none():
    none = simulate(make_scenario(**{**ROPE, "model.position_embedding": "learned"}))
    fused = simulate(make_scenario(**{**ROPE, "training.rope": "fused"}))
    unfused = simulate(make_scenario(**{**ROPE, "training.rope": "unfused"}))
    assert none.step_time_s < fused.step_time_s < unfused.step_time_s


def test_complex_rope_is_three_kernels_on_q_and_on_k_with_an_fp32_round_trip():
    """torchtitan's ``apply_rotary_emb``: the upcast (e + 4 bytes an element), the complex
    product (4 + 4) and the cast back (4 + e) on q and on k, the same in the backward:
    6 kernels and 2e + 16 = 20 bytes an element of q and k at e = 2, each pass."""
    sc, (f, r, b, _) = _passes(**{"training.rope": "complex"})
    elements = sc.parallelism.micro_batch * sc.training.seq_len * (
        sc.model.q_dim + sc.model.kv_dim) / sc.parallelism.tp
    for ops, name in ((f, "rope"), (r, "rope"), (b, "rope_bwd")):
        (rope,) = _named(ops, name)
        assert rope.splits == 6
        assert rope.bytes == pytest.approx(20 * elements)
        assert rope.output_bytes == pytest.approx(2 * elements)


def test_complex_rope_sits_between_fused_and_unfused():
    fused = simulate(make_scenario(**{**ROPE, "training.rope": "fused"}))
    complex_ = simulate(make_scenario(**{**ROPE, "training.rope": "complex"}))
    unfused = simulate(make_scenario(**{**ROPE, "training.rope": "unfused"}))
    assert fused.step_time_s < complex_.step_time_s < unfused.step_time_s
