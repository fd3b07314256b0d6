"""Hugging Face LLaMA's eager norms, rotary embedding and SwiGLU
(``training.pointwise_ops: hf_eager``, llmsim.workload.hf_eager): bytes and kernels per
chain as counted from transformers 4.31–4.35's code, the ops they replace, and the error for
a model that is not LLaMA-shaped."""

from __future__ import annotations

import pytest
from helpers import make_scenario
from test_cli import run_cli

from llmsim.ops import ComputeOp
from llmsim.workload.build import pass_ops
from llmsim.workload.hf_eager import CHAINS, REPLACED

LLAMA = {"model.norm": "rmsnorm", "model.position_embedding": "rope",
         "model.activation": "swiglu", "parallelism.tp": 1, "model.bias": False,
         "training.hidden_dropout": 0.0, "training.attention_dropout": 0.0}


def test_bytes_per_element_of_each_chain_in_fp16():
    """Closed forms at e = 2 (module docstring): RMSNorm 36 forward (6 + 8 + 4 + 8 + 6 + 4)
    and 76 backward; RoPE 20 and 30 per element of q or k; SwiGLU 10 and 18 per element of
    the intermediate."""
    got = {name: c.bytes_per_element(2) for name, c in CHAINS.items()}
    assert got == {"rmsnorm": 36, "rmsnorm_bwd": 76, "rope": 20, "rope_bwd": 30,
                   "swiglu": 10, "swiglu_bwd": 18}
    assert {name: c.kernels for name, c in CHAINS.items()} == {
        "rmsnorm": 8, "rmsnorm_bwd": 13, "rope": 12, "rope_bwd": 18, "swiglu": 2,
        "swiglu_bwd": 3}


def _dense(pointwise: str, recompute: str = "full"):
    sc = make_scenario(**LLAMA, **{"training.pointwise_ops": pointwise,
                                   "parallelism.recompute": recompute})
    return sc, pass_ops(sc.model, sc.parallelism, sc.training).dense


def test_the_chains_replace_the_fused_ops_and_add_the_rotary_embedding():
    sc, eager = _dense("hf_eager")
    _, fused = _dense("fused")
    e = 2 if sc.training.precision in ("bf16", "fp16") else 4
    tokens = sc.parallelism.micro_batch * sc.training.seq_len
    for fused_pass, eager_pass in zip(fused, eager, strict=True):
        f_ops = {op.name: op for op in fused_pass if isinstance(op, ComputeOp)}
        e_ops = {op.name: op for op in eager_pass if isinstance(op, ComputeOp)}
        for name, op in e_ops.items():
            if name in REPLACED:
                chain = CHAINS[REPLACED[name]]
                passes = {"ln1": 2, "ln2": 2, "act": 3}.get(name, 4)
                elements = f_ops[name].bytes / (passes * e)
                assert op.bytes == pytest.approx(elements * chain.bytes_per_element(e))
                assert op.splits == chain.kernels and op.phase == f_ops[name].phase
            elif name not in ("rope", "rope_bwd"):
                assert op == f_ops[name]  # GEMMs, attention, residual adds untouched
        assert set(e_ops) - set(f_ops) <= {"rope", "rope_bwd"}
    f, r, b, _ = (list(p) for p in eager)
    rope_elements = tokens * (sc.model.q_dim + sc.model.kv_dim)
    for ops, name, phase in ((f, "rope", "F"), (r, "rope", "R"), (b, "rope_bwd", "B")):
        rope = next(op for op in ops if getattr(op, "name", "") == name)
        assert rope.phase == phase
        assert rope.bytes == pytest.approx(rope_elements * CHAINS[name].bytes_per_element(e))
    names = [getattr(op, "name", "") for op in f]
    assert names.index("rope") == names.index("qkv") + 1
    names = [getattr(op, "name", "") for op in b]
    assert names.index("rope_bwd") == names.index("qkv_dx") - 1


def test_eager_is_slower_than_fused():
    from llmsim.simulation import simulate
    eager = simulate(make_scenario(**LLAMA, **{"training.pointwise_ops": "hf_eager"}))
    fused = simulate(make_scenario(**LLAMA, **{"training.pointwise_ops": "fused"}))
    assert eager.step_time_s > fused.step_time_s


def test_a_model_that_is_not_llama_shaped_is_refused_in_one_sentence(capsys):
    code, _, err = run_cli(["run", "selene-gpt3", "--set", "training.pointwise_ops=hf_eager"],
                           capsys)
    assert code == 2 and "Traceback" not in err
    assert "training.pointwise_ops: hf_eager is Hugging Face LLaMA's RMSNorm, RoPE and SwiGLU" \
        in " ".join(err.split())


def test_eager_swiglu_replaces_only_the_activation_and_keeps_the_rope_setting():
    """``eager_swiglu`` (torchtitan's Llama without torch.compile): ``act`` and ``act_bwd``
    become the two- and three-kernel chains of the table, the norms keep their fused ops,
    and the rotary embedding is the one ``training.rope`` names (not forced unfused)."""
    _, eager = _dense("eager_swiglu")
    _, fused = _dense("fused")
    e = 2
    for fused_pass, eager_pass in zip(fused, eager, strict=True):
        f_ops = {op.name: op for op in fused_pass if isinstance(op, ComputeOp)}
        e_ops = {op.name: op for op in eager_pass if isinstance(op, ComputeOp)}
        assert set(e_ops) == set(f_ops)
        for name, op in e_ops.items():
            if name in ("act", "act_bwd"):
                chain = CHAINS[REPLACED[name]]
                elements = f_ops[name].bytes / ({"act": 3}.get(name, 4) * e)
                assert op.bytes == pytest.approx(elements * chain.bytes_per_element(e))
                assert op.splits == chain.kernels
            else:
                assert op == f_ops[name]  # norms, RoPE, GEMMs untouched


def test_eager_swiglu_needs_a_swiglu_model(capsys):
    code, _, err = run_cli(["run", "selene-gpt3", "--set", "training.pointwise_ops=eager_swiglu"],
                           capsys)
    assert code == 2 and "Traceback" not in err
    assert "training.pointwise_ops: eager_swiglu is the SwiGLU" in " ".join(err.split())
