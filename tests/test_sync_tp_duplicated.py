"""parallelism.sync_tp_duplicated_parameters: Megatron-DeepSpeed's
``--sync-tp-duplicated-parameters``, an AVG all-reduce over the TP group of every layer
norm's weight and bias and every row-parallel bias in each forward (TurkuNLP fork at
6732bc9, ``megatron/model/fused_layer_norm.py``, ``megatron/mpu/layers.py``)."""

from __future__ import annotations

import pytest
from helpers import make_scenario

from llmsim import simulate
from llmsim.costs import HardwareCosts
from llmsim.ops import CommOp
from llmsim.plan import Plan
from llmsim.workload import pass_ops


def _ops(**overrides):
    s = make_scenario(parallelism__pp=1, **overrides)
    return s, pass_ops(s.model, s.parallelism, s.training).dense


def _syncs(ops) -> list[CommOp]:
    return [op for op in ops if op.name.startswith("tp_sync_")]


def test_six_hidden_vectors_a_block_a_forward_and_again_when_recomputed() -> None:
    s, (fwd, rec, bwd, wgt) = _ops(parallelism__tp=4, parallelism__recompute="full",
                                   parallelism__sync_tp_duplicated_parameters=True)
    synced = _syncs(fwd)
    assert len(synced) == 6
    assert all(op.collective == "all_reduce" and op.axis == "tp" and op.phase == "F"
               for op in synced)
    assert {op.bytes for op in synced} == {s.model.hidden * 2.0}  # BF16 parameters
    assert [op.phase for op in _syncs(rec)] == ["R"] * 6
    assert not _syncs(bwd) and not _syncs(wgt)
    _, (off_fwd, off_rec, _, _) = _ops(parallelism__tp=4, parallelism__recompute="full")
    assert [op for op in fwd if op not in synced] == list(off_fwd) and not _syncs(off_rec)


def test_only_what_exists_is_synced() -> None:
    """An RMSNorm has no bias and a bias-free model no row-parallel bias: one all-reduce
    per norm; a TP group of one has nothing to sync."""
    _, (fwd, _, _, _) = _ops(parallelism__tp=4, model__norm="rmsnorm", model__bias=False,
                             parallelism__sync_tp_duplicated_parameters=True)
    assert len(_syncs(fwd)) == 2
    _, (fwd, _, _, _) = _ops(parallelism__tp=1, parallelism__sync_tp_duplicated_parameters=True)
    assert not _syncs(fwd)


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_the_step_grows_by_the_blocking_all_reduces(recompute: str) -> None:
    """On one stage every sync blocks the compute stream: the step grows by exactly the
    micro-batches × (6 a block, 6 more when recomputed, 2 at the final norm) all-reduces
    of a hidden vector."""
    base = make_scenario(parallelism__tp=4, parallelism__pp=1, parallelism__recompute=recompute)
    synced = make_scenario(parallelism__tp=4, parallelism__pp=1, parallelism__recompute=recompute,
                           parallelism__sync_tp_duplicated_parameters=True)
    plan = Plan.from_scenario(synced)
    costs = HardwareCosts.from_scenario(synced, plan)
    one_s = costs.comm_s(CommOp("x", "all_reduce", "tp", "F", synced.model.hidden * 2.0))
    microbatches = synced.training.global_batch // (synced.parallelism.micro_batch * plan.dp)
    layers = synced.model.layers
    calls = microbatches * (6 * layers * (2 if recompute == "full" else 1) + 2)
    grown = simulate(synced).step_time_s - simulate(base).step_time_s
    assert one_s > 0 and microbatches > 1
    assert grown == pytest.approx(calls * one_s, rel=1e-6)
