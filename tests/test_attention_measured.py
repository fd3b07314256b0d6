"""Flash attention kernels timed on the board by shape (``flash_attention_measured``)."""

from __future__ import annotations

import csv
from dataclasses import replace
from pathlib import Path

import pytest
from helpers import make_scenario

from llmsim.costs.compute import ComputeModel
from llmsim.errors import UserError
from llmsim.loader import load_spec, validate
from llmsim.ops import ComputeOp
from llmsim.specs import Accelerator
from llmsim.workload import LayerBuilder

OPS_CSV = Path(__file__).parent / "data" / "ops_h100_sxm5_2026_11.csv"


@pytest.fixture(scope="module")
def h100() -> Accelerator:
    return load_spec("accelerators", "h100-sxm5-80gb")


def _attention_ops(heads: int, seq: int, micro_batch: int = 1) -> tuple[ComputeOp, ComputeOp]:
    """The forward and backward attention ops of one GPT block with ``heads`` heads of 128."""
    sc = make_scenario(**{"model.hidden": heads * 128, "model.heads": heads,
                          "model.max_seq_len": seq, "training.seq_len": seq,
                          "parallelism.tp": 1, "parallelism.micro_batch": micro_batch,
                          "training.global_batch": 16 * micro_batch})
    fwd, _, bwd, _ = LayerBuilder(sc.model, sc.parallelism, sc.training).layer()
    return (next(op for op in fwd if op.name == "attn"),
            next(op for op in bwd if op.name == "attn_bwd"))


def _ops_csv_time_s(kind: str, shape: str) -> float:
    with OPS_CSV.open(encoding="utf-8") as f:
        rows = csv.DictReader(line for line in f if not line.startswith("#"))
        return next(float(r["time_us"]) * 1e-6 for r in rows
                    if r["kind"] == kind and r["shape"] == shape)


def test_a_measured_shape_takes_the_measured_times(h100: Accelerator) -> None:
    """24 heads of 128 at 2,048 tokens (the MLPerf rows' rank): the forward op takes the
    measured forward time, the backward op the forward+backward time less the forward."""
    model = ComputeModel(h100.model_copy(update={"kernel_launch_us": 0.0}), "bf16")
    fwd, bwd = _attention_ops(24, 2048)
    assert fwd.attention_heads == (24, 24) and fwd.attention_shape == (2048, 128)
    forward_s = _ops_csv_time_s("sdpa_fwd", "b1 hq24 hkv24 s2048 d128")
    both_s = _ops_csv_time_s("sdpa_fwd_bwd", "b1 hq24 hkv24 s2048 d128")
    assert model.compute_s(fwd) == pytest.approx(forward_s, rel=1e-3)
    assert model.compute_s(bwd) == pytest.approx(both_s - forward_s, rel=1e-3)


def test_fewer_heads_run_slower_per_flop(h100: Accelerator) -> None:
    model = ComputeModel(h100, "bf16")
    rates = [op.executed_flops / model.math_s(op)
             for heads in (4, 12, 24, 48) for op in _attention_ops(heads, 2048)[:1]]
    assert rates == sorted(rates)


def test_other_shapes_and_kernels_keep_the_catalog_rate(h100: Accelerator) -> None:
    fwd, _ = _attention_ops(24, 2048)
    flash = ComputeModel(h100, "bf16")
    plain = ComputeModel(h100.model_copy(update={"flash_attention_measured": []}), "bf16")
    unmeasured = replace(fwd, attention_heads=(20, 20))
    assert flash.math_s(unmeasured) == plain.math_s(unmeasured)
    assert plain.math_s(fwd) == pytest.approx(
        fwd.executed_flops / (h100.peak_flops("bf16") * h100.attention_fraction))
    cudnn = ComputeModel(h100, "bf16", attention_kernel="cudnn")
    assert cudnn.math_s(fwd) == pytest.approx(
        fwd.executed_flops / (h100.peak_flops("bf16") * h100.cudnn_attention_fraction))


def test_a_micro_batch_multiplies_the_heads_of_the_grid() -> None:
    fwd, bwd = _attention_ops(12, 2048, micro_batch=2)
    assert fwd.attention_heads == bwd.attention_heads == (24, 24)


def test_a_rate_of_zero_is_refused_with_its_field(h100: Accelerator) -> None:
    raw = h100.model_dump()
    raw["flash_attention_measured"] = [[24, 24, 2048, 128, 0.0, 250.0]]
    with pytest.raises(UserError, match="flash_attention_measured"):
        validate(Accelerator, raw, "h100.yaml")
