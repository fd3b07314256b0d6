"""A framework's host synchronisations per micro-batch (llmsim.host_syncs): Megatron-LM's
get_batch size read-back before the embedding's and the LM head's chunk, the loss's NaN
check, and the torch.cuda.synchronize() after each blocking pipeline exchange, each
priced as the measured gap HOST_SYNC_GAP_S."""

from __future__ import annotations

import pytest
from test_cli import run_cli, tiny_file

import llmsim
from llmsim import validation as v
from llmsim.costs import HardwareCosts
from llmsim.host_syncs import (
    HOST_SYNC_GAP_S,
    MASK_BYTES_PER_POSITION,
    batch_ops,
    exchange_sync_s,
    loss_ops,
)
from llmsim.plan import Plan
from llmsim.simulation import simulate
from llmsim.workload import build_workload

RUNS = {r.id: r for r in v.load_runs("ZB24")}


def _with(s: llmsim.Scenario, syncs: str, **par) -> llmsim.Scenario:
    return s.model_copy(update={
        "training": s.training.model_copy(update={"host_syncs": syncs}),
        "parallelism": s.parallelism.model_copy(update=par)})


def _names(ops) -> list[str]:
    return [op.name for op in ops]


@pytest.mark.parametrize("row", ["ZB24-T4-01", "ZB24-T4-13"])  # 1F1B, interleaved (v 3)
def test_get_batch_before_the_embedding_and_head_chunks_only(row):
    s = v.scenario_for(RUNS[row])
    assert s.training.host_syncs == "megatron_nan_check"
    w = build_workload(s.model, s.parallelism, s.training, s.dp)
    last = s.parallelism.pp * s.parallelism.virtual_stages - 1
    for chunk in w.chunks.values():
        names = _names(chunk.forward)
        ends = chunk.virtual_stage in (0, last)
        assert (names[0] == "batch_masks") is ends
        assert names.count("batch_masks") == int(ends)
        assert (names[-1] == "loss_nan_check") is (chunk.virtual_stage == last)
        assert "batch_masks" not in _names(chunk.backward + chunk.weight)
    masks = w.chunks[(0, 0)].forward[0]
    assert masks.bytes == MASK_BYTES_PER_POSITION * 1024 ** 2
    assert masks.host_s == HOST_SYNC_GAP_S


def test_none_adds_nothing_and_megatron_no_nan_check():
    s = v.scenario_for(RUNS["ZB24-T4-01"])
    none = _with(s, "none").training
    assert batch_ops(none) == () and loss_ops(none) == ()
    assert exchange_sync_s(none, s.parallelism) == 0.0
    megatron = _with(s, "megatron").training
    assert _names(batch_ops(megatron)) == ["batch_masks"] and loss_ops(megatron) == ()


@pytest.mark.parametrize(("pp", "overlap", "gap"), [
    (8, False, HOST_SYNC_GAP_S),  # Megatron's blocking, batched exchange synchronises
    (8, True, 0.0),               # overlapped (interleaved) or the Zero Bubble runtime
    (1, False, 0.0),              # no pipeline
])
def test_exchange_sync_only_with_blocking_pipeline_messages(pp, overlap, gap):
    s = v.scenario_for(RUNS["ZB24-T4-01"])
    par = s.parallelism.model_copy(update={"pp": pp, "overlap_pp_comm": overlap})
    assert exchange_sync_s(s.training, par) == gap


def test_one_stage_pays_the_ops_once_per_micro_batch():
    """pp 1, 4 micro-batches: the step grows by exactly four times the two ops' prices
    (the gaps and the mask kernels; no host-issue wait, every kernel outlasts the
    dispatch)."""
    s = _with(v.scenario_for(RUNS["ZB24-T4-01"]), "megatron_nan_check", pp=1,
              first_stage_layers=None, last_stage_layers=None)
    s = s.model_copy(update={
        "model": s.model.model_copy(update={"layers": 2}),
        "training": s.training.model_copy(update={"global_batch": 24})})
    costs = HardwareCosts.from_scenario(s, Plan.from_scenario(s))
    added = sum(costs.compute_s(op) for op in batch_ops(s.training) + loss_ops(s.training))
    with_syncs = simulate(s).step_time_s
    without = simulate(_with(s, "none")).step_time_s
    assert with_syncs - without == pytest.approx(4 * added, rel=1e-9)
    assert added > 2 * HOST_SYNC_GAP_S


@pytest.mark.parametrize(("row", "gap"), [("ZB24-T4-01", HOST_SYNC_GAP_S),
                                          ("ZB24-T4-13", 0.0)])
def test_each_blocking_send_lasts_the_gap_longer(row, gap):
    """Every pipeline send of the 1F1B row (blocking, batched) takes the gap more; the
    interleaved row's overlapped sends do not change."""
    s = v.scenario_for(RUNS[row])

    def sends(sc):
        return sorted(r.end_s - r.start_s for r in simulate(sc).trace.records
                      if r.name == "pp_send")

    with_syncs, without = sends(s), sends(_with(s, "none"))
    assert len(with_syncs) == len(without) > 0
    assert [a - b for a, b in zip(with_syncs, without, strict=True)] == pytest.approx(
        [gap] * len(without), abs=1e-12)


def test_an_unknown_value_is_one_sentence_and_exit_2(tmp_path, capsys):
    path = tiny_file(tmp_path, training__host_syncs="always")
    code, out, err = run_cli(["run", str(path)], capsys)
    assert code == 2
    assert "host_syncs" in out + err and "Traceback" not in out + err


def test_attention_syncs_hold_the_host_around_each_attention_and_nothing_else():
    """``training.host_syncs: attention``: each attention kernel of the forward, the
    recompute and the backward gets two gaps (a sync before, one after) and holds the host
    to its end; Megatron's batch and loss syncs and the pipeline's stay off."""
    from helpers import make_scenario

    from llmsim.host_syncs import HOST_SYNC_GAP_S, batch_ops, exchange_sync_s, loss_ops
    from llmsim.ops import ComputeOp
    from llmsim.workload.build import pass_ops

    sc = make_scenario(**{"training.host_syncs": "attention", "parallelism.recompute": "full"})
    dense = pass_ops(sc.model, sc.parallelism, sc.training).dense
    for ops in dense[:3]:  # forward, recompute, backward
        attention = [op for op in ops if isinstance(op, ComputeOp) and op.kind == "attention"]
        assert attention and all(op.host_held and op.host_s == pytest.approx(
            2 * HOST_SYNC_GAP_S) for op in attention)
        assert not any(getattr(op, "host_held", False) for op in ops if op not in attention)
    assert batch_ops(sc.training) == loss_ops(sc.training) == ()
    assert exchange_sync_s(sc.training, sc.parallelism) == 0.0
