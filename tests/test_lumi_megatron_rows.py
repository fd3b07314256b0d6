"""The LUMI (MI250X) rows LUMIRF25-01…03: Llama-2-7B with ROCm's Megatron-LM at TP 2 on
2, 8 and 16 nodes, the LUMI team's ReFrame performance check of 2025
(Lumi-supercomputer/lumi-reframe-tests checks/apps/megatron-lm at ac6c362,
docs/validation.md §8, "LUMI: ROCm's Megatron-LM").

The rows' own numbers are checked against each other (the check's tokens/GPU/s gives the
iteration time; the same tokens/GPU/s with llmsim's model FLOPs gives the check's TFLOP/s
per GCD), the layout against the check's script, and the result against the band the docs
report.
"""

from __future__ import annotations

import math

import pytest

from llmsim import validation as v

BY_ID = {r.id: r for r in v.load_runs()}
REFERENCES = {  # row → (nodes, tokens/GPU/s, TFLOP/s per GCD), the check's all_refs
    "LUMIRF25-01": (2, 1950, 91),
    "LUMIRF25-02": (8, 1880, 88),
    "LUMIRF25-03": (16, 1820, 83),
}
TOKENS_PER_STEP = 256 * 4096  # BS 256 sequences of SEQ_LENGTH 4,096


@pytest.mark.parametrize("row_id", list(REFERENCES))
def test_iteration_time_is_the_check_s_tokens_per_gpu(row_id: str) -> None:
    """TGS = BS · SEQ_LENGTH / (iteration time · WORLD_SIZE), inverted."""
    nodes, tokens_per_gpu, _ = REFERENCES[row_id]
    row = BY_ID[row_id]
    assert row.metric == "iteration_time_s" and row.gpus == 8 * nodes
    assert row.measured == pytest.approx(TOKENS_PER_STEP / (tokens_per_gpu * row.gpus),
                                         abs=5e-5)


def test_the_check_s_tflops_follow_from_its_tokens_on_llmsim_s_flop_count() -> None:
    """Megatron's 'throughput per GPU' is its FLOPs per token times tokens/GPU/s: with
    llmsim's model FLOPs of the row (46.1 GFLOP per token) each reference pair agrees to
    2 %, so the two figures describe one measurement."""
    result = v.predict(BY_ID["LUMIRF25-01"]).result
    flops_per_token = result.model_flops_per_step / TOKENS_PER_STEP
    for _, tokens_per_gpu, tflops in REFERENCES.values():
        assert tokens_per_gpu * flops_per_token / 1e12 == pytest.approx(tflops, rel=0.02)


def test_layout_is_the_check_s_script() -> None:
    """TP 2 with sequence parallelism, no pipeline, distributed optimizer with overlapped
    gradient reduction and weight gathers, no recompute, micro-batch 2 of 4,096 tokens."""
    for row_id, (nodes, _, _) in REFERENCES.items():
        scenario = v.scenario_for(BY_ID[row_id])
        par = scenario.parallelism
        assert scenario.system.name == "lumi" and scenario.devices == 8 * nodes
        assert (par.tp, par.pp, par.dp) == (2, 1, 4 * nodes)
        assert par.sequence_parallel and par.zero == 1 and par.recompute == "none"
        assert par.overlap_dp_comm and par.overlap_param_gather and par.micro_batch == 2
        assert scenario.training.global_batch == 256 and scenario.training.seq_len == 4096
        assert scenario.model.vocab == 32000 and scenario.model.kv_heads == 32


@pytest.mark.parametrize("row_id", ["LUMIRF25-01", "LUMIRF25-03"])
def test_rows_run_and_are_too_fast_by_the_band_the_docs_give(row_id: str) -> None:
    """Compute-bound and too fast, like every MI250X row: −23.3 / −25.6 / −27.3 % when
    added (docs/validation.md §8), with the GEMM rate that MI250X's own one-GCD timings of
    the same ROCm 6.2 era confirm (tests/test_mi250x_measured.py). A band, not the value."""
    row = BY_ID[row_id]
    result = v.predict(row).result
    err = (result.step_time_s - row.measured) / row.measured * 100
    assert math.isfinite(err) and -32 < err < -18
    assert result.breakdown_s["compute"] > 0.9 * result.step_time_s
