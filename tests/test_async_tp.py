"""parallelism.async_tp_allreduce: Megatron-LM's backward TP all-reduce of a
column-parallel layer's input gradient, overlapped with the layer's weight gradient."""

from __future__ import annotations

import pytest
from helpers import make_scenario

from llmsim import simulate
from llmsim.blocks import Block, exposed_overlap_s
from llmsim.costs import HardwareCosts
from llmsim.errors import UserError
from llmsim.plan import Plan
from llmsim.workload import pass_ops

COLUMN_PARALLEL_BWD = {"tp_mlp_bwd", "tp_attn_bwd"}


def backward(async_ar: bool):
    s = make_scenario(parallelism__tp=8, parallelism__pp=1,
                      parallelism__async_tp_allreduce=async_ar)
    return s, pass_ops(s.model, s.parallelism, s.training).dense[2]


def test_column_parallel_input_gradients_are_all_reduced_beside_the_weight_gradient() -> None:
    _, ops = backward(True)
    marked = {op.name for op in ops if getattr(op, "beside_weight_grad", False)}
    assert marked == COLUMN_PARALLEL_BWD
    _, plain = backward(False)
    assert not any(getattr(op, "beside_weight_grad", False) for op in plain)


def test_the_overlap_hides_the_all_reduce_behind_a_gemm_of_the_same_size() -> None:
    s, ops = backward(True)
    _, plain = backward(False)
    costs = HardwareCosts.from_scenario(s, Plan.from_scenario(s))
    hidden, blocking = Block.of(tuple(ops), costs), Block.of(tuple(plain), costs)
    for i, op in enumerate(ops):
        if op.name in COLUMN_PARALLEL_BWD:
            comm, gemm = costs.comm_s(op), costs.compute_s(ops[i - 1])
            assert ops[i - 1].kind == "gemm"
            saved = comm - exposed_overlap_s(comm, gemm, 1)
            assert saved == pytest.approx(min(comm, gemm))
    assert hidden.tp_s < blocking.tp_s and hidden.compute_s == blocking.compute_s


def test_the_step_is_no_longer_and_the_switch_needs_no_sequence_parallelism() -> None:
    base = simulate(make_scenario(parallelism__tp=8, parallelism__pp=1))
    overlapped = simulate(make_scenario(parallelism__tp=8, parallelism__pp=1,
                                        parallelism__async_tp_allreduce=True))
    assert overlapped.step_time_s < base.step_time_s
    with pytest.raises(UserError, match="async_tp_allreduce"):
        make_scenario(parallelism__tp=2, parallelism__sequence_parallel=True,
                      parallelism__async_tp_allreduce=True)
