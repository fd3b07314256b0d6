"""Memory-bound kernels priced by kind (``memory_fraction_by_kind``): norms, their backward
and the optimizer step at their measured rates, everything else at the streaming rate."""

from __future__ import annotations

import csv
import math
from dataclasses import replace
from pathlib import Path

import pytest
from helpers import make_scenario

from llmsim.costs.compute import ComputeModel
from llmsim.errors import UserError
from llmsim.loader import load_spec, validate
from llmsim.ops import ComputeOp
from llmsim.optimizer import optimizer_step
from llmsim.specs import Accelerator
from llmsim.workload import LayerBuilder

OPS_CSV = Path(__file__).parent / "data" / "ops_h100_sxm5_2026_11.csv"
"""The H100 microbenchmarks (shared/measurements/h100-sxm5-2026-11/ops.csv)."""


def _rows(kind: str) -> dict[str, float]:
    """Measured time of each shape of ``kind``, seconds, keyed by its ``T x h`` shape."""
    with OPS_CSV.open(encoding="utf-8") as f:
        lines = [line for line in f if not line.startswith("#")]
    return {r["shape"].split()[0]: float(r["time_us"]) * 1e-6
            for r in csv.DictReader(lines) if r["kind"] == kind}


def _norm_bytes(shape: str, passes: int) -> float:
    """llmsim's bytes for a norm kernel over a BF16 T × h tensor: ``passes`` of it."""
    tokens, hidden = map(int, shape.split("x"))
    return passes * tokens * hidden * 2.0


def _backward_from_ops_csv(h100: Accelerator) -> list[tuple[float, float]]:
    """LayerNorm's backward in ops.csv: forward + backward minus forward, less that
    benchmark's accumulation of the input gradient into x.grad (a streaming kernel: read
    two tensors, write one)."""
    forward = _rows("layernorm_fwd")
    stream = ComputeModel(h100, "bf16")
    return [(_norm_bytes(s, 4), t - forward[s] - stream.compute_s(
                ComputeOp("x.grad += dx", "memory", "B", 0.0, _norm_bytes(s, 3))))
            for s, t in _rows("layernorm_fwd_bwd").items()]


def _backward_alone() -> list[tuple[float, float]]:
    """Both norms' backward timed alone (benchmarks/time_norms.py), at the four shapes of
    ops.csv (the fit leaves out the 512-row shard, docs/cost-models.md)."""
    path = Path(__file__).parent / "data" / "norms_h100_sxm5_2026_11.csv"
    with path.open(encoding="utf-8") as f:
        rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
    return [(4 * int(r["tokens"]) * int(r["hidden"]) * 2.0, float(r["time_us"]) * 1e-6)
            for r in rows if r["kind"].endswith("_bwd") and int(r["tokens"]) >= 2048]


def _measured(kind: str, h100: Accelerator) -> list[tuple[float, float]]:
    """(llmsim's bytes, measured seconds) of every measured H100 shape of a memory kind."""
    if kind == "norm_backward":
        return _backward_alone()
    if kind == "optimizer":  # fused AdamW: 28 bytes per FP32 parameter
        with OPS_CSV.open(encoding="utf-8") as f:
            rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
        return [(28.0 * int(r["shape"].split()[0]), float(r["time_us"]) * 1e-6)
                for r in rows if r["kind"] == "adamw_step" and "fused=True" in r["note"]]
    bench = {"layernorm": "layernorm_fwd", "rmsnorm": "rmsnorm_fwd", "stream": "gelu_fwd"}[kind]
    return [(_norm_bytes(s, 2), t) for s, t in _rows(bench).items()]


@pytest.fixture(scope="module")
def h100() -> Accelerator:
    return load_spec("accelerators", "h100-sxm5-80gb")


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm", "norm_backward", "optimizer", "stream"])
def test_h100_memory_kinds_reproduce_the_measured_kernels(h100: Accelerator, kind: str) -> None:
    """The model's time of each measured kernel (its bytes at the kind's rate plus one
    launch) over the measured time: geometric mean within 3 %, every shape within 30 %."""
    _reproduces(h100, kind, _measured(kind, h100))


def _reproduces(board: Accelerator, kind: str, measured: list[tuple[float, float]]) -> None:
    model = ComputeModel(board, "bf16")
    ratios = [model.compute_s(ComputeOp("k", "memory", "F", 0.0, nbytes, memory_kind=kind))
              / seconds for nbytes, seconds in measured]
    assert len(ratios) >= 2
    geomean = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    assert geomean == pytest.approx(1.0, abs=0.03), ratios
    assert all(0.7 < r < 1.3 for r in ratios), ratios


def test_h100_norm_backward_agrees_with_the_ops_csv_run(h100: Accelerator) -> None:
    """The backward of ops.csv, a separate run, less its x.grad accumulation."""
    _reproduces(h100, "norm_backward", _backward_from_ops_csv(h100))


@pytest.mark.parametrize("kind", ["layernorm", "norm_backward"])
def test_a100_norms_reproduce_liger_kernels_measurements(kind: str) -> None:
    """PyTorch's FP32 LayerNorm on an A100 80 GB (Liger-Kernel's benchmark data): forward,
    and forward + backward minus forward; 4,096 rows of N."""
    path = Path(__file__).parent / "data" / "layernorm_a100_liger.csv"
    with path.open(encoding="utf-8") as f:
        rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
    times = {(r["mode"], int(r["N"])): float(r["ms"]) * 1e-3 for r in rows}
    forward = {n: t for (mode, n), t in times.items() if mode == "forward"}
    if kind == "layernorm":
        measured = [(2 * 4096 * n * 4.0, t) for n, t in forward.items()]
    else:
        measured = [(4 * 4096 * n * 4.0, times[("full", n)] - t) for n, t in forward.items()]
    _reproduces(load_spec("accelerators", "a100-sxm4-80gb"), kind, measured)


def test_norms_run_slower_than_streaming_kernels_on_the_h100(h100: Accelerator) -> None:
    stream = h100.memory_bytes_per_s("stream")
    assert stream == h100.sustained_memory_bytes_per_s
    for kind in ("layernorm", "rmsnorm", "norm_backward", "optimizer"):
        assert h100.memory_bytes_per_s(kind) < stream


def test_without_kinds_every_memory_kernel_runs_at_the_streaming_rate(h100: Accelerator) -> None:
    """A catalog entry that measured no kinds prices them as before: one fraction."""
    plain = h100.model_copy(update={"memory_fraction_by_kind": {}})
    model = ComputeModel(plain, "bf16")
    op = ComputeOp("ln1", "memory", "F", 0.0, 3e7)
    streaming = model.compute_s(op)
    for kind in ("layernorm", "rmsnorm", "norm_backward", "optimizer"):
        assert model.compute_s(replace(op, memory_kind=kind)) == streaming
    assert streaming == pytest.approx(3e7 / plain.sustained_memory_bytes_per_s
                                      + plain.kernel_launch_us * 1e-6)


def test_a_kind_prices_bytes_over_its_own_bandwidth(h100: Accelerator) -> None:
    """Closed form: bytes / (hbm_tbps · 10¹² · fraction) + launch, the same bytes slower
    by exactly the ratio of the fractions once the launch is taken off."""
    model = ComputeModel(h100, "bf16")
    launch_s = h100.kernel_launch_us * 1e-6
    op = ComputeOp("ln1_bwd", "memory", "B", 0.0, 1e9, memory_kind="norm_backward")
    fraction = h100.memory_fraction_by_kind["norm_backward"]
    assert model.compute_s(op) == pytest.approx(1e9 / (3.35e12 * fraction) + launch_s)
    stream_s = model.compute_s(replace(op, memory_kind="stream")) - launch_s
    assert (model.compute_s(op) - launch_s) / stream_s == pytest.approx(
        h100.memory_bound_fraction / fraction)


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_the_layer_tags_its_norms_and_the_optimizer_its_step(norm: str) -> None:
    sc = make_scenario(**{"model.norm": norm})
    fwd, _, bwd, _ = LayerBuilder(sc.model, sc.parallelism, sc.training).layer()
    kinds = {op.name: op.memory_kind for op in [*fwd, *bwd] if isinstance(op, ComputeOp)}
    assert kinds["ln1"] == kinds["ln2"] == norm
    assert kinds["ln1_bwd"] == kinds["ln2_bwd"] == "norm_backward"
    assert kinds["residual1"] == kinds["act"] == "stream"
    step = optimizer_step(sc.parallelism, sc.training, 10**6, 10, 1)
    assert step.memory_kind == "optimizer"


def test_a_fraction_above_one_is_refused_with_its_field() -> None:
    raw = load_spec("accelerators", "h100-sxm5-80gb").model_dump()
    raw["memory_fraction_by_kind"] = {"layernorm": 1.7}
    with pytest.raises(UserError, match="memory_fraction_by_kind"):
        validate(Accelerator, raw, "h100.yaml")
