"""Compute cost model: roofline, GEMM tile/wave quantisation, attention, measured tables."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmsim.calibration import GemmPoint
from llmsim.costs.compute import (
    ComputeModel,
    GemmTable,
    flash_attention_flops,
    gemm_efficiency,
    gemm_shape,
)
from llmsim.ops import ComputeOp
from llmsim.specs import Accelerator

PEAK_TFLOPS = 300.0
UNITS = 100


def accelerator(**overrides: Any) -> Accelerator:
    """A GPU-like device with round numbers: 300 TF bf16, 2 TB/s, 100 units of 128×128 tiles."""
    raw: dict[str, Any] = {
        "name": "test-gpu",
        "dense_tflops": {"bf16": PEAK_TFLOPS, "fp32": 20.0},
        "hbm_gb": 80,
        "hbm_tbps": 2.0,
        "gemm": {
            "peak_fraction": 0.8,
            "compute_units": UNITS,
            "tile_m": 128,
            "tile_n": 128,
            "k_fill": 64,
        },
        "memory_bound_fraction": 0.9,
        "attention_fraction": 0.5,
        "kernel_launch_us": 5.0,
    }
    for key, value in overrides.items():
        if isinstance(value, dict):
            raw[key] = {**raw.get(key, {}), **value}
        else:
            raw[key] = value
    return Accelerator.model_validate(raw)


def gemm_op(m: int, n: int, k: int, batch: int = 1, bytes_: float = 0.0) -> ComputeOp:
    return ComputeOp("g", "gemm", "F", 2.0 * m * n * k * batch, bytes_, (m, n, k), batch)


def test_wave_quantisation_one_more_tile_than_units_takes_two_waves() -> None:
    model = ComputeModel(accelerator(kernel_launch_us=0.0), "bf16")
    full = gemm_op(128 * 10, 128 * 10, 4096)  # 100 tiles: one full wave
    spill = gemm_op(128 * 101, 128, 4096)  # 101 tiles: a second, nearly empty wave
    assert gemm_shape(128 * 101, 128, 4096, 1, accelerator().gemm).waves == 2
    assert model.compute_s(spill) / model.compute_s(full) == pytest.approx(2.0)


def test_full_wave_gemm_closed_form() -> None:
    acc = accelerator()
    model = ComputeModel(acc, "bf16")
    m, n, k = 1280, 1280, 4096
    eta = 0.8 * 1.0 * k / (k + 64)
    assert gemm_efficiency(m, n, k, 1, acc.gemm) == pytest.approx(eta)
    expected = 2 * m * n * k / (PEAK_TFLOPS * 1e12 * eta) + 5e-6
    assert model.compute_s(gemm_op(m, n, k)) == pytest.approx(expected)


def test_tile_quantisation_counts_the_padding_as_work() -> None:
    model = ComputeModel(accelerator(), "bf16")
    assert model.compute_s(gemm_op(129, 1280, 4096)) == model.compute_s(gemm_op(256, 1280, 4096))
    shape = gemm_shape(129, 1280, 4096, 1, accelerator().gemm)
    assert shape.padded_flops == 2 * 256 * 1280 * 4096


def test_batched_gemm_tiles_multiply() -> None:
    shape = gemm_shape(128, 128, 64, 250, accelerator().gemm)
    assert (shape.tiles, shape.waves, shape.wave_efficiency) == (250, 3, pytest.approx(250 / 300))


def test_memory_bound_kernel_and_roofline() -> None:
    model = ComputeModel(accelerator(), "bf16")
    norm = ComputeOp("ln", "memory", "F", 0.0, 1.8e9)
    assert model.compute_s(norm) == pytest.approx(1.8e9 / (2e12 * 0.9) + 5e-6)
    # A skinny GEMM whose operands dominate is priced by its bytes.
    skinny = gemm_op(128, 128, 1 << 20, bytes_=4e10)
    assert model.compute_s(skinny) == pytest.approx(4e10 / 1.8e12 + 5e-6)


def test_attention_at_attention_fraction_of_executed_flops() -> None:
    model = ComputeModel(accelerator(kernel_launch_us=0.0), "bf16")
    op = ComputeOp("attn", "attention", "F", 1e12, 0.0, executed_fraction=0.5)
    assert model.compute_s(op) == pytest.approx(0.5e12 / (PEAK_TFLOPS * 1e12 * 0.5))


@pytest.mark.parametrize("held", [0, 10, 50])
def test_attention_beside_kernels_that_hold_units_runs_on_the_units_left(held: int) -> None:
    model = ComputeModel(accelerator(kernel_launch_us=0.0), "bf16")
    op = ComputeOp("attn", "attention", "F", 1e12, 0.0, executed_fraction=0.5)
    slowed = model.compute_s(replace(op, reserved_units=held))
    assert slowed == pytest.approx(model.compute_s(op) * UNITS / (UNITS - held))


def test_cudnn_attention_at_its_own_fraction() -> None:
    acc = accelerator(kernel_launch_us=0.0, cudnn_attention_fraction=0.8)
    op = ComputeOp("attn", "attention", "F", 1e12, 0.0, executed_fraction=0.5)
    flash = ComputeModel(acc, "bf16").compute_s(op)
    cudnn = ComputeModel(acc, "bf16", attention_kernel="cudnn").compute_s(op)
    assert cudnn == pytest.approx(0.5e12 / (PEAK_TFLOPS * 1e12 * 0.8))
    assert flash == pytest.approx(cudnn * 0.8 / 0.5)  # FlashAttention-2 at attention_fraction


CURVE = {64: {1024: 100.0, 4096: 160.0}, 128: {1024: 120.0, 4096: 200.0}}


def test_flash_curve_closed_forms() -> None:
    # Measured points come back as measured; between sequence lengths the throughput is
    # linear in log2(seq) (2048 is halfway from 1024 to 4096), between head dims linear,
    # and it is held at the ends of both axes.
    assert flash_attention_flops(CURVE, 4096, 128) == pytest.approx(200e12)
    assert flash_attention_flops(CURVE, 2048, 128) == pytest.approx(160e12)
    assert flash_attention_flops(CURVE, 1024, 96) == pytest.approx(110e12)
    assert flash_attention_flops(CURVE, 2048, 96) == pytest.approx(145e12)
    assert flash_attention_flops(CURVE, 256, 128) == pytest.approx(120e12)
    assert flash_attention_flops(CURVE, 65536, 256) == pytest.approx(200e12)
    assert flash_attention_flops(CURVE, 2048, 32) == pytest.approx(130e12)


@given(st.integers(1, 1 << 20), st.integers(1, 512))
def test_flash_curve_stays_within_its_measurements(seq_len: int, head_dim: int) -> None:
    tflops = flash_attention_flops(CURVE, seq_len, head_dim) / 1e12
    assert 100.0 - 1e-9 <= tflops <= 200.0 + 1e-9


def test_flash_attention_priced_by_the_measured_curve_for_its_shape() -> None:
    acc = accelerator(kernel_launch_us=0.0, cudnn_attention_fraction=0.8,
                      flash_attention_tflops=CURVE)
    short = ComputeOp("attn", "attention", "F", 1e12, 0.0, executed_fraction=0.5,
                      attention_shape=(1024, 128))
    long_ = replace(short, attention_shape=(4096, 128))
    flash = ComputeModel(acc, "bf16")
    assert flash.compute_s(short) == pytest.approx(0.5e12 / 120e12)
    assert flash.compute_s(long_) == pytest.approx(0.5e12 / 200e12)
    # Without a shape the op falls back to attention_fraction; cuDNN has its own fraction.
    assert flash.compute_s(replace(short, attention_shape=None)) == pytest.approx(
        0.5e12 / (PEAK_TFLOPS * 1e12 * 0.5))
    cudnn = ComputeModel(acc, "bf16", attention_kernel="cudnn")
    assert cudnn.compute_s(short) == pytest.approx(0.5e12 / (PEAK_TFLOPS * 1e12 * 0.8))


@pytest.mark.parametrize("curve", [{}, {128: {}}])
def test_flash_curve_without_points_is_rejected(curve: dict[int, dict[int, float]]) -> None:
    with pytest.raises(ValueError, match="flash_attention_tflops"):
        accelerator(flash_attention_tflops=curve)


def test_attention_without_fused_kernel_runs_at_gemm_efficiency() -> None:
    model = ComputeModel(accelerator(attention_fraction=0.0, kernel_launch_us=0.0), "bf16")
    op = ComputeOp("attn", "attention", "F", 1e12, 0.0)
    assert model.compute_s(op) == pytest.approx(1e12 / (PEAK_TFLOPS * 1e12 * 0.8))


def test_gemm_without_shape_runs_at_peak_fraction() -> None:
    model = ComputeModel(accelerator(kernel_launch_us=0.0), "bf16")
    op = ComputeOp("g", "gemm", "F", 1e12, 0.0)
    assert model.compute_s(op) == pytest.approx(1e12 / (PEAK_TFLOPS * 1e12 * 0.8))


def test_dtype_selects_the_peak() -> None:
    op = gemm_op(1280, 1280, 4096)
    bf16 = ComputeModel(accelerator(kernel_launch_us=0.0), "bf16").compute_s(op)
    fp32 = ComputeModel(accelerator(kernel_launch_us=0.0), "fp32").compute_s(op)
    assert fp32 / bf16 == pytest.approx(PEAK_TFLOPS / 20.0)


def test_results_are_memoised_per_distinct_op() -> None:
    model = ComputeModel(accelerator(), "bf16")
    a = gemm_op(1024, 1024, 1024)
    b = ComputeOp("other_name", "gemm", "B", a.flops, a.bytes, a.mnk, a.batch)
    assert model.compute_s(a) == model.compute_s(b)
    assert len(model._cache) == 1


def test_a_split_gemm_costs_its_chunks_and_their_launches() -> None:
    # 8 chunks of 1,280 rows: each 10 × 10 = 100 tiles, one full wave; one launch each.
    model = ComputeModel(accelerator(), "bf16")
    whole = gemm_op(10240, 1280, 4096)
    chunk = gemm_op(1280, 1280, 4096)
    split = replace(whole, splits=8)
    launch_s = 5e-6
    assert model.compute_s(split) == pytest.approx(8 * model.compute_s(chunk))
    assert model.compute_s(split) - model.compute_s(whole) == pytest.approx(7 * launch_s)


def test_splitting_below_a_wave_pays_the_idle_units() -> None:
    # 2,560 rows are 20 × 10 = 200 tiles (two full waves); 8 chunks of 320 rows pad to
    # 3 × 10 = 30 tiles each, a third of a wave: 8 waves instead of 2.
    model = ComputeModel(accelerator(kernel_launch_us=0.0), "bf16")
    whole = gemm_op(2560, 1280, 4096)
    assert model.compute_s(replace(whole, splits=8)) / model.compute_s(whole) == pytest.approx(4.0)


def test_concurrent_chunks_share_the_units() -> None:
    # 8 chunks of 320 rows, 30 tiles each: one after another they take 8 waves; three at a
    # time on three streams 90 tiles are resident, so the 240 tiles take ⌈240/90⌉ = 3.
    model = ComputeModel(accelerator(kernel_launch_us=0.0), "bf16")
    whole = gemm_op(2560, 1280, 4096)
    one = model.compute_s(replace(whole, splits=8))
    three = model.compute_s(replace(whole, splits=8, concurrent_splits=3))
    assert three / one == pytest.approx(3 / 8)
    # Chunks larger than a wave: on one stream each pays its partial wave (4 × 2 waves of
    # 150 tiles on 100 units); together the 600 tiles fill 6.
    big = gemm_op(4 * 1920, 1280, 4096)
    assert model.compute_s(replace(big, splits=4)) == pytest.approx(8 * model.compute_s(
        gemm_op(1280, 1280, 4096)))
    assert model.compute_s(replace(big, splits=4, concurrent_splits=3)) == pytest.approx(
        6 * model.compute_s(gemm_op(1280, 1280, 4096)))


@settings(max_examples=60, deadline=None)
@given(m=st.integers(1, 20000), n=st.integers(1, 20000), k=st.integers(1, 8192),
       splits=st.integers(1, 8), streams=st.integers(1, 4), held=st.integers(0, UNITS - 1))
def test_splitting_never_beats_the_whole_gemm_and_streams_never_slow_it(
        m: int, n: int, k: int, splits: int, streams: int, held: int) -> None:
    model = ComputeModel(accelerator(kernel_launch_us=0.0), "bf16")
    whole = replace(gemm_op(m, n, k), reserved_units=held)
    split = replace(whole, splits=splits)
    assert model.compute_s(split) >= model.compute_s(whole) * (1 - 1e-12)
    together = model.compute_s(replace(split, concurrent_splits=streams))
    assert model.compute_s(whole) * (1 - 1e-12) <= together <= model.compute_s(split) * (1 + 1e-12)


def test_units_held_by_other_kernels_cost_waves_not_speed() -> None:
    model = ComputeModel(accelerator(kernel_launch_us=0.0), "bf16")
    op = gemm_op(128 * 10, 128 * 8, 4096)  # 80 tiles: one wave on 100 units or on 80
    assert model.compute_s(replace(op, reserved_units=20)) == pytest.approx(model.compute_s(op))
    held = replace(op, reserved_units=21)  # 79 units left: a second wave
    assert model.compute_s(held) == pytest.approx(2 * model.compute_s(op))


# -- the library's configurations: other tiles, split-K ------------------------------------

def test_split_k_fills_the_units_a_few_tiles_leave_idle() -> None:
    # 128 × 1,280 is 10 tiles of 100 units: K = 65,536 in s ≤ 10 parts makes 10·s tiles
    # over K/s each, plus a reduction that reads the s FP32 partial sums and writes the
    # BF16 output, (2·4·s + 2)·M·N bytes at 1.8 TB/s. Ten parts fill the wave.
    acc = accelerator(kernel_launch_us=0.0, gemm={"split_k": True})
    m, n, k = 128, 1280, 65536
    per_tile_s = 2 * 128 * 128 * UNITS / (PEAK_TFLOPS * 1e12 * 0.8)
    ten_parts = per_tile_s * (k / 10 + 64) + (2 * 4 * 10 + 2) * m * n / 1.8e12
    whole = per_tile_s * (k + 64)
    model = ComputeModel(acc, "bf16")
    assert model.compute_s(gemm_op(m, n, k)) == pytest.approx(ten_parts)
    assert ComputeModel(accelerator(kernel_launch_us=0.0), "bf16").compute_s(
        gemm_op(m, n, k)) == pytest.approx(whole)


def test_split_k_is_left_to_gemms_below_one_wave() -> None:
    acc = accelerator(kernel_launch_us=0.0)
    split = accelerator(kernel_launch_us=0.0, gemm={"split_k": True})
    op = gemm_op(128 * 10, 128 * 10, 1 << 16)  # 100 tiles: a full wave
    assert ComputeModel(split, "bf16").compute_s(op) == ComputeModel(acc, "bf16").compute_s(op)


def test_a_gemm_takes_the_tile_that_finishes_it_first() -> None:
    # 640 × 640 on 256 × 128 tiles is 3 × 5 = 15 tiles padded to 768 rows; on 128 × 128
    # tiles 25, no padding: both fill less than one wave, and a unit's one tile is half the
    # work on the smaller tile.
    big = accelerator(kernel_launch_us=0.0, gemm={"tile_m": 256})
    both = accelerator(kernel_launch_us=0.0, gemm={"tile_m": 256, "extra_tiles": [[128, 128]]})
    op = gemm_op(640, 640, 4096)
    ratio = ComputeModel(both, "bf16").compute_s(op) / ComputeModel(big, "bf16").compute_s(op)
    assert ratio == pytest.approx(0.5)  # one wave of 128 × 128 tiles against one of 256 × 128


gemm_shapes = st.tuples(st.integers(1, 20000), st.integers(1, 20000), st.integers(1, 1 << 16))
LIBRARY = {"split_k": True, "extra_tiles": [[64, 256], [128, 64]]}


@settings(max_examples=200, deadline=None)
@given(shape=gemm_shapes, held=st.integers(0, UNITS - 1))
def test_more_configurations_never_run_a_gemm_slower(shape: tuple[int, int, int],
                                                       held: int) -> None:
    op = replace(gemm_op(*shape), reserved_units=held)
    plain = ComputeModel(accelerator(), "bf16").compute_s(op)
    assert ComputeModel(accelerator(gemm=LIBRARY), "bf16").compute_s(op) <= plain * (1 + 1e-12)


@settings(max_examples=200, deadline=None)
@given(shape=gemm_shapes, dm=st.integers(0, 5000), dn=st.integers(0, 5000),
       dk=st.integers(0, 5000))
def test_with_split_k_and_more_tiles_a_bigger_gemm_never_runs_faster(
        shape: tuple[int, int, int], dm: int, dn: int, dk: int) -> None:
    model = ComputeModel(accelerator(gemm=LIBRARY), "bf16")
    m, n, k = shape
    assert model.compute_s(gemm_op(m + dm, n + dn, k + dk)) >= model.compute_s(
        gemm_op(m, n, k)) * (1 - 1e-12)

# -- measured GEMM tables -------------------------------------------------------------------

TABLE = [
    GemmPoint(m=1024, n=1024, k=1024, dtype="bf16", tflops=100.0),
    GemmPoint(m=4096, n=4096, k=4096, dtype="bf16", tflops=200.0),
    GemmPoint(m=2048, n=8192, k=4096, dtype="bf16", tflops=230.0),  # same volume as 4096³
]


def test_table_reproduces_measured_shapes() -> None:
    model = ComputeModel(accelerator(kernel_launch_us=0.0), "bf16", GemmTable(TABLE))
    op = gemm_op(1024, 1024, 1024)
    assert model.compute_s(op) == pytest.approx(op.flops / 100e12)


def test_table_takes_a_measured_shape_as_measured_not_by_volume() -> None:
    table = GemmTable([*TABLE, GemmPoint(m=4096, n=4096, k=4096, dtype="bf16", tflops=210.0)])
    assert table.achieved_flops(4096, 4096, 4096, 1, "bf16") == pytest.approx(205e12)  # mean
    assert table.achieved_flops(2048, 8192, 4096, 1, "bf16") == pytest.approx(230e12)
    # the same volume in another shape, or batched, is looked up by volume
    volume = (200 + 210 + 230) / 3 * 1e12
    assert table.achieved_flops(8192, 2048, 4096, 1, "bf16") == pytest.approx(volume)
    assert table.achieved_flops(2048, 4096, 4096, 2, "bf16") == pytest.approx(volume)
    assert not table.covers("fp8")


def test_table_interpolates_in_log_volume_and_clamps() -> None:
    table = GemmTable(TABLE)
    mid = table.achieved_flops(2048, 2048, 2048, 1, "bf16")  # halfway in log(MNK)
    assert mid == pytest.approx((100 + (200 + 230) / 2) / 2 * 1e12)
    assert table.achieved_flops(8, 8, 8, 1, "bf16") == 100e12
    assert table.achieved_flops(1 << 15, 1 << 15, 1 << 15, 1, "bf16") == pytest.approx(215e12)
    assert table.achieved_flops(1024, 1024, 256, 4, "bf16") == 100e12  # batch·M·N·K


def test_units_held_slow_a_measured_table_in_proportion() -> None:
    model = ComputeModel(accelerator(kernel_launch_us=0.0), "bf16", GemmTable(TABLE))
    op = gemm_op(1024, 1024, 1024)
    held = model.compute_s(replace(op, reserved_units=20))
    assert held == pytest.approx(model.compute_s(op) * UNITS / (UNITS - 20))


def test_table_without_the_dtype_falls_back_to_the_model() -> None:
    op = gemm_op(1280, 1280, 4096)
    plain = ComputeModel(accelerator(), "fp32").compute_s(op)
    assert ComputeModel(accelerator(), "fp32", GemmTable(TABLE)).compute_s(op) == plain


# -- monotonicity ---------------------------------------------------------------------------

ops = st.one_of(
    st.builds(
        gemm_op,
        st.integers(1, 20000),
        st.integers(1, 20000),
        st.integers(1, 20000),
        st.integers(1, 64),
        st.floats(0, 1e10),
    ),
    st.builds(
        lambda f, b: ComputeOp("a", "attention", "F", f, b), st.floats(0, 1e14), st.floats(0, 1e10)
    ),
    st.builds(lambda b: ComputeOp("n", "memory", "F", 0.0, b), st.floats(0, 1e10)),
)


@settings(max_examples=200, deadline=None)
@given(op=ops, gain=st.floats(1.0, 10.0))
def test_more_peak_or_hbm_bandwidth_never_takes_longer(op: ComputeOp, gain: float) -> None:
    base = ComputeModel(accelerator(), "bf16").compute_s(op)
    faster_math = ComputeModel(
        accelerator(dense_tflops={"bf16": PEAK_TFLOPS * gain}), "bf16"
    ).compute_s(op)
    faster_memory = ComputeModel(accelerator(hbm_tbps=2.0 * gain), "bf16").compute_s(op)
    assert faster_math <= base * (1 + 1e-12)
    assert faster_memory <= base * (1 + 1e-12)


@settings(max_examples=200, deadline=None)
@given(
    m=st.integers(1, 20000),
    n=st.integers(1, 20000),
    k=st.integers(1, 20000),
    dm=st.integers(0, 5000),
    dn=st.integers(0, 5000),
    dk=st.integers(0, 5000),
)
def test_a_bigger_gemm_never_runs_faster(m: int, n: int, k: int, dm: int, dn: int, dk: int) -> None:
    model = ComputeModel(accelerator(), "bf16")
    small = model.compute_s(gemm_op(m, n, k))
    assert model.compute_s(gemm_op(m + dm, n + dn, k + dk)) >= small * (1 - 1e-12)


@settings(max_examples=60, deadline=None)
@given(m=st.integers(1, 20000), n=st.integers(1, 20000), k=st.integers(1, 20000),
       held=st.integers(0, UNITS - 2), more=st.integers(1, UNITS - 1))
def test_more_units_held_never_run_a_gemm_faster(m: int, n: int, k: int, held: int,
                                                more: int) -> None:
    model = ComputeModel(accelerator(), "bf16")
    op = gemm_op(m, n, k)
    fewer = model.compute_s(replace(op, reserved_units=held))
    assert model.compute_s(replace(op, reserved_units=min(held + more, UNITS - 1))) >= fewer


# --- GEMMs off the library's alignment (gemm.unaligned_tflops) ----------------------------

def _h100() -> Accelerator:
    from llmsim.loader import load_spec

    return load_spec("accelerators", "h100-sxm5-80gb")


def _measured_unaligned_bf16() -> list[tuple[int, int, int, float]]:
    """The BF16 shapes of the H100 board's table with a dimension not a multiple of 8:
    (M, N, K, measured seconds)."""
    import csv
    from pathlib import Path

    path = Path(__file__).parent / "data" / "gemm_h100_sxm5_2026_11.csv"
    with path.open() as f:
        rows = csv.DictReader(line for line in f if not line.startswith("#"))
        return [(int(r["m"]), int(r["n"]), int(r["k"]), float(r["time_us"]) * 1e-6)
                for r in rows
                if r["dtype"] == "bf16" and any(int(r[d]) % 8 for d in "mnk")]


def test_misaligned_gemms_take_the_board_measured_rate() -> None:
    """The 12 misaligned BF16 shapes timed on the H100 (an unpadded 50,257-word vocabulary
    split 4 and 8 ways): together priced within 1 % of their measured time at the board's
    power limit (the catalog's rate is their harmonic mean), each within 10 %."""
    shapes = _measured_unaligned_bf16()
    assert len(shapes) == 12
    model = ComputeModel(_h100(), "bf16")
    priced = [model.compute_s(ComputeOp("g", "gemm", "F", 2.0 * m * n * k, 0.0, mnk=(m, n, k)))
              for m, n, k, _ in shapes]
    measured = [s for *_, s in shapes]
    assert sum(priced) == pytest.approx(sum(measured), rel=0.01)
    for p, s in zip(priced, measured, strict=True):
        assert p == pytest.approx(s, rel=0.10)


def test_aligned_neighbours_keep_the_tile_model() -> None:
    """Padding the columns to a multiple of 8 (6,283 → 6,288) brings the GEMM back to the
    tile model, more than 4× faster; an accelerator without ``unaligned_tflops`` prices the
    misaligned shape like its aligned neighbour."""
    h100 = _h100()
    model = ComputeModel(h100, "bf16")

    def seconds(n: int, m: ComputeModel = model) -> float:
        return m.compute_s(ComputeOp("g", "gemm", "F", 2.0 * 2048 * n * 12288, 0.0,
                                     mnk=(2048, n, 12288)))

    assert seconds(6283) > 4 * seconds(6288)
    plain = h100.model_copy(update={"gemm": h100.gemm.model_copy(update={"unaligned_tflops": {}})})
    without = ComputeModel(plain, "bf16")
    assert seconds(6283, without) == pytest.approx(seconds(6288, without), rel=0.01)


def test_misaligned_rate_follows_the_clock_like_timed_shapes() -> None:
    """Under a power limit above every draw the misaligned rate rises by the same clock
    ratio as a shape timed on the board (``gemm.measured_tflops``): both were timed at the
    sustained GEMM clock."""
    from llmsim.costs.clocks import sustained_mhz

    h100 = _h100()
    clocks = h100.clocks
    assert clocks is not None
    op = ComputeOp("g", "gemm", "F", 2.0 * 2048 * 6283 * 12288, 0.0, mnk=(2048, 6283, 12288))
    at_limit = ComputeModel(h100, "bf16").math_s(op)
    raised = ComputeModel(h100, "bf16", power_limit_w=1e5).math_s(op)
    assert at_limit / raised == pytest.approx(
        clocks.rates_at_mhz["gemm"] / sustained_mhz(clocks, "gemm", clocks.power_limit_w),
        rel=1e-12)


@given(m=st.integers(1, 4096), n=st.integers(1, 4096), k=st.integers(1, 4096),
       dtype=st.sampled_from(["bf16", "fp16", "fp8", "fp32"]))
def test_alignment_is_16_bytes_of_elements(m: int, n: int, k: int, dtype: str) -> None:
    from llmsim.costs.gemm_tables import is_aligned

    elements = {"bf16": 8, "fp16": 8, "fp8": 16, "fp32": 4}[dtype]
    assert is_aligned(m, n, k, dtype, 16) == all(d % elements == 0 for d in (m, n, k))  # type: ignore[arg-type]
