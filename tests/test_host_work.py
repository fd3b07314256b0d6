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


def test_the_accelerator_s_work_by_path():
    """``hugging_face`` takes all of it; ``modules`` FSDP's hooks only (its time per kernel
    holds the checkpoint's nodes); ``bare`` and CUDA graphs none."""
    h100 = load_spec("accelerators", "h100-sxm5-80gb")
    work = HostIssue.of(h100, False, "hugging_face").work
    assert (work.ckpt_node_s, work.fsdp_forward_s, work.fsdp_backward_s) == pytest.approx(
        (188.9e-6, 846.7e-6, 923.6e-6))
    assert HostIssue.of(h100, False, "modules").work == HostWork(
        0.0, work.fsdp_forward_s, work.fsdp_backward_s)
    assert HostIssue.of(h100, False, "bare").work == HostWork()
    assert HostIssue.of(h100, True, "hugging_face").work == HostWork()


def _marks(sc, path: str, **par) -> list[dict[str, str]]:
    sc = sc.model_copy(update={
        "parallelism": sc.parallelism.model_copy(update=par),
        "training": sc.training.model_copy(update={"host_path": path})})
    lists = pass_ops(sc.model, sc.parallelism, sc.training).dense
    return [{op.name: op.fsdp_hooks for op in ops if getattr(op, "fsdp_hooks", None)}
            for ops in lists]


def test_each_call_beyond_the_profile_s_carries_its_hooks():
    """FSDP1 runs a unit's hooks at each call of it. DistFlashAttn's patch (DFA24-19) calls
    a layer for its attention's projections, then from ``o_proj`` for the rest, in the
    forward and again in the recompute (the checkpoint is around the unit, so the
    recompute calls it), and its backward runs each call's pre- and post-backward hooks:
    ``modules``, whose time per kernel holds one forward and one backward hook set,
    marks the second forward call, both recompute calls and the second backward set;
    ``hugging_face`` marks them all. Hugging Face's checkpointing (DFA24-13): the
    recompute's one call; with the recompute not regathered (transformers 5.17's
    checkpoint inside the unit), nothing beyond the profile's."""
    from llmsim import validation as v
    runs = {r.id: r for r in v.load_runs() if r.id in ("DFA24-13", "DFA24-19")}
    patch, hf = v.scenario_for(runs["DFA24-19"]), v.scenario_for(runs["DFA24-13"])
    fwd, bwd = "forward", "backward"
    assert _marks(patch, "modules") == [
        {"attn_proj": fwd}, {"ln1": fwd, "attn_proj": fwd}, {"qkv_dx": bwd}, {}]
    assert _marks(patch, "hugging_face") == [
        {"ln1": fwd, "attn_proj": fwd}, {"ln1": fwd, "attn_proj": fwd},
        {"mlp_down_dx": bwd, "qkv_dx": bwd}, {}]
    assert _marks(hf, "modules") == [{}, {"ln1": fwd}, {}, {}]
    assert _marks(hf, "modules", regather_for_recompute=False) == [{}, {}, {}, {}]
    assert _marks(patch, "bare") == [{}, {}, {}, {}]


@pytest.mark.parametrize(("row", "forward_sets", "backward_sets"),
                         [("DFA24-19", 3, 1), ("DFA24-13", 1, 0)])
def test_a_step_s_further_hooks_add_up_to_the_calls_beyond_the_profile(row, forward_sets,
                                                                         backward_sets):
    """The host work a step's 32 layers carry under ``modules`` at the rows' hook times:
    DistFlashAttn's patch 3 forward sets (one forward call, two recompute calls) and one
    backward set a layer beyond the profile's, Hugging Face's checkpointing one forward
    set (its recompute's call)."""
    from llmsim import validation as v
    from llmsim.workload import build_workload
    sc = v.scenario_for(next(r for r in v.load_runs() if r.id == row))
    acc = sc.system.node.accelerator
    work = HostIssue.of(acc, False, sc.training.host_path).work
    chunk = build_workload(sc.model, sc.parallelism, sc.training, sc.dp).chunks[(0, 0)]
    total_s = sum(work.op_s(op) for op in (*chunk.forward, *chunk.backward, *chunk.weight))
    assert total_s == pytest.approx(32 * (forward_sets * acc.host_fsdp_forward_us
                                          + backward_sets * acc.host_fsdp_backward_us) * 1e-6,
                                    rel=1e-12)
