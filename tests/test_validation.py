"""Validation against published, measured runs (docs/validation.md).

The suite's plumbing (rows, choices, scenarios), the sources' FLOP conventions checked
against the sources' own arithmetic (BLOOM log line, Megatron-LM README Sep-2020,
Megatron-Core's FLOP formula), the ``llmsim validate`` command, and llmsim's accuracy on
the target set: NAR21 Tables 1-2, Megatron-LM README 2020 and 2024 (H100 rows 01-09),
BLOOM iteration times, MLPerf v3.0 H100, Zero Bubble Table 4.
"""

from __future__ import annotations

import dataclasses
import math

import pandas as pd
import pytest
from test_cli import run_cli

from llmsim import validation as v
from llmsim.workload import build_workload

RUNS = v.load_runs()
BY_ID = {r.id: r for r in RUNS}
FAST_IDS = [
    "MEGREADME-2009-V100-1",
    "MEGREADME-2009-A100-2",
    "MEGREADME-2009-A100DP-4",
    "MEGREADME-H100-01",
    "MEGREADME-H100-04",
    "BLOOM-02",
    "BLOOM-03",
    "VOCABPP-T5-05",
    "NAR21-T1-03",
    "NAR21-T2-02",
]
# Current accuracy on the target set (the measured MAPE, rounded up): the number
# may only fall. It rose from 17.0 % as stated settings became expressible and removed
# errors of the opposite sign: BLOOM's and ZB24's layer split (first and last stage
# lighter, was rounded-up layer counts; 18.6 %), MEGREADME-H100's --tp-comm-overlap and
# --overlap-param-gather (19.6 %) and MLPerf's TP comm overlap (20.1 %). NAR21 Table 2's
# ZeRO-3 rows with DeepSpeed's synchronous weight gathers of the time (no prefetch)
# brought it to 17.55 %, the cross-entropy's FP32 traffic counted kernel by kernel from
# Megatron's code to 16.78 % and the residual stream's backward (attention-branch dropout
# backward, autograd's gradient sums) to 16.34 %, the tied word embedding's gradient
# all-reduce to 16.24 %, Megatron-LM's separate bias kernels to 15.76 %, the legacy
# flash-attention layout copies to 15.46 %, and DeepSpeed-2021 ZeRO-3's second gather for
# the recompute, per-module gathers and tensor-list copies to 14.50, 13.84 and 12.19 %,
# BLOOM's all-reduced gradients to 12.10 %, and ZeRO-3's gradients all-reduced through
# DeepSpeed's fallback (contiguous_gradients off), with its three staging copies, to
# 11.52 %; H100 GEMM fractions fitted to GEMMs measured at training shapes (FP8 up from
# MAMF's best of sweep, making MLPerf more too fast) raised it to 11.62 %; Transformer
# Engine's TP overlap as it runs (GEMMs in ring-exchange and pipeline chunks, SMs held by
# the transfers) brought it to 9.72 %; NCCL's own per-step latencies (tuning.cc hwLat,
# Ring/Simple) in place of the unverified 2 us / 1 us-per-hop priors to 9.29 %; the
# H100 Megatron-Core rows on cuDNN's fused attention, which Transformer Engine selects on
# Hopper (faster than FlashAttention-2, so those too-fast rows got faster), raised it to
# 9.46 %; DeepSpeed 2021's per-rank Python loop before each ZeRO-3 gather (3.9 us per rank,
# measured by benchmarks/bench_host_loop.py) lowered it to 8.76 %; the MLPerf rows' own
# settings (pipeline sends overlapped, as the submission's run_and_time.sh sets, where the
# blocking sends had stood in for unmodelled time; BF16 gradient reduction) raised it to
# 9.18 %; the zero-fill of each ZeRO-3 gather's buffer (DeepSpeed 2021's torch.zeros)
# lowered it to 9.06 %; pipeline sends between stages on one node priced on the fabric (they
# had all been network transfers, hiding time missing on every Zero Bubble row) raised it
# to 10.26 %; sends between stages on one node of a pipeline that spans nodes limited to
# NCCL's two channels per network peer (one NVLink's worth) lowered it to 9.59 % and
# reproduce all 12 Zero Bubble schedule orders; FlashAttention-2 priced by sequence length
# and head dimension on A100 lowered it to 9.23 %, the word embedding's dense gradient to
# 9.19 %; each micro-batch's gradients added to the buffer as the frameworks of the runs
# did it (Megatron-LM 2021's autograd adds in FP16, DeepSpeed BF16_Optimizer's FP32
# cast-adds; the large NAR21 rows, already too slow, became slower) raised it to 9.48 %;
# the collectives of the 2021-era NVIDIA systems priced per algorithm and protocol by
# NCCL's own tuner model (its tree latencies and bandwidth caps, LL and LL128, the ring's
# plateau) lowered it to 9.23 %; cuDNN's H100 attention at its causal forward rate to
# 9.22 %; the H100 GEMM library's 128x128 tiles and split-K, checked against OpenXLA's
# H100 GEMMs measured by shape (Transformer Engine's 512-row chunks had been priced 2-4x
# too slow, standing in for time the pipelined H100 rows lack) raised it to 9.90 %; the
# ZeRO-3 host time before each gather timed on the software of 2021 (Python 3.9.2, PyTorch
# 1.8.1, faster than today's: 2.4 us per rank where today's 3.9 had been used) raised it to
# 10.13 %; the host time of each of those gathers that does not grow with the ranks
# (325 us per call, from a 2021 profile of DeepSpeed 0.3.16) lowered it to 10.09 %; the
# SMs NCCL's channels hold on the H100 rows while a data-parallel collective runs beside
# the compute (16, from NCCL's log on a multi-node 8-H100 cluster) to 9.94 %; each gradient
# bucket reduced as soon as the last backward makes it final, not after the whole pass
# (PyTorch DDP's and Megatron-Core's bucket hooks: MEGREADME-H100-03 -11.2 -> +0.6 %, the
# small H100 rows and NAR21-T1's DDP rows, now without exposed reductions, further off)
# raised it to 10.04 %; Megatron-LM 2021's scatter/gather of pipeline messages (each TP
# rank sends 1/t on its own NIC, the receivers all-gather over NVLink; NAR21-T1-09
# -8.9 -> -2.2 %) lowered it to 9.83 %; DeepSpeed's pipeline engine slicing BLOOM's
# messages the same way (its whole-activation sends had hidden missing time: BLOOM-01
# -0.8 -> -4.7 %, BLOOM-02 -19.1 -> -21.2 %) raised it to 9.90 %; the LM head's SP all-gather
# blocking (not a Transformer Engine module) brought it to 9.89 %; Megatron-LM 2020-21 local
# DDP reducing through a flattened copy (three passes) to 9.87 %; each run's dropout as it
# set it (the hidden-dropout masks counted, MLPerf's runs without dropout) to 9.77 %; the
# Zero Bubble rows configured from the authors' script of the paper's time (unfused
# attention, tied embeddings, the interleaved and ZB-1p runtimes' overlapped sends) to
# 8.06 %, which reproduces 8 of the 12 schedule orders (12 with the 2024 script's flash
# attention and blocking sends): the interleaved rows are 4-7 % too fast, the cost of the
# communication the paper names for them not modelled (docs/validation.md); MLPerf's weight
# all-gather overlapped with the next forward, as its run_and_time.sh sets, to 8.09 %, and
# its TP overlap as its own userbuffers file sets it (fewer SMs held beside the backward's
# GEMMs, so MLPerf's too-fast rows got faster) raised it to 8.23 %; the SMs that the
# interleaved schedule's posted sends and receives hold beside the forward and
# input-gradient passes, where the next stage is on another node (NCCL's 2 channels per
# network peer), lowered it to 8.16 % and brought a ninth schedule order (ZB24 14.6B,
# batch 128); Eos's collectives priced as NCCL's 2024 tuner prices them to 8.15 %, and
# the FP8 amax all-reduces that end each chunk's forward and backward in the MLPerf runs
# to 8.05 %; each framework's optimizer step as its code of the time ran it (Megatron-LM
# 2021's FP16 passes, 2020's per-tensor overflow checks and norms waited for on the host,
# Megatron-Core's and DeepSpeed's zeroed gradient buffers) to 7.85 %, under the goal's 8 %,
# and Megatron-Core's DDP as its code runs it, each bucket's NaN check and 1/dp scaling on
# the compute stream before its reduction and, on the pipelined rows, each chunk's
# reductions issued where its grad_sync_func issues them, to 7.81 %; the MLPerf rows' q, k, v
# layout copies of Transformer Engine's 2023 FlashAttention wrapper to 7.77 %, with twelve
# rows still worse than 20 % and 9 of the 12 schedule orders. The overlapped interleaved
# pipeline's sends and receives as PyTorch and NCCL run them (each posted on the pair's own
# communicator, holding its channels' SMs until the peer posts; a send between neighbours
# on one node no longer limited to the 2 channels of a group that spans nodes) left the
# MAPE at 7.76 % and took the order to 8 of 12: the limit had stood in for time the
# 14.6B interleaved rows spend elsewhere. Each step waiting for the previous step's send
# of its direction, as Megatron-LM's schedule waits on all of a step's requests, to 7.65 %.
# The H100's sustained clocks under its 700 W limit (GEMMs at 1,350 / 1,230 MHz, measured)
# and its measured streaming bandwidth, to 6.76 %, with seven rows worse than 20 %. The
# MLPerf rows' FP8 as run (GEMM rates measured by shape, weights cast once per step, TE
# 0.8's per-module amax updates) moved them by -0.1 ... +0.2 points: 6.7631 %. Norms and
# their backward at their measured rates on the H100 and the A100 80 GB (and the H100's
# fused Adam; memory_fraction_by_kind), to 6.6422 %; the MLPerf rows' flash attention at
# its rate measured on the H100 at their shape (flash_attention_measured), to 6.5968 %.
# NAR21 Table 2's ZeRO-3 gradients in DeepSpeed's whole-matrix buckets (each weight matrix
# all-reduced alone, as its 2021 stage3.py fills them; was equal 1 GB buckets), to 6.7116 %:
# the 530B rows make fewer, larger calls and are faster still. The MLPerf rows' amax history
# as the submission's config_fp8.sh states it (1,024, max), to 6.6946 %.
# The H100's attention at its rates measured by shape (2026-11-27: FlashAttention-2 and
# cuDNN apart; the old flash table had been cuDNN's kernel), to 6.4691 %.
# The H100's device time per eager kernel measured (2.6 us, was an unverified 4; compute
# kernels and collectives' launches) and the host's issue as a queue (no target row
# exposes it: their kernels outlast the 9.1 us dispatch), to 6.5739 %: the H100 rows got
# 0.3-1.5 % faster, most of them already too fast.
# The MLPerf rows' attention as flash-attn 1.0.5, which their submission pins, priced at
# the board's FlashAttention-2 rate over the two kernels' ratio in the FlashAttention-2
# paper's H100 figure (training.attention_kernel: flash1), to 6.0065 %: the five rows from
# -9.7 ... -12.0 % to -0.5 ... -2.1 %.
# NCCL's per-channel LL128 ring ceiling (ll128MaxBwPerCh x the ring graph's 8 channels on
# Selene's DGX A100, tuning.cc) on the NAR21-T2 ZeRO-3 rows' gathers and all-reduces, to
# 5.7495 %: the six rows from +9.0 ... +62.6 % to +7.0 ... +55.0 %.
# Jean Zay's Omni-Path at the per-HFI rate BigScience's all-reduce benchmark measured with
# the run's own environment (network.efficiency 0.408, was an unverified 0.9), to 5.6001 %:
# BLOOM-01 -3.9 -> +2.0 %, BLOOM-02 -20.7 -> +9.8 %.
# DeepSpeed 2021 ZeRO-3's persistent biases and norms gathered back after every optimizer
# step by _allgather_params's Python loop, one copy_ per parameter and rank
# (parallelism.persistent_regather), to 5.0192 %: NAR21-T2-01..06 from +7.0 ... +55.0 % to
# +4.4 / +15.8 / +18.7 / +17.5 / +21.4 / +41.5 %.
# The A100's GEMMs on cuBLAS's 128x256 and 128x128 Tensor Core tiles beside 256x128 (NVIDIA's
# Matrix Multiplication Background guide; gemm.extra_tiles), to 6.1085 % on its own (over the
# 6 % goal):
# the ZB24 14.6B rows' M = 1,024 projections, two waves at 74 % on 256x128, fill three at 99 %
# and their middle stage now matches the paper's per-pass profile (30.9 against 30.7 ms,
# was 34.4), which leaves those rows too fast (1F1B +5.9 -> -4.4 %, interleaved -3.1 ->
# -12.3 %): the GEMMs had stood in for time missing elsewhere. Physics, not tuned.
# Both on merged main (2026-11-27): 5.5226 %; NAR21-T2-05/-06 still worse than 20 %.
# ALiBi as the BigScience Megatron-DeepSpeed adds it (torch.baddbmm copies the bias into
# the scores, which the GEMM reads back; model.position_embedding: alibi), to 5.5360 %:
# BLOOM-01/-02/-03 +1.2 / +9.3 / -6.2 -> +1.9 / +9.7 / -6.6 %. Physics, not tuned.
# NCCL 2.7-2.17's proxy posting every step of a ring across nodes, which their tuner did not
# count (network.ring_post_us on Selene, NCCL 2.18's getNetOverhead figure), and the
# rest of 2026-11-27 on merged main: 5.4494 %; NAR21-T2-05 +21.4 -> +18.8 %, -06 +41.1 %,
# the one row still worse than 20 %.
# Megatron-LM's small calls outside the layers counted from its code (training.small_calls:
# the cross-entropy's three TP all-reduces, broadcast_data's two broadcasts, the loss
# average; docs/cost-models.md), to 5.4542 %: tens of microseconds a micro-batch, no row
# moving by more than 0.08 points. Physics, not tuned.
# Megatron-LM 2020-21's get_batch read-back before every chunk's forward and de7dc40's
# torch.cuda.synchronize() after every pipeline exchange (training.host_syncs:
# megatron_every_chunk / _no_exchange_sync, read at c63906a, 1b8e289, de7dc40), to
# 5.4713 %: NAR21-T1 and PTD-P NAR21-T2 pipeline rows 0.1-0.5 points slower (the
# negative ones further out), MEGREADME-2009 +0.01. Megatron-Core's small calls and
# host reads for MEGREADME-H100 (f2e5db402c) and NeMo 1.17's for MLPERF-v3.0, both
# rows that were too fast: 5.4589, then 5.4536 %. Physics, not tuned.
# See docs/validation.md for the per-source discussion.
TARGET_MAPE_CEILING_PCT = 5.46
ZB24_ORDERS_REPRODUCED = 9


@pytest.fixture(scope="module")
def target() -> dict[str, v.Prediction]:
    """Every target-set row predicted once (the slow part of this module, ~50 s)."""
    return {r.id: v.predict(r) for r in RUNS if r.target}


def _frame(predictions: dict[str, v.Prediction]) -> pd.DataFrame:
    """The DataFrame :func:`validate` builds, from predictions already made."""
    return pd.DataFrame([v.predictions._record(p) for p in predictions.values()])


# ---------------------------------------------------------------- rows and choices


def test_rows_are_the_published_ones_with_a_full_layout():
    assert len(RUNS) == len(BY_ID) == 186
    assert {r.source for r in RUNS} == {
        "NAR21-T1",
        "NAR21-T2",
        "MEGREADME-2101",
        "MEGREADME-2009",
        "MEGREADME-H100",
        "BLOOM",
        "ZB24",
        "VOCABPP",
        "FUGAKU-DEV",
        "MLPERF-v3.0",
        "LUMI23",
        "MBRIDGE-2511",
        "MBRIDGE-2604",
        "MBRIDGE-2511-MOE",
        "MBRIDGE-2604-MOE",
        "AURORA26",
        "FRONTIER25",
        "LUMIRF25",
        "FRONTIER24",
        "DSV3",
        "NEMOLS",
        "XMOE25",
        "DFA24",
        "DSMOE22",
    }
    for r in RUNS:
        tp, pp, dp = (int(r.row[k]) for k in ("tp", "pp", "dp"))
        cp = int(r.row["cp"] or 1)  # Megatron-Core's count: the row's dp excludes cp
        assert tp * pp * cp * dp == r.gpus, r.id
        assert r.metric in v.METRICS and r.measured > 0, r.id
        assert r.row["source"] and r.row["verified"] == "yes", r.id


def test_every_choice_gives_a_reason_and_the_values_llmsim_needs():
    needed = {
        "system",
        "flops_convention",
        "vocab_pad_multiple",
        "training.precision",
        "training.attention_kernel",
        "parallelism.recompute",
        "parallelism.zero",
        "parallelism.schedule",
        "parallelism.sequence_parallel",
        "parallelism.overlap_dp_comm",
        "parallelism.overlap_pp_comm",
    }
    for r in RUNS:
        assert needed <= set(r.choices), (r.id, needed - set(r.choices))
        assert all(len(c.why) > 10 for c in r.choices.values()), r.id
        if r.metric == "mfu":
            assert r.value("peak_tflops") is not None, r.id


def test_target_set_is_the_issue_s():
    ids = {r.id for r in RUNS if r.target}
    assert {i for i in ids if i.startswith("BLOOM")} == {"BLOOM-01", "BLOOM-02"}
    assert sum(i.startswith("MEGREADME-H100-0") for i in ids) == 9
    assert sum(i.startswith("ZB24") for i in ids) == 36
    assert not any(i.startswith(("VOCABPP", "FUGAKU", "MEGREADME-2101", "LUMI23")) for i in ids)
    assert len(ids) == 10 + 12 + 12 + 9 + 2 + 36 + 5


def test_every_row_is_a_valid_scenario_on_the_run_s_devices():
    for r in RUNS:
        s = v.scenario_for(r)
        assert s.devices == r.gpus, r.id
        multiple = int(r.value("vocab_pad_multiple"))  # 128, or 1 where nothing pads
        assert s.model.vocab % (multiple * s.parallelism.tp) == 0, r.id
        assert multiple == 128 or not r.target, r.id
        assert s.model.vocab >= v.base_vocab(r), r.id
        assert s.training.global_batch == int(r.row["global_batch"]), r.id


def test_megatron_vocabulary_padding():
    assert v.padded_vocab(50257, 128, 8) == 51200
    assert v.padded_vocab(250680, 128, 4) == 250880  # BLOOM's released vocab_size
    assert v.padded_vocab(50304, 128, 4) == 50688  # MLPerf GPT-3 under NeMo, tp 4
    assert v.padded_vocab(32768, 128, 1) == 32768


def test_id_ranges_expand_with_their_zero_padding():
    assert v.runs._expand(["ZB24-T4-01..03", "BLOOM-03"]) == {
        "ZB24-T4-01",
        "ZB24-T4-02",
        "ZB24-T4-03",
        "BLOOM-03",
    }


def test_part_of_a_switched_node_keeps_the_node_s_bandwidth():
    whole = v.scenario_for(BY_ID["MEGREADME-2009-A100-4"]).system.node
    part = v.scenario_for(BY_ID["MEGREADME-2009-A100-2"]).system.node
    assert (part.devices_per_node, len(part.fabric), part.fabric[0].devices) == (2, 1, 2)
    assert part.fabric[0].gbps_per_direction == whole.fabric[0].gbps_per_direction
    assert v.scenario_for(BY_ID["MEGREADME-2009-V100-1"]).devices == 1


def test_layout_choices_reach_the_scenario():
    s = v.scenario_for(BY_ID["NAR21-T1-09"]).parallelism  # run_table_1.sh: 1 layer / chunk
    assert (s.schedule, s.virtual_stages, s.micro_batch) == ("interleaved-1f1b", 3, 1)
    s = v.scenario_for(BY_ID["MEGREADME-H100-09"])
    assert s.parallelism.virtual_stages == 112 // 16 and s.system.nodes == 1344
    assert s.parallelism.dp_bucket_mb == 4 * 48  # max(4e7, 1e6*48) params x 4 B
    assert v.scenario_for(BY_ID["ZB24-T4-25"]).parallelism.schedule == "zb-h1"


# ---------------------------------------------------------------- FLOP conventions


def test_narayanan_eq3_reproduces_the_bloom_log():
    """BLOOM-01's log prints 149.77 TFLOPs for 104.70 s per iteration on 384 GPUs."""
    r = BY_ID["BLOOM-01"]
    s = v.scenario_for(r)
    flops = v.narayanan_flops(2048, 2048, 70, s.model.hidden, s.model.vocab, recompute=True)
    assert flops / 104.70 / 384 / 1e12 == pytest.approx(149.77, abs=0.02)


def test_narayanan_eq3_reproduces_the_2020_readme():
    """The Sep-2020 README prints 71.9 TFLOP/s for 1.121 s (1.2B model on one V100)."""
    flops = v.narayanan_flops(8, 1024, 24, 1920, 51200, recompute=True)
    assert flops / 1.121 / 1e12 == pytest.approx(71.9, abs=0.05)


def test_llmsim_model_flops_are_megatron_core_s_formula():
    """Megatron-Core num_floating_point_operations = 72·B·s·l·h²(1 + s/6h + V/12lh)."""
    for r in RUNS:
        if r.source != "MEGREADME-H100":
            continue
        s = v.scenario_for(r)
        w = build_workload(s.model, s.parallelism, s.training, s.dp)
        m = s.model
        closed = v.narayanan_flops(
            s.training.global_batch,
            s.training.seq_len,
            m.layers,
            m.hidden,
            m.vocab,
            recompute=False,
        )
        assert w.model_flops() == pytest.approx(closed, rel=1e-12), r.id


def test_the_measured_value_is_not_an_input():
    run = BY_ID["MEGREADME-2009-A100-1"]
    other = dataclasses.replace(run, row={**run.row, "measured_value": "99.0"})
    assert v.predict(other).predicted == v.predict(run).predicted
    assert v.predict(other).error_pct != v.predict(run).error_pct


# ---------------------------------------------------------------- the suite


def test_fast_rows_give_finite_errors_and_a_summary():
    df = v.validate([BY_ID[i] for i in FAST_IDS], progress=False)
    assert list(df.columns[:6]) == ["id", "source", "metric", "measured", "predicted", "error_pct"]
    assert df["error_pct"].map(math.isfinite).all()
    assert (df["predicted"] > 0).all() and (df["step_time_s"] > 0).all()
    expected = (df["predicted"] - df["measured"]) / df["measured"] * 100
    assert (df["error_pct"] - expected).abs().max() < 1e-9
    stats = v.summary(df).set_index("group")
    assert {"BLOOM", "MEGREADME-H100", "target set", "all"} <= set(stats.index)
    assert stats.loc["all", "rows"] == len(FAST_IDS)
    assert stats.loc["all", "mape_pct"] == pytest.approx(df["error_pct"].abs().mean())
    machines = v.summary_by_machine(df).set_index("group")
    assert machines["rows"].sum() == len(FAST_IDS)
    for system, part in df.groupby("system"):
        assert machines.loc[system, "rows"] == len(part)
        assert machines.loc[system, "sources"] == part["source"].nunique()
        assert machines.loc[system, "accelerator"] == part["accelerator"].iloc[0]


def test_the_machine_summary_in_closed_form():
    """Two machines, three rows: each machine's MAPE, median, bias, worst row and sources,
    in the order the rows first name them, and the Markdown table that shows them."""
    df = pd.DataFrame({"id": ["A-1", "B-1", "A-2"], "source": ["A", "B", "A2"],
                       "system": ["fugaku", "selene", "fugaku"],
                       "accelerator": ["a64fx", "a100-sxm4-80gb", "a64fx"],
                       "error_pct": [-30.0, 5.0, 10.0]})
    m = v.summary_by_machine(df)
    assert list(m["group"]) == ["fugaku", "selene"]
    fugaku = m.iloc[0]
    assert (fugaku["rows"], fugaku["sources"], fugaku["accelerator"]) == (2, 2, "a64fx")
    assert fugaku["mape_pct"] == 20.0 and fugaku["median_abs_pct"] == 20.0
    assert fugaku["bias_pct"] == -10.0
    assert (fugaku["worst_id"], fugaku["worst_error_pct"]) == ("A-1", -30.0)


def test_unknown_subset_is_one_clear_error(capsys):
    code, _, err = run_cli(["validate", "--subset", "NOPE"], capsys)
    assert code == 2 and "--subset 'NOPE' matches no validation row" in " ".join(err.split())


def test_cli_validate_nar21_end_to_end(target, tmp_path, capsys, monkeypatch):
    """``llmsim validate --subset NAR21 --out DIR`` (simulations reused from the fixture)."""
    monkeypatch.setattr(v.predictions, "predict", lambda run: target[run.id])
    code, out, err = run_cli(["validate", "--subset", "NAR21", "--out", str(tmp_path)], capsys)
    assert code == 0, err
    assert "NAR21-T1-01" in out and "NAR21-T2-12" in out and "MAPE" in out
    df = pd.read_csv(tmp_path / "validation.csv")
    assert len(df) == 22 and set(df["source"]) == {"NAR21-T1", "NAR21-T2"}
    assert (tmp_path / "validation.png").stat().st_size > 10_000
    md = (tmp_path / "validation.md").read_text(encoding="utf-8")
    assert "| **target set** | 22 |" in md and "| NAR21-T2-12 | yes | TFLOP/s/GPU |" in md
    assert "ZB24 schedule order" not in md  # no Zero Bubble rows in this subset
    goal = v.accuracy_goal(df)
    assert f"accuracy goal on the {goal.rows} target rows of this subset" in out
    assert md.startswith(f"## Accuracy goal: {'met' if goal.met else 'not met'}")
    assert ("| the Zero Bubble schedule order per configuration | no Zero Bubble "
            "configuration in these rows | n/a |") in md
    # the ZeRO-3 rows worse than 20 % shown with the range of their unstated DeepSpeed
    # settings, which does not reach within it: still counted
    over = next(line for line in md.splitlines() if line.startswith("| no row worse than"))
    assert "NAR21-T2-06 (+" in over and "% over its unstated values)" in over
    assert "reported with their range instead" not in over and "| **no** |" in over


def test_markdown_tables_hold_every_row_and_the_schedule_order(target):
    df = _frame(target)
    md = v.markdown_tables(df)
    rows = [line for line in md.splitlines() if line.startswith("| ") and " | yes | " in line]
    assert {line.split(" | ")[0][2:] for line in rows} >= set(df["id"])
    ranking = v.schedule_ranking(df)
    assert f"## ZB24 schedule order: {int(ranking['same'].sum())} of 12 reproduced" in md
    assert "## ZB24: cost of one more micro-batch" in md
    assert "| GPT-like 14.6B | interleaved-1f1b | 64 → 128 |" in md  # 4 models × 3 schedules
    assert len(v.marginal_costs(df)) == 12
    mape = df["error_pct"].abs().mean()
    assert f"| **target set** | {len(df)} | {mape:.1f} |" in md


def test_the_plot_has_a_colour_for_every_source(tmp_path):
    """More sources than a colour map's colours (14 at this commit) still plot."""
    df = _judged([(f"S{i}-01", f"S{i}", float(i), False, "1f1b") for i in range(25)])
    assert v.plot_validation(df, tmp_path / "v.png").stat().st_size > 0


# ---------------------------------------------------------------- accuracy


def _judged(rows: list[tuple[str, str, float, bool, str]]) -> pd.DataFrame:
    """A frame as :func:`validate` builds it from (id, source, error %, target, schedule):
    row i an iteration time of 1 + i/10 s measured, the ZB24 rows one configuration."""
    return pd.DataFrame([
        {"id": rid, "source": src, "metric": "iteration_time_s", "measured": 1.0 + i / 10,
         "predicted": (1.0 + i / 10) * (1 + err / 100), "error_pct": err, "target": tgt,
         "config": "GPT 1.5B B=24" if src == "ZB24" else "", "schedule": schedule}
        for i, (rid, src, err, tgt, schedule) in enumerate(rows)])


def test_marginal_cost_is_the_slope_between_the_two_largest_batches():
    frame = _judged([("a", "ZB24", 0.0, True, "1f1b"), ("b", "ZB24", 0.0, True, "1f1b"),
                     ("c", "ZB24", 0.0, True, "1f1b"), ("d", "ZB24", 0.0, True, "zb-h1")])
    frame["model"] = "GPT 1.5B"
    frame["microbatches"] = [8, 16, 48, 16]
    frame["measured"] = [0.9, 1.0, 2.6, 1.0]     # 50 ms per micro-batch from 16 to 48
    frame["predicted"] = [9.0, 1.0, 1.64, 1.0]   # 20 ms; the row at 8 is not used
    costs = v.marginal_costs(frame)
    assert list(costs["schedule"]) == ["1f1b"]   # zb-h1 has one batch only
    row = costs.iloc[0]
    assert row["microbatches"] == "16 → 48"
    assert row["measured_ms"] == pytest.approx(50.0) and row["predicted_ms"] == pytest.approx(20.0)


def test_accuracy_goal_judges_mape_worst_row_and_schedule_order():
    rows = [("a", "X", 5.0, True, ""), ("b", "X", -25.0, True, ""),
            ("c", "X", 3.0, True, ""), ("off", "Y", 90.0, False, ""),
            # measured 1f1b 1.4 s < zb-h1 1.5 s; predicted 1.54 s > 1.44 s: order lost
            ("z1", "ZB24", 10.0, True, "1f1b"), ("z2", "ZB24", -4.0, True, "zb-h1")]
    goal = v.accuracy_goal(_judged(rows))
    assert goal.rows == 5 and goal.mape_pct == pytest.approx((5 + 25 + 3 + 10 + 4) / 5)
    assert goal.rows_over == (("b", -25.0),)  # the non-target +90 % row is not judged
    assert (goal.orders_reproduced, goal.orders) == (0, 1)
    assert not (goal.mape_met or goal.worst_met or goal.orders_met or goal.met)
    assert [status for *_, status in goal.parts()] == ["no", "no", "no"]

    good = v.accuracy_goal(_judged([("a", "X", 5.9, True, ""), ("b", "X", -5.9, True, ""),
                                    ("z1", "ZB24", 1.0, True, "1f1b"),
                                    ("z2", "ZB24", 1.0, True, "zb-h1")]))
    assert good.met and good.rows_over == () and (good.orders_reproduced, good.orders) == (1, 1)
    assert v.accuracy_goal(_judged([("off", "Y", 1.0, False, "")])) is None
    no_zb = v.accuracy_goal(_judged([("a", "X", 1.0, True, "")]))
    assert no_zb.met and no_zb.parts()[2][2] == "n/a"


def _ranges(*rows: tuple[str, float, float]) -> pd.DataFrame:
    return pd.DataFrame([{"id": rid, "low_error_pct": low, "high_error_pct": high}
                         for rid, low, high in rows])


def test_a_row_with_unstated_settings_is_judged_by_its_sensitivity_range():
    """Issue #38: a row worse than 20 % whose source leaves settings unstated is judged by
    the range its unstated values give; it passes only if that range reaches within 20 %,
    and it is reported with the range, not hidden."""
    frame = _judged([("in", "X", -28.5, True, ""), ("edge", "X", 21.0, True, ""),
                     ("out", "X", 40.0, True, ""), ("bare", "X", -25.0, True, ""),
                     ("ok", "X", 1.0, True, "")])
    ranges = _ranges(("in", -29.2, 6.9), ("edge", 20.0, 30.0), ("out", 40.0, 113.0),
                     ("ok", -2.0, 3.0))
    goal = v.accuracy_goal(frame, ranges)
    assert goal.rows_over == (("out", 40.0), ("bare", -25.0))  # no range, or none reaching
    assert [r[0] for r in goal.rows_accepted] == ["in", "edge"]  # 20.0 is within the limit
    assert goal.rows_ranged == (("out", 40.0, 40.0, 113.0), ("in", -28.5, -29.2, 6.9),
                                ("edge", 21.0, 20.0, 30.0))
    assert goal.mape_pct == pytest.approx((28.5 + 21 + 40 + 25 + 1) / 5)  # chosen values
    _, result, met = goal.parts()[1]
    assert met == "no" and result.startswith("2 rows worse: out (+40.0 %; +40.0 … +113.0 % "
                                              "over its unstated values), bare (-25.0 %)")
    assert "reported with their range instead: in (-28.5 % chosen; -29.2 … +6.9 %" in result
    alone = v.accuracy_goal(frame[frame["id"].isin(["in", "ok"])], ranges)
    assert alone.worst_met and alone.rows_over == () and len(alone.rows_accepted) == 1
    assert v.accuracy_goal(frame[frame["id"].isin(["in", "ok"])]).rows_over == (("in", -28.5),)


def test_goal_ranges_vary_only_target_rows_over_the_limit_with_unstated_settings(monkeypatch):
    """Which rows ``llmsim validate`` simulates over their unstated values for the goal."""
    from llmsim.validation import sensitivity as sens

    seen = []
    monkeypatch.setattr(sens, "sensitivity", lambda run: seen.append(run.id) or pd.DataFrame(
        [{"id": run.id, "k": "1", "predicted": 1.0, "error_pct": 5.0, "fits": True,
          "chosen": True}]))
    frame = _judged([("MEGREADME-H100-04", "MEGREADME-H100", -28.5, True, ""),
                     ("MEGREADME-H100-03", "MEGREADME-H100", -4.0, True, ""),
                     ("BLOOM-02", "BLOOM", -20.7, True, ""),
                     ("LUMIRF25-03", "LUMIRF25", -27.3, False, "")])
    table = sens.goal_ranges(frame)
    assert seen == ["MEGREADME-H100-04"]  # -03 within 20 %, BLOOM-02 unvaried, LUMI no target
    assert list(table["id"]) == ["MEGREADME-H100-04"]
    assert sens.goal_ranges(frame[frame["id"] == "BLOOM-02"]).empty


def test_zero_bubble_schedule_order(target):
    """Qi et al. 2024 Table 4: per (model, batch), the order of 1F1B, interleaved, ZB-1p."""
    ranking = v.schedule_ranking(_frame(target))
    assert len(ranking) == 12
    assert ranking["same"].sum() >= ZB24_ORDERS_REPRODUCED


def _printed_rounding_s(run: v.Run) -> float:
    """Half a unit of the last digit Qi et al. print a row's throughput with (one decimal
    from 10 samples/GPU/s, two below), as seconds of its iteration time."""
    sps = float(run.row["notes"].split("reported ")[1].split(" samples")[0])
    return run.measured * (0.05 if sps >= 10 else 0.005) / sps


def test_zero_bubble_interleaved_warmup_and_cooldown_are_the_measured_ones(target):
    """Qi et al. 2024 Table 4: a step is a line in the micro-batch count m, intercept +
    m · slope. The interleaved rows' intercept, the warm-up and cool-down of the other
    stages and the per-step work, matches the measured one within the rounding of the
    printed throughputs (through the two largest batches, as ``marginal_costs``): the
    interleaved schedule's missing time (docs/validation.md section 7) is in the slope, a
    cost per micro-batch, and not in extra flushes or warm-up passes."""
    frame = _frame(target)
    inter = frame[(frame["source"] == "ZB24") & (frame["schedule"] == "interleaved-1f1b")]
    assert inter["model"].nunique() == 4
    for _, g in inter.groupby("model"):
        lo, hi = (r for _, r in g.nlargest(2, "microbatches").sort_values("microbatches")
                  .iterrows())
        m0, m1 = lo["microbatches"], hi["microbatches"]

        def intercept(t0: float, t1: float, m0=m0, m1=m1) -> float:
            return (m1 * t0 - m0 * t1) / (m1 - m0)

        bound = (m1 * _printed_rounding_s(BY_ID[lo["id"]])
                 + m0 * _printed_rounding_s(BY_ID[hi["id"]])) / (m1 - m0)
        measured = intercept(lo["measured"], hi["measured"])
        assert intercept(lo["predicted"], hi["predicted"]) == pytest.approx(measured, abs=bound)


@pytest.mark.xfail(
    strict=True,
    reason="target-set MAPE 6.11 % (goal 6 %, not met), median 3.9 %, 4 rows worse than 20 % "
    "with no unstated value to bring them within it, worst +55 % (NAR21-T2-06, ZeRO-3), and 9 "
    "of 12 Zero Bubble schedule orders; see docs/validation.md",
)
def test_target_set_meets_the_accuracy_goal(target):
    from llmsim.validation.sensitivity import goal_ranges

    frame = _frame(target)
    goal = v.accuracy_goal(frame, goal_ranges(frame))  # as llmsim validate judges it
    assert goal.rows == len(target) and goal.orders == 12
    assert goal.mape_met, goal.mape_pct
    assert goal.worst_met, goal.rows_over
    assert goal.orders_met, goal.orders_reproduced  # every Zero Bubble configuration


def test_target_set_accuracy_does_not_regress(target):
    assert _frame(target)["error_pct"].abs().mean() <= TARGET_MAPE_CEILING_PCT


def test_fugaku_rows_run_in_the_suite():
    """The fast Fugaku development rows (1-3; -4 and -5 take ~40 s and run in ``llmsim
    validate``): finite, and within 20 % at the GEMM share of the PyTorch build they ran
    (1.10: -0.2, -2.5, -2.4 %; docs/validation.md §8, "A GEMM share per PyTorch build").
    At 1.7's share they were +37.3, +34.0, +32.5 % too slow; with the third of peak as a
    ceiling -12 to -20 %."""
    df = v.validate([BY_ID[f"FUGAKU-DEV-{i}"] for i in (1, 2, 3)], progress=False)
    assert df["error_pct"].map(math.isfinite).all()
    assert (df["error_pct"].abs() < 20).all()


def test_lumi_rows_run_in_the_suite():
    """The LUMI (MI250X) strong-scaling rows at 16, 64 and 256 nodes: finite, and too
    fast by the band docs/validation.md §8 reports for them (-21.0, -22.0 and -26.6 % on
    2026-11-27; -23.7, -24.7 and -28.9 % when the MI250X rates were measured; the compute
    side of their 2023 software);
    the step time falls as nodes are added, as measured (346.7, 97.5, 36.2 s)."""
    df = v.validate([BY_ID[f"LUMI23-0{i}"] for i in (1, 3, 5)], progress=False)
    assert df["error_pct"].map(math.isfinite).all()
    assert ((df["error_pct"] < -15) & (df["error_pct"] > -35)).all()
    assert df["predicted"].is_monotonic_decreasing


def test_aurora_rows_run_in_the_suite():
    """The Aurora (PVC) weak-scaling rows at 4, 64 and 256 nodes: finite, too slow by more
    than 15 % at 4 nodes and too fast by more than 10 % at 256 (+17.4, -1.6 and -17.5 % on
    2026-11-27; +24.5, +4.7 and -12.0 % when the launcher's CCL_OP_SYNC=1, which holds the
    host at every gather, was priced as no prefetch, an upper bound; +6.7, -10.8 and
    -25.6 % before it; -1.1, -17.3 and -30.9 % when added): the host wait adds a nearly
    flat 0.40-0.45 s, so the missing time still grows with the job while llmsim's FSDP
    collectives barely do (docs/validation.md §8, "Aurora")."""
    df = v.validate([BY_ID[f"AURORA26-0{i}"] for i in (1, 5, 7)], progress=False)
    err = df.set_index("id")["error_pct"]
    assert err.map(math.isfinite).all()
    assert err["AURORA26-01"] > 15 and err["AURORA26-07"] < -10
    assert err["AURORA26-01"] > err["AURORA26-05"] > err["AURORA26-07"]

def test_fugaku_gap_is_in_the_compute_not_the_network():
    """FUGAKU-DEV-6 is one node (no network at all) and FUGAKU-DEV-1 four nodes with TP 4
    over Tofu-D: llmsim was too fast on both (−49.4 and −50.0 % when added; −29.8 and
    −17.3 % once the batched attention matmuls, glibc's page round trip, the eager softmax
    and Fujitsu MPI's ring were priced); since the GEMMs run at PyTorch 1.7's share of
    SSL2's rate, each PyTorch build's own share (1.7's set on its tuned per-CMG run, 1.10's
    on its own), both are within 20 %: the one-node row on 1.7 −6.4 %, the TP-4 row on 1.10
    −0.2 % (+37.3 % at 1.7's share): what either misses is on the node, not in the TP
    all-reduces."""
    df = v.validate([BY_ID["FUGAKU-DEV-1"], BY_ID["FUGAKU-DEV-6"]], progress=False)
    one_node, tp4 = df.set_index("id").loc[["FUGAKU-DEV-6", "FUGAKU-DEV-1"], "error_pct"]
    assert abs(one_node) < 20 and abs(tp4) < 20
    assert one_node < tp4


def test_the_plot_takes_more_sources_than_a_palette_has(tmp_path):
    """Eleven sources and more (LUMI23 made eleven) each get a colour; tab10 had ten."""
    df = pd.DataFrame({"source": [f"S{i}" for i in range(23)], "metric": "iteration_time_s",
                       "measured": [1.0 + i for i in range(23)],
                       "predicted": [1.1 + i for i in range(23)]})
    assert v.plot_validation(df, tmp_path / "v.png").stat().st_size > 0
