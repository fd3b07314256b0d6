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


@pytest.mark.parametrize(("schedule", "v"), [("1f1b", 1), ("interleaved-1f1b", 2)])
@pytest.mark.parametrize("syncs", ["megatron", "megatron_every_chunk",
                                   "megatron_every_chunk_no_exchange_sync"])
def test_get_batch_syncs_per_step_in_closed_form(syncs, schedule, v):
    """Megatron-LM 2020-21 reads the batch's sizes back before every chunk's forward: a
    step of m micro-batches on pp stages of v chunks makes pp·v·m syncs (each with its
    masks), where the Zero Bubble fork's ``megatron`` makes 2m (the embedding's chunk and
    the head's). The exchange sync goes with ``megatron`` and ``megatron_every_chunk``."""
    from helpers import make_scenario

    pp, dp, m = 4, 1, 4
    sc = make_scenario(**{"training.host_syncs": syncs, "parallelism.schedule": schedule,
                          "parallelism.virtual_stages": v, "parallelism.tp": 2,
                          "parallelism.pp": pp, "training.global_batch": m})
    assert sc.dp == dp and sc.parallelism.micro_batch == 1
    every = syncs != "megatron"
    w = build_workload(sc.model, sc.parallelism, sc.training, sc.dp)
    masks = [op for c in w.chunks.values() for op in c.forward if op.name == "batch_masks"]
    assert len(w.chunks) == pp * v and w.microbatches == m
    assert len(masks) * w.microbatches == (pp * v * m if every else 2 * m)
    assert all(op.host_s == HOST_SYNC_GAP_S for op in masks)
    blocking = not sc.parallelism.overlap_pp_comm
    gap = HOST_SYNC_GAP_S if syncs != "megatron_every_chunk_no_exchange_sync" and blocking \
        else 0.0
    assert exchange_sync_s(sc.training, sc.parallelism) == gap


ROW_SYNCS = {
    "NAR21-T1-05": ("megatron_every_chunk", "megatron_mpu"),        # de7dc40
    "NAR21-T2-09": ("megatron_every_chunk", "megatron_mpu"),        # de7dc40, PTD-P
    "NAR21-T2-03": ("megatron_every_chunk_no_exchange_sync", "megatron_2020"),  # ZeRO-3
    "MEGREADME-2101-05": ("megatron_every_chunk_no_exchange_sync", "megatron_mpu"),  # 1b8e289
    "MEGREADME-2009-A100-2": ("megatron_every_chunk_no_exchange_sync", "megatron_2020"),
    "MEGREADME-2009-V100-3": ("megatron_every_chunk_no_exchange_sync", "megatron_2020"),
    "FUGAKU-DEV-1": ("none", "megatron_mpu"),  # a CPU: .cpu() of a CPU tensor, no drain
    "ZB24-T4-01": ("megatron_nan_check", "lumped"),
    "MEGREADME-H100-01": ("megatron_core", "megatron_core"),  # f2e5db402c
    "MEGREADME-H100-07": ("megatron_core", "megatron_core"),
    "MBRIDGE-2511-H100-01": ("none", "megatron_bridge"),  # Megatron-Bridge 97ad8cc6f
    "MBRIDGE-2604-MOE-01": ("none", "megatron_bridge"),  # 21d102f5e
    "NEMOLS-2403-01": ("megatron_p2p_sync", "nemo"),  # NeMo v1.23.0, mcore 0.5.0
    "MLPERF-v3.0-NVIDIA-n512": ("none", "nemo"),  # NeMo v1.17.0_pt_23.04, apex
}


@pytest.mark.parametrize("row", sorted(ROW_SYNCS))
def test_each_megatron_family_reads_back_its_syncs(row):
    """Each row family's ``host_syncs`` and ``small_calls``, as choices.yaml sets them
    from the fork's code (the reasons there cite repository, commit and file)."""
    run = next(r for r in v.load_runs() if r.id == row)
    sc = v.scenario_for(run)
    assert (sc.training.host_syncs, sc.training.small_calls) == ROW_SYNCS[row]


def test_every_chunk_of_a_2021_pipeline_row_pays_the_sync():
    """NAR21-T1-05 (pp > 1, Megatron-LM de7dc40): every chunk's forward starts with the
    batch's broadcasts, then the read-back and its masks, and every blocking send takes
    the gap."""
    run = next(r for r in v.load_runs("NAR21-T1") if r.id == "NAR21-T1-05")
    sc = v.scenario_for(run)
    assert sc.parallelism.pp > 1 and not sc.parallelism.overlap_pp_comm
    w = build_workload(sc.model, sc.parallelism, sc.training, sc.dp)
    for chunk in w.chunks.values():
        names = _names(chunk.forward)
        assert names.count("batch_masks") == 1
        assert names.index("batch_masks") == names.index("batch_bcast") + 1
    assert w.pp_exchange_host_s == HOST_SYNC_GAP_S


def test_megatron_core_reads_the_loss_twice_and_not_the_batch():
    """Megatron-Core (f2e5db402c): no read-back of the batch; after the LM head's forward
    the NaN check and ``num_tokens.item()``, each a gap, on the last chunk only: 2m host
    reads a step of m micro-batches; the exchange sync as for ``megatron``."""
    from helpers import make_scenario

    m = 4
    sc = make_scenario(**{"training.host_syncs": "megatron_core", "parallelism.tp": 2,
                          "parallelism.pp": 4, "training.global_batch": m})
    w = build_workload(sc.model, sc.parallelism, sc.training, sc.dp)
    reads = [(c.virtual_stage, op.name) for c in w.chunks.values() for op in c.forward
             if op.name.startswith(("loss_nan", "loss_tokens", "batch_masks"))]
    assert sorted(reads) == [(3, "loss_nan_check"), (3, "loss_tokens_item")]
    assert len(reads) * w.microbatches == 2 * m
    assert all(op.host_s == HOST_SYNC_GAP_S for op in loss_ops(sc.training))
    assert exchange_sync_s(sc.training, sc.parallelism) == HOST_SYNC_GAP_S


def test_megatron_p2p_sync_is_the_exchange_sync_alone():
    """NeMo 24.03 on Megatron-Core 0.5.0: no batch read-back, no loss read, the sync after
    each blocking batched exchange."""
    from helpers import make_scenario

    sc = make_scenario(**{"training.host_syncs": "megatron_p2p_sync", "parallelism.pp": 4})
    w = build_workload(sc.model, sc.parallelism, sc.training, sc.dp)
    assert not any(op.host_s for c in w.chunks.values() for op in c.forward)
    assert batch_ops(sc.training) == loss_ops(sc.training) == ()
    assert w.pp_exchange_host_s == HOST_SYNC_GAP_S
