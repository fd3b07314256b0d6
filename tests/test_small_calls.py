"""The small collectives of a micro-batch outside the layers (llmsim.workload.small_calls):
Megatron-LM's vocab-parallel cross-entropy all-reduces, ``broadcast_data``'s broadcasts and
the loss's average, counted as the code makes them."""

from __future__ import annotations

import pytest
from helpers import make_scenario

from llmsim.costs import HardwareCosts
from llmsim.loader import load_scenario
from llmsim.ops import CommOp
from llmsim.plan import Plan
from llmsim.simulation import simulate
from llmsim.validation import load_runs
from llmsim.validation.scenarios import scenario_mapping
from llmsim.workload import build_workload

SMALL = ("loss_tp", "loss_tp_max", "loss_tp_predicted", "loss_tp_sum_exp",
         "batch_sizes_bcast", "batch_bcast", "loss_average")


def _workload(small_calls: str, **extra):
    s = make_scenario(training__small_calls=small_calls, **extra)
    return s, build_workload(s.model, s.parallelism, s.training, s.dp)


def _calls(chunk) -> list[CommOp]:
    return [op for op in chunk.ops if isinstance(op, CommOp) and op.name in SMALL]


def test_megatron_tp4_makes_six_small_calls_a_microbatch_at_their_sizes():
    """TP 4, one stage: three cross-entropy all-reduces of one FP32 value a token,
    the sizes' broadcast (5 int64) and the tokens' (b·(s + 1) int64), the loss's
    all-reduce over the data-parallel group (one FP32 value)."""
    b, s = 2, 512
    _, work = _workload("megatron_mpu", parallelism__tp=4, parallelism__pp=1,
                        parallelism__micro_batch=b, training__seq_len=s)
    (chunk,) = work.chunks.values()
    calls = [(op.name, op.collective, op.axis, op.bytes) for op in _calls(chunk)]
    assert sorted(calls) == sorted([
        ("loss_tp_max", "all_reduce", "tp", 4.0 * b * s),
        ("loss_tp_predicted", "all_reduce", "tp", 4.0 * b * s),
        ("loss_tp_sum_exp", "all_reduce", "tp", 4.0 * b * s),
        ("batch_sizes_bcast", "broadcast", "tp", 8.0 * 5),
        ("batch_bcast", "broadcast", "tp", 8.0 * b * (s + 1)),
        ("loss_average", "all_reduce", "dp", 4.0),
    ])
    assert all(op.phase == "F" for op in _calls(chunk))


def test_tp1_makes_no_tensor_parallel_small_call():
    _, work = _workload("megatron_mpu", parallelism__tp=1, parallelism__pp=1)
    (chunk,) = work.chunks.values()
    assert [op.name for op in _calls(chunk) if op.axis == "tp"] == []
    assert [op.name for op in _calls(chunk)] == ["loss_average"]


def test_broadcasts_before_every_chunk_and_the_loss_calls_on_the_last():
    """Megatron-LM 2021's ``forward_step`` calls ``get_batch`` on every stage and chunk;
    the cross-entropy and the loss's average run where the LM head is."""
    _, work = _workload("megatron_mpu", parallelism__tp=2, parallelism__pp=4)
    for chunk in work.chunks.values():
        names = [op.name for op in _calls(chunk)]
        head = ["loss_tp_max", "loss_tp_predicted", "loss_tp_sum_exp", "loss_average"]
        assert names[:2] == ["batch_sizes_bcast", "batch_bcast"]
        assert chunk.forward[:2] == tuple(op for op in _calls(chunk)[:2])  # first in the pass
        assert names[2:] == (head if chunk.last else [])


def test_lumped_keeps_one_all_reduce_of_three_values_a_token():
    b, s = 1, 256
    _, work = _workload("lumped", parallelism__tp=4, parallelism__pp=1,
                        parallelism__micro_batch=b, training__seq_len=s)
    (chunk,) = work.chunks.values()
    assert [(op.name, op.bytes) for op in _calls(chunk)] == [("loss_tp", 12.0 * b * s)]


def test_megatron_2020_averages_the_loss_over_every_rank():
    _, work = _workload("megatron_2020", parallelism__tp=2, parallelism__pp=1)
    (chunk,) = work.chunks.values()
    (average,) = [op for op in _calls(chunk) if op.name == "loss_average"]
    assert average.axis == "stage"
    (sizes,) = [op for op in _calls(chunk) if op.name == "batch_sizes_bcast"]
    assert sizes.bytes == 8.0 * 4  # _MAX_DATA_DIM 4 in September 2020


def test_fugaku_dev14_counts_the_56_calls_of_deepspeedfugaku():
    """DeepSpeedFugaku at 8e0eabb, one micro-batch of FUGAKU-DEV-14 (12 layers, TP 4):
    4 TP all-reduces a layer, the embedding's and the head's input gradient's, the
    cross-entropy's three, two broadcasts and the loss's average: 56 (llmsim counted 51)."""
    run = next(r for r in load_runs("FUGAKU-DEV") if r.id == "FUGAKU-DEV-14")
    sc = load_scenario(scenario_mapping(run))
    assert sc.training.small_calls == "megatron_mpu"
    work = build_workload(sc.model, sc.parallelism, sc.training, sc.dp)
    (chunk,) = work.chunks.values()
    assert sum(isinstance(op, CommOp) for op in chunk.ops) == 4 * sc.model.layers + 2 + 6


def test_the_calls_add_their_priced_time_to_every_microbatch():
    """Blocking calls on the stream: on a one-stage layout, where nothing overlaps them,
    the step grows by the calls' price less the lumped all-reduce's, every micro-batch
    (within 0.5 %: without a pipeline each forward starts with the host's queue empty, so
    the extra calls' launches from the host show too, 0.13 µs a micro-batch here)."""
    layout = {"parallelism__tp": 4, "parallelism__pp": 1, "parallelism__dp": 2}
    lumped, megatron = make_scenario(**layout), make_scenario(
        training__small_calls="megatron_mpu", **layout)
    result, base = simulate(megatron), simulate(lumped)
    costs = HardwareCosts.from_scenario(megatron, Plan.from_scenario(megatron))
    (chunk,) = result.workload.chunks.values()
    (old,) = [op for op in base.workload.chunks[(0, 0)].ops if op.name == "loss_tp"]
    added_s = sum(costs.comm_s(op) for op in _calls(chunk)) - costs.comm_s(old)
    assert added_s > 0
    assert result.step_time_s - base.step_time_s == pytest.approx(
        added_s * result.workload.microbatches, rel=5e-3)


@pytest.mark.parametrize("row", ["FUGAKU-DEV-14", "NAR21-T1-06"])
def test_the_search_estimator_prices_the_calls_as_the_engine_within_a_thousandth(row):
    """The estimator reads the head's calls (``PassOps.head``) and the batch's broadcasts
    before each chunk (``PassOps.batch_input``) from the same ops as the engine
    (docs/cost-models.md, "Small calls outside the layers"): within 1e-3 on both rows, and
    the broadcasts add to the estimate what they add to the engine's step. The host syncs
    are left out here (the estimator does not price the sync after each pipeline
    exchange; the syncs before every chunk, which it does, are checked below)."""
    from llmsim.search.estimate import Estimator
    run = next(r for r in load_runs() if r.id == row)
    steps = {}
    for calls in ("lumped", "megatron_mpu"):
        sc = load_scenario(scenario_mapping(run), [f"training.small_calls={calls}",
                                                   "training.host_syncs=none"])
        engine = simulate(sc).step_time_s
        estimate = Estimator().estimate(sc).step_time_s
        assert estimate == pytest.approx(engine, rel=1e-3)
        steps[calls] = (estimate, engine)
    (est_lumped, eng_lumped), (est_mpu, eng_mpu) = steps["lumped"], steps["megatron_mpu"]
    assert est_mpu > est_lumped
    assert est_mpu - est_lumped == pytest.approx(eng_mpu - eng_lumped, rel=0.05)


def test_deepspeed_pipe_broadcasts_on_the_first_and_last_stages_only():
    """DeepSpeed's ``TrainSchedule`` loads a micro-batch (``get_batch_pipe``) on the first
    and last stages; the loss is averaged once a step, not a micro-batch."""
    _, work = _workload("megatron_deepspeed_pipe", parallelism__tp=2, parallelism__pp=4)
    for chunk in work.chunks.values():
        names = [op.name for op in _calls(chunk)]
        broadcasts = ["batch_sizes_bcast", "batch_bcast"] if chunk.first or chunk.last else []
        head = ["loss_tp_max", "loss_tp_predicted", "loss_tp_sum_exp"] if chunk.last else []
        assert names == broadcasts + head


def test_the_search_estimator_prices_the_syncs_before_every_chunk():
    """Megatron-LM 2020-21's read-back and masks before every chunk ride with the batch's
    broadcasts (``PassOps.batch_input``), so the estimator prices them as the engine does:
    NAR21-T1-06 without the exchange syncs within 1e-3, and the syncs add to the estimate
    what they add to the engine's step."""
    from llmsim.search.estimate import Estimator
    run = next(r for r in load_runs() if r.id == "NAR21-T1-06")
    steps = {}
    for syncs in ("none", "megatron_every_chunk_no_exchange_sync"):
        sc = load_scenario(scenario_mapping(run), [f"training.host_syncs={syncs}"])
        steps[syncs] = Estimator().estimate(sc).step_time_s, simulate(sc).step_time_s
        assert steps[syncs][0] == pytest.approx(steps[syncs][1], rel=1e-3)
    (est_none, eng_none) = steps["none"]
    (est_sync, eng_sync) = steps["megatron_every_chunk_no_exchange_sync"]
    assert est_sync - est_none == pytest.approx(eng_sync - eng_none, rel=0.05)
    assert eng_sync > eng_none


CORE_BATCH = ("batch_tokens_bcast", "batch_labels_bcast", "batch_loss_mask_bcast",
              "batch_attention_mask_bcast", "batch_position_ids_bcast")


@pytest.mark.parametrize(("calls", "mask"), [("megatron_core", True),
                                             ("megatron_core_no_mask", False)])
def test_megatron_core_one_stage_broadcasts_each_batch_tensor(calls, mask):
    """Megatron-Core's ``get_batch_on_this_tp_rank`` at pp 1 (f2e5db402c): tokens, labels
    and position ids (b·s int64), the loss mask (b·s FP32) and, unless
    ``--no-create-attention-mask-in-dataloader``, the b·s² bool mask, one broadcast
    each; no size broadcast; the loss and its token count averaged over dp."""
    b, s = 2, 512
    _, work = _workload(calls, parallelism__tp=4, parallelism__pp=1,
                        parallelism__micro_batch=b, training__seq_len=s)
    (chunk,) = work.chunks.values()
    got = {op.name: (op.collective, op.axis, op.bytes) for op in chunk.ops
           if isinstance(op, CommOp) and op.name in (*CORE_BATCH, "loss_average")}
    want = {"batch_tokens_bcast": ("broadcast", "tp", 8.0 * b * s),
            "batch_labels_bcast": ("broadcast", "tp", 8.0 * b * s),
            "batch_loss_mask_bcast": ("broadcast", "tp", 4.0 * b * s),
            "batch_position_ids_bcast": ("broadcast", "tp", 8.0 * b * s),
            "loss_average": ("all_reduce", "dp", 8.0)}
    if mask:
        want["batch_attention_mask_bcast"] = ("broadcast", "tp", 1.0 * b * s * s)
    assert got == want
    assert not any(op.name in ("batch_sizes_bcast", "batch_bcast") for op in chunk.ops)


def test_megatron_core_broadcasts_before_the_end_chunks_only():
    """With a pipeline, ``get_batch`` returns early on the middle stages: the first and
    last chunks get three broadcasts each (tokens, mask, position ids), the others none."""
    _, work = _workload("megatron_core", parallelism__tp=2, parallelism__pp=4)
    last = max(c.virtual_stage for c in work.chunks.values())
    for chunk in work.chunks.values():
        names = [op.name for op in chunk.forward if op.name in CORE_BATCH]
        ends = chunk.virtual_stage in (0, last)
        assert names == (["batch_tokens_bcast", "batch_attention_mask_bcast",
                          "batch_position_ids_bcast"] if ends else [])


def test_megatron_bridge_makes_one_cross_entropy_all_gather_and_nothing_else():
    """Megatron-Bridge's performance scripts run Transformer Engine's parallel
    cross-entropy: one TP all-gather of three FP32 values a token from each rank (the
    gathered output: 12·T·tp bytes); no batch broadcast, no loss average a micro-batch."""
    b, s, tp = 2, 512, 4
    _, work = _workload("megatron_bridge", parallelism__tp=tp, parallelism__pp=1,
                        parallelism__micro_batch=b, training__seq_len=s)
    (chunk,) = work.chunks.values()
    small = [(op.name, op.collective, op.axis, op.bytes) for op in chunk.ops
             if isinstance(op, CommOp) and op.name.startswith(("loss_", "batch_"))]
    assert small == [("loss_tp_gather", "all_gather", "tp", 12.0 * b * s * tp)]


def test_nemo_reduces_the_loss_over_context_then_data_parallel_ranks():
    """NeMo 24.03's ``loss_func``: the loss all-reduced over the context-parallel group,
    then averaged over the data-parallel group (one FP32 value each); the
    cross-entropy's three TP all-reduces; no batch broadcast."""
    _, work = _workload("nemo", parallelism__tp=2, parallelism__pp=1,
                        parallelism__cp=2)
    (chunk,) = work.chunks.values()
    small = [(op.name, op.axis, op.bytes) for op in chunk.ops
             if isinstance(op, CommOp) and op.name.startswith(("loss_", "batch_"))]
    names = [n for n, _, _ in small]
    assert names.count("loss_tp_max") == names.count("loss_tp_sum_exp") == 1
    assert ("loss_cp", "cp", 4.0) in small and ("loss_average", "dp", 4.0) in small
    assert names.index("loss_cp") == names.index("loss_average") - 1
    assert not any(n.startswith("batch_") for n in names)
