"""A CPU BLAS's GEMMs by shape from its measured squares (llmsim.costs.cpu_gemm): the
reading at the square of equal volume, the log-linear interpolation and its clamps, the
cap at the catalog's fraction, the thread count's curve, and A64FX's catalog curves
(Fujitsu SSL2 sgemm, BLIS's Fugaku graphs; hardware/accelerators/a64fx.yaml)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from llmsim.costs.compute import ComputeModel
from llmsim.costs.cpu_gemm import (
    cpu_gemm_fraction,
    cpu_gemm_s,
    equal_volume_size,
    square_fraction,
)
from llmsim.loader import load_spec
from llmsim.ops import ComputeOp
from llmsim.specs import Accelerator

CORES = 48
PEAK_FP32 = 6.144e12  # A64FX at 2.0 GHz, FP32
ONE_CORE = [(100, 0.5), (400, 0.8)]
ALL_CORES = [(200, 0.1), (800, 0.4), (3200, 0.9)]


def cpu(cap: float = 1.0, **gemm: Any) -> Accelerator:
    """An A64FX-like device with measured FP32 squares on 1 and 48 threads."""
    return Accelerator.model_validate({
        "name": "test-cpu",
        "dense_tflops": {"fp32": PEAK_FP32 / 1e12, "fp16": 2 * PEAK_FP32 / 1e12},
        "hbm_gb": 32,
        "hbm_tbps": 1.024,
        "gemm": {"peak_fraction": cap, "compute_units": CORES, "tile_m": 64, "tile_n": 64,
                 "batched": "one_matrix_per_unit",
                 "square_fraction": {"fp32": {1: ONE_CORE, CORES: ALL_CORES}}, **gemm},
        "memory_bound_fraction": 0.8,
    })


def test_a_gemm_is_read_at_the_square_of_its_volume():
    assert equal_volume_size(800, 800, 800) == pytest.approx(800)
    assert equal_volume_size(3200, 800, 200) == pytest.approx(800)
    gemm = cpu().gemm
    assert cpu_gemm_fraction(3200, 800, 200, CORES, gemm, "fp32") == pytest.approx(0.4)


def test_measured_sizes_are_exact_and_between_them_linear_in_log_size():
    assert square_fraction(ALL_CORES, 800) == pytest.approx(0.4)
    # 400 is half-way between 200 and 800 in log size.
    assert square_fraction(ALL_CORES, 400) == pytest.approx(0.25)
    assert square_fraction(ALL_CORES, 1600) == pytest.approx(0.65)


def test_outside_the_measured_sizes_the_end_value_holds():
    assert square_fraction(ALL_CORES, 10) == pytest.approx(0.1)
    assert square_fraction(ALL_CORES, 100_000) == pytest.approx(0.9)


def test_repeated_sizes_are_averaged():
    assert square_fraction([(100, 0.2), (100, 0.4), (400, 0.8)], 100) == pytest.approx(0.3)


def test_the_catalog_fraction_caps_the_library_rate():
    gemm = cpu(cap=1 / 3).gemm
    assert cpu_gemm_fraction(3200, 3200, 3200, CORES, gemm, "fp32") == pytest.approx(1 / 3)
    assert cpu_gemm_fraction(200, 200, 200, CORES, gemm, "fp32") == pytest.approx(0.1)


def test_no_curve_for_the_dtype_or_thread_count_means_no_reading():
    gemm = cpu().gemm
    assert cpu_gemm_fraction(800, 800, 800, CORES, gemm, "fp16") is None
    assert cpu_gemm_fraction(800, 800, 800, 12, gemm, "fp32") is None
    assert cpu_gemm_s(800, 800, 800, 1, gemm, PEAK_FP32, "fp16") is None


def test_a_multi_threaded_gemm_runs_on_all_cores_at_their_curve():
    gemm = cpu().gemm
    seconds = cpu_gemm_s(800, 800, 800, 1, gemm, PEAK_FP32, "fp32")
    assert seconds == pytest.approx(2 * 800**3 / (PEAK_FP32 * 0.4))
    # Cores held by other work slow it by compute_units / free cores.
    held = cpu_gemm_s(800, 800, 800, 1, gemm, PEAK_FP32, "fp32", reserved_units=8)
    assert held == pytest.approx(seconds * 48 / 40)


def test_a_batch_dealt_one_matrix_per_core_runs_on_the_one_thread_curve():
    gemm = cpu().gemm
    one = 2 * 400**3 / (PEAK_FP32 / CORES * 0.8)
    assert cpu_gemm_s(400, 400, 400, 48, gemm, PEAK_FP32, "fp32") == pytest.approx(one)
    assert cpu_gemm_s(400, 400, 400, 49, gemm, PEAK_FP32, "fp32") == pytest.approx(2 * one)


def test_a_tiled_batch_runs_its_matrices_in_turn_on_all_cores():
    gemm = cpu(batched="tiled").gemm
    single = cpu_gemm_s(800, 800, 800, 1, gemm, PEAK_FP32, "fp32")
    assert cpu_gemm_s(800, 800, 800, 3, gemm, PEAK_FP32, "fp32") == pytest.approx(3 * single)


@settings(max_examples=60, deadline=None)
@given(m=st.integers(1, 20_000), n=st.integers(1, 20_000), k=st.integers(1, 20_000))
def test_the_fraction_stays_within_the_measured_range_and_the_cap(m, n, k):
    gemm = cpu(cap=0.7).gemm
    fraction = cpu_gemm_fraction(m, n, k, CORES, gemm, "fp32")
    assert 0.1 - 1e-12 <= fraction <= 0.7 + 1e-12


def test_the_compute_model_prices_covered_gemms_from_the_curve_and_fp16_by_tiles():
    model = ComputeModel(cpu(), "fp32")
    op = ComputeOp("fc1", "gemm", "F", 2.0 * 800**3, 0.0, mnk=(800, 800, 800))
    assert model.gemm_math_s(op) == pytest.approx(2 * 800**3 / (PEAK_FP32 * 0.4))
    fp16 = ComputeModel(cpu(), "fp16")
    # 13 × 13 tiles of 64 on 48 cores: 4 waves at the whole fraction of the FP16 peak.
    tiles_s = 2 * 64 * 64 * 800 * 4 * CORES / (2 * PEAK_FP32)
    assert fp16.gemm_math_s(op) == pytest.approx(tiles_s)


# The catalog's A64FX curves (Fujitsu SSL2 sgemm, BLIS's Fugaku graphs).

def test_the_chip_and_the_cmg_carry_ssl2_curves_for_their_thread_counts():
    chip, cmg = load_spec("accelerators", "a64fx"), load_spec("accelerators", "a64fx-cmg")
    assert set(chip.gemm.square_fraction["fp32"]) == {1, 48}
    assert set(cmg.gemm.square_fraction["fp32"]) == {1, 12}
    assert chip.gemm.square_fraction["fp32"][1] == cmg.gemm.square_fraction["fp32"][1]
    for spec in (chip, cmg):
        assert "fp16" not in spec.gemm.square_fraction  # FP16 not measured
        assert "l3_perf_a64fx" in spec.sources["gemm.square_fraction"]


def test_ssl2_reaches_more_than_a_third_of_peak_at_the_rows_linear_layers():
    """At the 124M and 1.3B rows' linear layers (1,024 tokens, h = 768-2,048) SSL2 alone
    runs above the catalog's third of peak on 48 cores; inside PyTorch each runs at the
    catalog's share of that rate (``gemm.framework_share``), not at the third as a ceiling
    (docs/validation.md section 8)."""
    gemm = load_spec("accelerators", "a64fx").gemm
    assert gemm.framework_share is not None
    for m, n, k in [(1024, 2304, 768), (1024, 768, 768), (1024, 6144, 2048),
                    (1024, 8192, 2048), (2048, 8192, 1024)]:
        points = gemm.square_fraction["fp32"][CORES]
        library = square_fraction(points, equal_volume_size(m, n, k))
        assert library > gemm.peak_fraction
        assert cpu_gemm_fraction(m, n, k, CORES, gemm, "fp32") == pytest.approx(
            library * gemm.framework_share, rel=1e-12)


def test_small_gemms_on_48_threads_run_at_the_share_of_the_slow_curve():
    """SSL2 on 48 threads is slow on small squares (0.01 at 144, 0.22 at 432): a GEMM of
    that volume runs at the share of the curve there."""
    gemm = load_spec("accelerators", "a64fx").gemm
    share = gemm.framework_share
    assert share is not None
    assert cpu_gemm_fraction(432, 432, 432, CORES, gemm, "fp32") == pytest.approx(0.219 * share)
    assert cpu_gemm_fraction(64, 64, 64, CORES, gemm, "fp32") == pytest.approx(0.014 * share)


@given(st.integers(48, 8000), st.integers(48, 8000), st.integers(48, 8000),
       st.floats(0.05, 1.0))
@settings(max_examples=50, deadline=None)
def test_with_a_framework_share_the_curve_is_scaled_and_not_capped(m, n, k, share):
    """``gemm.framework_share`` scales the library's rate at every shape (above the third
    of peak as well as below it); without it the third of peak caps the curve."""
    points = [(100, 0.2), (1000, 0.6), (5000, 0.9)]
    capped = cpu(1 / 3, square_fraction={"fp32": {CORES: points}}).gemm
    scaled = cpu(1 / 3, square_fraction={"fp32": {CORES: points}}, framework_share=share).gemm
    library = square_fraction(points, equal_volume_size(m, n, k))
    assert cpu_gemm_fraction(m, n, k, CORES, capped, "fp32") == min(library, 1 / 3)
    assert cpu_gemm_fraction(m, n, k, CORES, scaled, "fp32") == pytest.approx(
        library * share, rel=1e-12)


def test_the_share_reproduces_the_run_that_set_it_and_is_the_same_on_every_a64fx_file():
    """0.3255 is the share at which llmsim's step of the sweep's tuned run of one process per
    CMG (124M, DP 4, 2.2 GHz, retention_state=0, tcmalloc, PyTorch 1.7, no activation
    checkpointing; not a row) is the measured 522.7 s; the chip, the CMG and their boost
    files carry the same share. The run is modelled through FUGAKU-DEV-11's scenario,
    whose recompute is the one its TFLOPs column shows (tests/test_fugaku_sweep_recompute)."""
    from test_fugaku_power_knobs import step_s

    from llmsim import validation as v
    from llmsim.validation.scenarios import scenario_for

    shares = {load_spec("accelerators", name).gemm.framework_share
              for name in ("a64fx", "a64fx-boost", "a64fx-cmg", "a64fx-cmg-boost")}
    assert shares == {0.3255}
    run = next(r for r in v.load_runs("FUGAKU-DEV") if r.id == "FUGAKU-DEV-11")
    assert scenario_for(run).parallelism.recompute == "none"
    tuned = step_s("FUGAKU-DEV-11", boost=True, allocator="caching", retention=False)
    assert tuned == pytest.approx(522.7, rel=1e-3)


SHARE_KEY = "system_set.node.accelerator.gemm.framework_share"
"""The choice that prices a row's GEMMs at PyTorch 1.10's share of SSL2's rate."""


def _build(run) -> str:
    """The PyTorch build a development row ran, as its source labels it (runs.csv)."""
    text = run.row["table_or_figure"] + " " + run.row["notes"]
    builds = {b for b in ("1.7", "1.10") if f"PyTorch {b}" in text}
    assert len(builds) == 1, (run.id, builds)
    return builds.pop()


def test_each_row_runs_its_own_builds_gemm_share():
    """Every development row whose source says PyTorch 1.10 carries 1.10's share as a
    choice, and no PyTorch 1.7 row does (those keep the catalog's, set on 1.7)."""
    from llmsim import validation as v

    runs = v.load_runs("FUGAKU-DEV")
    assert len(runs) == 14
    for run in runs:
        share = v.scenario_for(run).system.node.accelerator.gemm.framework_share
        if _build(run) == "1.10":
            assert run.choices[SHARE_KEY].value == share == 0.4841, run.id
        else:
            assert SHARE_KEY not in run.choices and share == 0.3255, run.id


def test_the_pytorch_1_10_share_reproduces_its_own_run():
    """0.4841 is the share at which llmsim's step of the sweep's tuned PyTorch 1.10 run of
    one process per CMG (the 1.7 run's configuration on the project's own 1.10 build;
    363.6 s, printed 2.28 TFLOP/s = the formula's factor 3, so no recompute; not a row) is
    the measured 363.6 s, set by the procedure that set 1.7's 0.3255 and modelled through
    FUGAKU-DEV-13's scenario, which carries the share as a choice (workloads/validation/
    choices.yaml); 0.4840 gives 363.66 s. At 1.7's share the run was 522.7 s (+43.8 %)."""
    from test_fugaku_power_knobs import step_s

    from llmsim import validation as v
    from llmsim.validation.scenarios import scenario_for

    run = next(r for r in v.load_runs("FUGAKU-DEV") if r.id == "FUGAKU-DEV-13")
    assert scenario_for(run).parallelism.recompute == "none"
    assert run.choices[SHARE_KEY].value == 0.4841
    tuned = step_s("FUGAKU-DEV-13", boost=True, allocator="caching", retention=False)
    assert tuned == pytest.approx(363.6, rel=1e-3)


def test_the_fugaku_scenario_keeps_the_catalogs_share_and_names_the_build():
    """The catalog's Fugaku scenario runs at the catalog's share (PyTorch 1.7's): the
    production run's own build, PyTorch 1.13, has no measured share, and the description
    says so."""
    from llmsim.loader import load_scenario

    scenario = load_scenario("fugaku")
    assert scenario.system.node.accelerator.gemm.framework_share == 0.3255
    assert "PyTorch 1.13" in scenario.description and "0.4841" in scenario.description


@pytest.mark.parametrize("fraction", [0.0, 1.2])
def test_a_fraction_outside_0_1_is_refused_naming_the_field(fraction):
    with pytest.raises(ValidationError, match="square_fraction"):
        cpu(square_fraction={"fp32": {1: [(100, fraction)]}})


def test_a_curve_without_points_is_refused_naming_the_field():
    """An empty list would silently mean 'no curve' (the GEMM keeps peak_fraction)."""
    with pytest.raises(ValidationError, match="square_fraction"):
        cpu(square_fraction={"fp32": {12: []}})
