"""The issue-41 rows of 2026-11-27 (docs/validation.md §10): DistFlashAttn's sequence-parallel
LLaMA-7B and LLaMA-GQA runs on one DGX A100 (DFA24-01 … 03, 07 … 09, 13 … 21: Li et al. 2024,
arXiv:2310.03294, Table 1's one-box runs and Table 5 under Hugging Face's and DistFlashAttn's
checkpointing) and DeepSpeed-MoE's 1.3B+MoE-128 with its 6.7B dense peer on 128 A100
(DSMOE22, Rajbhandari et al. 2022, arXiv:2201.05596, Table 3).

DistFlashAttn's two-box runs are left out (docs/validation.md "Rows left out"): the network
between the boxes is unverified and enters both its exchange and FSDP's traffic. The measured
times are checked against the tables' own numbers, the layouts against the papers and their
scripts, the rule that keeps a DFA24 row against the simulation, and the errors the docs
give. Bands, not values.
"""

from __future__ import annotations

import pytest

from llmsim import validation as v

RUNS = {r.id: r for r in v.load_runs() if r.id.startswith(("DFA24", "DSMOE22"))}
RUNS_ALL = {r.id: r for r in v.load_runs()}
DFA = sorted(i for i in RUNS if i.startswith("DFA24"))


def test_the_rows_are_the_tables():
    """Table 1's one-box times (LLaMA-7B and -GQA at 8K–32K tokens a GPU), Table 5's
    'HF ckpt' times at 1K–32K and its 'Our ckpt' times at 1K–4K (8K–32K are Table 1's),
    and two DeepSpeed-MoE rows, none in the target set; the DeepSpeed-MoE times are the
    global batches over Table 3's samples a second (512 / 372 and 1,024 / 70)."""
    ids = [f"DFA24-{i:02d}" for i in (1, 2, 3, 7, 8, 9, *range(13, 22))]
    assert ids == DFA
    assert [RUNS[i].measured for i in DFA] == [5.98, 17.26, 58.46, 5.61, 16.86, 57.01, 0.84,
                                               1.29, 2.64, 6.93, 21.44, 76.38, 0.84, 1.36,
                                               2.50]
    assert all(not r.target for r in RUNS.values())
    assert RUNS["DSMOE22-01"].measured == pytest.approx(512 / 372, abs=5e-5)
    assert RUNS["DSMOE22-02"].measured == pytest.approx(1024 / 70, abs=5e-4)


@pytest.mark.parametrize(("row", "per_gpu", "kv_heads", "recompute"), [
    ("DFA24-01", 8192, 32, "full_keep_attention"), ("DFA24-09", 32768, 8, "full_keep_attention"),
    ("DFA24-14", 2048, 32, "full"), ("DFA24-18", 32768, 32, "full"),
    ("DFA24-19", 1024, 32, "full_keep_attention")])
def test_dfa_layout_is_one_sequence_over_one_box(row, per_gpu, kv_heads, recompute):
    """One sequence of per-GPU tokens × 8 split over the box's 8 GPUs (cp 8, no TP, PP or
    DP) by DistFlashAttn's schedule, FSDP full shard (ZeRO-3 over the cp group), FP16, its
    Triton forward, Hugging Face's eager pointwise ops, and the table's checkpointing."""
    sc = v.scenario_for(RUNS[row])
    par = sc.parallelism
    assert (par.tp, par.pp, par.dp, par.cp, par.zero) == (1, 1, 1, 8, 3)
    assert par.cp_schedule == "distflash" and par.recompute == recompute
    assert sc.training.seq_len == per_gpu * 8 and sc.training.global_batch == 1
    assert sc.model.kv_heads == kv_heads and sc.training.precision == "fp16"
    assert sc.training.attention_kernel == "triton_fwd"
    assert sc.training.pointwise_ops == "hf_eager"
    assert sc.system.name == "dfa24-dgx-a100" and sc.nodes == 1
    assert sc.training.host_path == "modules"
    assert sc.system.node.accelerator.host_module_dispatch_us == 64.9  # assumed: H100 box


@pytest.mark.parametrize("row", DFA)
def test_a_kept_row_exposes_no_ring(row):
    """The rows run on one box (docs/validation.md §10, the rule that keeps a DFA24 row):
    there DistFlashAttn's fetches, each on its own NVSwitch path, hide behind its
    attention blocks: under 0.3 % of the step in the exchange's part (at 1K tokens a GPU,
    DFA24-19 0.1 ms since FlashAttention-2's forward runs at its own, faster rate; DFA24-13
    1.8 ms, nearly all of it the device waiting for the host to issue the backward's first
    fetch after the recompute's attention, which holds the host to its end: a wait is
    counted with the op that waits; none elsewhere), and the runs' memory fits."""
    result = v.predict(RUNS[row]).result
    assert result.breakdown_s.get("cp_comm", 0.0) <= 3e-3 * result.step_time_s
    assert result.fits


def test_dfa_rows_err_as_the_docs_say():
    """With DistFlashAttn's kernels, schedule, checkpointing and Hugging Face's eager
    pointwise ops priced: at 8K–32K tokens a GPU within 7 % (llmsim still fast; DFA24-18
    −6.0 % since FlashAttention-2's forward, which its Triton forward is priced from, runs
    at its own rate), at 4K 6–12 % fast; at 1K–2K, with the host's Python per kernel
    priced at the H100 box's assumed 64.9 µs (``training.host_path: modules``),
    DistFlashAttn's device-wide syncs waiting for FSDP's gathers, and FSDP1's gathers as
    the code makes them (each unit gathered at each call, ``gathers_per_call`` 2 under
    DistFlashAttn's checkpointing patch; again for the recompute, when it is reached:
    ``regather_for_recompute``, ``prefetch_recompute_gather`` false), and FSDP1's hooks
    of each call beyond one a pass (``host_fsdp_forward_us``, ``host_fsdp_backward_us``):
    DFA24-13, -14 and -20 10–15 % fast, DFA24-19 within 2 % (were 7–21 % fast before
    session s15's hooks, 17–29 % before s14's gathers: the measured step's floor is not
    all priced at 2K)."""
    err = {row: v.predict(RUNS[row]).error_pct for row in DFA}
    for row in ("DFA24-01", "DFA24-02", "DFA24-03", "DFA24-07", "DFA24-08", "DFA24-09",
                "DFA24-16", "DFA24-17", "DFA24-18"):
        assert -7 < err[row] < 0, row
    for row in ("DFA24-15", "DFA24-21"):
        assert -12 < err[row] < -6, row
    for row in ("DFA24-13", "DFA24-14", "DFA24-20"):
        assert -15 < err[row] < -10, row
    assert -2 < err["DFA24-19"] < 2


def test_the_host_sets_the_short_rows_and_not_the_long_ones():
    """The host's Python per kernel (assumed 64.9 µs, an H100 box's Hugging Face step under
    FSDP and checkpointing) lengthens the 1K rows' step by 7–10 % and leaves the
    8K–32K rows as they were (docs/validation.md §10): priced on the bare-op path (9.1 µs,
    before) the 1K rows are 0.06–0.07 s shorter (the backward's and forward's waits for
    FSDP's gathers hide part of the host's lag on either path: 0.07 before the gathers were
    counted as the code makes them), the 32K rows the same to 0.01 %."""
    from llmsim.validation.sensitivity import with_values

    for row, least, most in (("DFA24-13", 0.05, 0.13), ("DFA24-19", 0.04, 0.13),
                             ("DFA24-03", 0.0, 1e-4 * 58), ("DFA24-18", 0.0, 1e-4 * 72)):
        bare = v.predict(with_values(RUNS[row], {"training.host_path": None})).predicted
        assert least <= v.predict(RUNS[row]).predicted - bare <= most, row


def test_dsmoe_layouts_are_the_scripts():
    """MoE: 128 experts on the 12 odd 0-based layers, top-1, capacity factor 1.0, EP 128 on
    128 GPUs (llmsim's ep axis takes all data-parallel ranks), one micro-batch of 4,
    DeepSpeed's einsum dispatch; dense: TP 8, DP 16, 32 micro-batches of 2 (the largest
    micro-batch the script's batch ramp-up from 32 sequences admits at DP 16). Both FP16,
    ZeRO 0, full recompute, on the chosen 80 GB node."""
    moe_sc, dense_sc = (v.scenario_for(RUNS[f"DSMOE22-0{i}"]) for i in (1, 2))
    moe = moe_sc.model.moe
    assert (moe.experts, moe.top_k, moe.ffn_hidden, moe.capacity_factor) == (128, 1, 8192, 1.0)
    assert moe.moe_layers(24) == 12 and moe.is_moe_layer(1) and not moe.is_moe_layer(0)
    par = moe_sc.parallelism
    assert (par.tp, par.ep, par.dp, par.micro_batch, moe_sc.micro_batches) == (1, 128, 1, 4, 1)
    assert par.moe_dispatcher == "deepspeed"
    par = dense_sc.parallelism
    assert (par.tp, par.dp, par.micro_batch, dense_sc.micro_batches) == (8, 16, 2, 32)
    assert 32 % (par.micro_batch * par.dp) == 0  # the ramp-up's first global batch
    assert dense_sc.model.moe is None
    for sc in (moe_sc, dense_sc):
        assert sc.parallelism.zero == 0 and sc.parallelism.recompute == "full"
        assert sc.training.precision == "fp16" and sc.system.name == "openai-a100"
        # get_batch / get_batch_pipe's broadcast_data reads the sizes back every micro-batch
        assert sc.training.host_syncs == "megatron"


def test_the_table_is_whole_steps_by_either_deepspeed_timer():
    """Table 3 prints samples a second, no TFLOP/s (the blog's Table 2 and the ICML talk's
    slide 4 give the same 372 and 70), so no FLOP formula enters the rows' step times. Of
    the two throughputs DeepSpeed v0.5.8 printed, the dense row's PipelineEngine (its script
    omits --no-pipeline-parallel) gives train_batch_size / iter_time over train_batch's
    synchronized timer, and the MoE row's engine gives ThroughputTimer's micro-batch x
    data-parallel ranks over the time from each micro-batch's forward to its step (one
    micro-batch a step): either is the global batch over one step. The rows' layouts read
    back through these formulas give the table's numbers from the measured step."""
    moe_sc, dense_sc = (v.scenario_for(RUNS[f"DSMOE22-0{i}"]) for i in (1, 2))
    moe_t, dense_t = RUNS["DSMOE22-01"].measured, RUNS["DSMOE22-02"].measured
    par = dense_sc.parallelism
    train_batch_size = par.micro_batch * dense_sc.micro_batches * par.dp
    assert round(train_batch_size / dense_t) == 70
    par = moe_sc.parallelism
    data_parallel_ranks = par.dp * par.ep  # DeepSpeed's dp_world_size: all 128 ranks
    assert moe_sc.micro_batches == 1
    assert round(par.micro_batch * data_parallel_ranks / moe_t) == 372


def test_the_moe_row_is_nearer_than_its_dense_peer():
    """With DeepSpeed's einsum dispatch priced the MoE row is about 31 % too fast, its
    dense peer about 38 % (docs/validation.md §10); the all-to-all is a small part of the
    MoE step and the einsums' GEMMs a sizeable one."""
    moe, dense = (v.predict(RUNS[f"DSMOE22-0{i}"]) for i in (1, 2))
    assert -35 < moe.error_pct < -26 and -42 < dense.error_pct < -34
    parts = moe.result.breakdown_s
    assert 0.05 * moe.result.step_time_s < parts["ep_all_to_all"] < 0.2 * moe.result.step_time_s


@pytest.mark.parametrize("row", ["DSMOE22-01", "DSMOE22-02"])
def test_the_40gb_node_fits_and_is_slower(row):
    """Azure's ND A100 v4 (40 GB, HBM2 at 1.555 TB/s), the other end of the rows' machine
    range: the stated layouts fit, and the memory-bound kernels make the step longer."""
    from llmsim.validation.sensitivity import with_values

    chosen = v.predict(RUNS[row])
    nd = v.predict(with_values(RUNS[row], {"system": "azure-nd-a100-v4"}))
    assert v.scenario_for(with_values(RUNS[row], {"system": "azure-nd-a100-v4"})
                          ).system.node.accelerator.hbm_gb == 40
    assert nd.result.fits and nd.predicted > chosen.predicted


def test_the_gap_table_reads_the_decomposition():
    """benchmarks/dsmoe_gap.py (docs/validation.md §10, "Looked at again in session s13"):
    the missing time over the rows' micro-batches and sequences, and the compute factor that
    would close each row with the rest of the step as priced, from the same decomposition
    the shares table prints; the two rows' factors differ (1.80 and 1.53), and the rows
    beside them need none beyond a tenth either way."""
    from helpers import load_script

    gap = load_script("benchmarks/dsmoe_gap.py")
    module = gap._decomposition_module()
    rows = [module.decompose(RUNS_ALL[i]) for i in gap.ROWS]
    table = gap.gap_table(rows, RUNS_ALL).splitlines()[2:]
    cells = {line.split(" | ")[0][2:]: line.strip(" |").split(" | ") for line in table}
    factor = {row: float(c[6]) for row, c in cells.items()}
    assert factor["DSMOE22-02"] == pytest.approx(1.80, abs=0.02)
    assert factor["DSMOE22-01"] == pytest.approx(1.53, abs=0.02)
    for row in gap.ROWS[2:]:
        assert 0.8 < factor[row] < 1.1, row
    d = {r.id: r for r in rows}["DSMOE22-02"]
    sc = v.scenario_for(RUNS_ALL["DSMOE22-02"])
    per_mb_ms = 1e3 * (d.measured_s - d.step_s) / sc.micro_batches
    assert float(cells["DSMOE22-02"][4].replace(",", "")) == pytest.approx(per_mb_ms, abs=0.5)
