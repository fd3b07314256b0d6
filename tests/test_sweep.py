"""Sweeps (llmsim.sweeps, ``llmsim sweep``): a grid of simulations of one scenario."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from test_cli import run_cli

import llmsim
from llmsim.sweeps import grid, parse_vary


def _tiny_source() -> dict:
    return {"name": "tiny", "system": "selene", "nodes": 1, "model": "tiny-gpt",
            "parallelism": {"tp": 1, "pp": 1, "dp": 8},
            "training": {"global_batch": 32, "seq_len": 256, "precision": "bf16",
                         "tokens": 1e9}}


def test_the_grid_is_every_combination_first_field_slowest() -> None:
    points = grid({"a": [1, 2], "b": ["x", "y", "z"]})
    assert len(points) == 6
    assert points[0] == {"a": 1, "b": "x"} and points[-1] == {"a": 2, "b": "z"}
    assert parse_vary(["parallelism.micro_batch=1,2,4", "parallelism.sequence_parallel=true"]) \
        == {"parallelism.micro_batch": [1, 2, 4], "parallelism.sequence_parallel": [True]}


def test_each_point_equals_its_own_simulation_and_a_bad_point_is_a_row() -> None:
    source = _tiny_source()
    table = llmsim.sweep(source, {"parallelism.micro_batch": [1, 2, 3]}, workers=1)
    assert list(table["parallelism.micro_batch"]) == [1, 2, 3]
    for mb in (1, 2):
        row = table[table["parallelism.micro_batch"] == mb].iloc[0]
        direct = llmsim.simulate(llmsim.load_scenario(source, {"parallelism.micro_batch": mb}))
        assert row["step_time_s"] == direct.step_time_s
        assert row["mfu"] == pytest.approx(direct.mfu)
    bad = table[table["parallelism.micro_batch"] == 3].iloc[0]
    assert "global_batch" in bad["error"]


def test_a_pool_gives_the_serial_rows() -> None:
    vary = {"parallelism.micro_batch": [1, 2], "nodes": [1, 2]}
    source = _tiny_source()
    source["parallelism"] = {"tp": 1, "pp": 1, "dp": "auto"}
    serial = llmsim.sweep(source, vary, workers=1)
    pooled = llmsim.sweep(source, vary, workers=2)
    pd.testing.assert_frame_equal(serial, pooled)


def test_cli_sweep_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import yaml

    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(_tiny_source()))
    code, out, err = run_cli(["sweep", str(path), "--vary", "parallelism.micro_batch=1,2",
                              "--workers", "1", "--out", str(tmp_path / "out")], capsys)
    assert code == 0, err
    assert "step s" in out and "2 points" in out
    table = pd.read_csv(tmp_path / "out" / "sweep.csv")
    assert len(table) == 2 and (tmp_path / "out" / "sweep.png").exists()


@pytest.mark.parametrize("args, message", [
    (["--vary", "parallelism.micro_batch"], "--vary"),
    (["--vary", "parallelism.micro_batch=1", "--vary", "parallelism.micro_batch=2"], "twice"),
    (["--vary", "parallelism.micro_batch=" + ",".join(["1"] * 10_001)], "points"),
    (["--vary", "parallelism.micro_batch=1", "--format", "xls"], "--format"),
])
def test_cli_sweep_bad_options(args: list[str], message: str,
                               capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["sweep", "selene-gpt3", *args], capsys)
    assert code == 2 and message in err and "Traceback" not in err
