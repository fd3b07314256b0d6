"""benchmarks/zero3_decomposition.py: a ZeRO-3 row's step taken apart (docs/validation.md,
section 1): the parts add up to llmsim's step, the bandwidth arithmetic, bad input."""

from __future__ import annotations

import pytest
from helpers import load_script

from llmsim.validation import load_runs, predict

ROW = "NAR21-T2-01"


def _script():
    return load_script("benchmarks/zero3_decomposition.py", "zero3_decomposition_script")


def test_the_parts_add_up_to_the_validated_step() -> None:
    run = next(r for r in load_runs(ROW) if r.id == ROW)
    d = _script().decompose(run)
    prediction = predict(run)
    assert d.step_s == pytest.approx(prediction.result.step_time_s)
    # the gathers are synchronous and the reductions follow the backward: nothing overlaps
    gathers_s = d.gathers * (d.gather_nccl_s + d.gather_host_s + d.gather_copies_s)
    reduces_s = d.all_reduces * (d.all_reduce_nccl_s + d.all_reduce_passes_s)
    # and the persistent parameters' gather follows the optimizer step
    assert d.post_step_s > 0
    assert d.compute_s + gathers_s + reduces_s + d.post_step_s == pytest.approx(d.step_s,
                                                                                rel=0.002)
    # the measured step is the one the validation compares with: predicted / (1 + error)
    assert d.measured_s == pytest.approx(d.step_s * (1 + prediction.error_pct / 100), rel=1e-6)
    assert d.needed_bus_bytes_per_s == pytest.approx(d.bus_bytes / (d.nccl_s + d.shortfall_s))
    assert (d.needed_bus_bytes_per_s < d.model_bus_bytes_per_s) == (d.shortfall_s > 0)


def test_script_prints_the_table_and_refuses_rows_without_zero3(capsys) -> None:
    assert _script().main([ROW]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("| row |") and ROW in printed
    assert _script().main(["ZB24"]) == 2
    assert "error:" in capsys.readouterr().err


def test_the_kinds_add_up_to_the_step_and_the_needed_values_close_it() -> None:
    run = next(r for r in load_runs(ROW) if r.id == ROW)
    script = _script()
    parts = script.by_kind(run)
    assert sum(parts[k] for k in script.KINDS) == pytest.approx(parts["step"], rel=0.002)
    assert all(parts[k] > 0 for k in script.KINDS)
    measured = script.decompose(run).measured_s
    need = script.needed_alone(parts, measured)
    for name, (kind, used) in script.UNVERIFIED.items():
        # the kind scaled by need / used closes the shortfall exactly
        grown = parts["step"] + parts[kind] * (need[name] / used - 1)
        assert grown == pytest.approx(measured, rel=1e-12)
    assert need["launch_us"] > 4.0  # the row is short: every number would have to grow
    assert script.main(["--by-kind", ROW]) == 0
