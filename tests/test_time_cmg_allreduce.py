"""``benchmarks/time_cmg_allreduce.py``: the calls it times are FUGAKU-DEV-14's as llmsim's
workload has them, and it refuses bad input before it needs PyTorch (it runs on Fugaku;
docs/validation.md, section 8, "The TP rows on the CMGs")."""

from __future__ import annotations

import pytest
from helpers import load_script

from llmsim.loader import load_scenario
from llmsim.ops import CommOp, ComputeOp
from llmsim.simulation import simulate
from llmsim.validation import load_runs
from llmsim.validation.scenarios import scenario_mapping

script = load_script("benchmarks/time_cmg_allreduce.py")


@pytest.fixture(scope="module")
def dev14_ops() -> dict[str, ComputeOp | CommOp]:
    """FUGAKU-DEV-14's ops of one micro-batch on its busiest rank, by name (first of each)."""
    run = next(r for r in load_runs("FUGAKU-DEV") if r.id == "FUGAKU-DEV-14")
    result = simulate(load_scenario(dict(scenario_mapping(run))))
    ops: dict[str, ComputeOp | CommOp] = {}
    for chunk in result.workload.chunks.values():
        if chunk.stage == result.critical_stage.stage:
            for op in chunk.ops:
                ops.setdefault(op.name, op)
    return ops


def test_the_cases_are_dev14s_calls(dev14_ops: dict[str, ComputeOp | CommOp]) -> None:
    """The TP all-reduce is the row's 3 MiB (1 × 1,024 × 768 FP32), the cross-entropy's
    three 4 KiB calls and the token broadcast are llmsim's (``training.small_calls:
    megatron_mpu``); the GEMM before each ``after_gemm`` call is the row's QKV shard,
    (M, N, K) = (1,024, 576, 768)."""
    for name in ("tp_attn", "tp_mlp", "embed_tp", "head_rs"):
        assert dev14_ops[name].bytes == script.case_bytes("tp_all_reduce") == 3 * 2**20
    for name in ("loss_tp_max", "loss_tp_predicted", "loss_tp_sum_exp"):
        assert dev14_ops[name].bytes == script.case_bytes("loss_all_reduce")
    assert dev14_ops["batch_bcast"].bytes == script.case_bytes("batch_broadcast") == 8 * 1025
    m, k, n = script.QKV_SHARD
    assert dev14_ops["qkv"].mnk == (m, n, k)


def test_rank_and_size_come_from_any_launcher() -> None:
    """torch.distributed.run's variables first, then Fujitsu MPI's PMIx ones."""
    assert script.env_int(script.RANK_VARIABLES, {"PMIX_RANK": "3"}) == 3
    assert script.env_int(script.RANK_VARIABLES, {"RANK": "1", "PMIX_RANK": "3"}) == 1
    assert script.env_int(script.SIZE_VARIABLES, {}) is None


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 11)]
    assert script.percentile(values, 0.9) == 9.0
    assert script.percentile(values, 0.5) == 5.0
    assert script.percentile([7.0], 0.9) == 7.0


@pytest.mark.parametrize("argv", [["--backend", "nccl"], ["--calls", "0"]])
def test_bad_input_exits_2_before_pytorch(argv: list[str],
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert script.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --") and "pass" in err
