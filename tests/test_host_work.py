"""Hugging Face's framework work on the host, priced per op (``training.host_path:
hugging_face``; :mod:`llmsim.workload.host_work`, :class:`llmsim.costs.host_issue.HostWork`):
which ops carry it, and how the host's queue takes it."""

from __future__ import annotations

import pytest
from test_hf_llama_host import one_h100

from llmsim.costs.host_issue import HostIssue, HostWork, pass_queue
from llmsim.loader import load_spec
from llmsim.ops import ComputeOp
from llmsim.workload import pass_ops


def _layer(path: str, recompute: str = "full", zero: int = 0):
    sc = one_h100(16, recompute, path, zero=zero)
    return pass_ops(sc.model, sc.parallelism, sc.training).dense


def test_a_checkpointed_llama_layer_has_seven_backward_matmul_nodes():
    """Hugging Face's Llama: q, k, v (llmsim's ``qkv_dx``), o, gate and up (``mlp_up_dx``,
    SwiGLU) and down; only on the ``hugging_face`` path and under full recompute."""
    forward, _, backward, weight = _layer("hugging_face")
    nodes = {op.name: op.ckpt_nodes for op in backward if op.ckpt_nodes}
    assert nodes == {"qkv_dx": 3, "attn_proj_dx": 1, "mlp_up_dx": 2, "mlp_down_dx": 1}
    assert not any(op.ckpt_nodes for op in (*forward, *weight))
    assert not any(op.ckpt_nodes for op in _layer("hugging_face", "none")[2])
    assert not any(op.ckpt_nodes for ops in _layer("modules") for op in ops)


def test_fsdp_hooks_open_a_unit_s_forward_and_backward_under_zero3_only():
    forward, recompute, backward, _ = _layer("hugging_face", zero=3)
    assert [op.fsdp_hooks for op in forward] == ["forward"] + [None] * (len(forward) - 1)
    assert [op.fsdp_hooks for op in backward] == ["backward"] + [None] * (len(backward) - 1)
    assert not any(op.fsdp_hooks for op in recompute)  # the board's transformers 5.17
    assert not any(op.fsdp_hooks for ops in _layer("hugging_face") for op in ops)
    assert not any(op.fsdp_hooks or op.ckpt_nodes
                   for ops in _layer("modules", zero=3) for op in ops)


def test_the_queue_charges_the_work_before_the_op():
    """Two short kernels issued 10 µs apart: the second, carrying 2 nodes of 100 µs and a
    unit's backward hooks of 500 µs, waits 10 + 200 + 500 µs less the first's 1 µs."""
    a = ComputeOp("a", "memory", "B", 0.0, 0.0)
    b = ComputeOp("b", "gemm", "B", 0.0, 0.0, ckpt_nodes=2, fsdp_hooks="backward")
    work = HostWork(ckpt_node_s=100e-6, fsdp_backward_s=500e-6)
    waits, _ = pass_queue([a, b], [1e-6, 1e-6], 10e-6, 0.0, 0.0, work)
    assert waits == pytest.approx([0.0, 709e-6])
    assert pass_queue([a, b], [1e-6, 1e-6], 10e-6)[0] == pytest.approx([0.0, 9e-6])


def test_only_the_hugging_face_path_takes_the_accelerator_s_work():
    h100 = load_spec("accelerators", "h100-sxm5-80gb")
    work = HostIssue.of(h100, False, "hugging_face").work
    assert (work.ckpt_node_s, work.fsdp_forward_s, work.fsdp_backward_s) == pytest.approx(
        (188.9e-6, 846.7e-6, 923.6e-6))
    assert HostIssue.of(h100, False, "modules").work == HostWork()
    assert HostIssue.of(h100, True, "hugging_face").work == HostWork()
