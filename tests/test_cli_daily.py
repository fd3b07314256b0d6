"""The command line as used every day: help, version, paths, piped output, progress."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import yaml
from helpers import TINY_MODEL
from test_cli import run_cli as cli

from llmsim import progress
from llmsim.calibration import Calibration, parse_gemm_csv, save_calibration

DATA = Path(__file__).parent / "data"




def tiny(tmp_path: Path, **top: object) -> Path:
    raw = {"name": "tiny", "system": "selene", "nodes": 1, "model": dict(TINY_MODEL),
           "parallelism": {"tp": 2, "pp": 4}, "training": {"global_batch": 16,
                                                          "seq_len": 512, "tokens": 1e9}}
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(raw | top), encoding="utf-8")
    return path


@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_help_short_and_long_without_bool_placeholders(flag, capsys):
    code, out, _ = cli([flag], capsys)
    assert code == 0 and "Usage: llmsim" in out and "--version" in out
    code, out, _ = cli(["run", flag], capsys)
    assert code == 0 and "--json" in out and "--set KEY=VALUE" in out
    assert "<bool>" not in out and "<list" not in out


def test_version(capsys):
    from importlib.metadata import version

    code, out, _ = cli(["--version"], capsys)
    assert code == 0 and out.strip() == f"llmsim {version('llmsim')}"


@pytest.mark.parametrize("arg", ["my-scenario.yaml", "no/such/dir/x.yaml", "sub/frontier"])
def test_a_missing_file_is_file_not_found(arg, capsys):
    code, _, err = cli(["run", arg], capsys)
    assert code == 2 and "file not found" in err and "unknown scenario" not in err
    code, _, err = cli(["run", str(DATA)], capsys)
    assert code == 2 and "is a folder" in err
    code, _, err = cli(["run", "frontierr"], capsys)  # a name, not a path
    assert code == 2 and "unknown scenario" in err and "did you mean 'frontier'" in err


def test_out_is_checked_before_simulating(tmp_path, capsys, monkeypatch):
    import llmsim.simulation

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("simulated before --out was checked")

    monkeypatch.setattr(llmsim.simulation, "simulate", never)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    code, _, err = cli(["run", str(tiny(tmp_path)), "--out", str(blocker / "sub")], capsys)
    assert code == 2 and "--out" in err and "cannot write there" in err
    import llmsim.validation

    monkeypatch.setattr(llmsim.validation, "validate", never)
    code, _, err = cli(["validate", "--out", str(blocker / "sub")], capsys)
    assert code == 2 and "cannot write there" in err


def test_piped_errors_stay_on_one_line_and_tables_keep_their_width(tmp_path, capsys):
    long_name = "x" * 150 + ".yaml"
    code, _, err = cli(["run", f"no/{long_name}"], capsys)  # captured: not a terminal
    assert code == 2 and err.count("\n") == 1 and len(err) > 160
    code, out, _ = cli(["catalog", "models"], capsys)
    description = "Dense ~0.49T-parameter GPT-4-scale proxy (NOT GPT-4's real architecture)"
    assert code == 0 and any(description in line for line in out.splitlines())


def test_run_names_the_calibration_profile_in_use(tmp_path, capsys):
    profile = tmp_path / "profile.yaml"
    save_calibration(Calibration(source="tests/data A100",
                                 gemm=parse_gemm_csv(DATA / "gemm_a100.csv")), profile)
    scenario = tiny(tmp_path, calibration=str(profile))
    code, out, err = cli(["run", str(scenario), "--json"], capsys)
    assert code == 0, err
    json.loads(out)  # stdout stays JSON; the note goes to stderr
    assert f"calibration profile in use: {profile}" in err and "tests/data A100" in err
    code, out, _ = cli(["run", str(tiny(tmp_path))], capsys)
    assert code == 0 and "calibration profile" not in out


def test_progress_off_a_terminal_is_a_line_every_few_seconds_with_an_estimate():
    ticks = iter(range(0, 100, 2))  # every item takes two seconds
    stream = io.StringIO()
    items = list(progress.track(list("abcdefghij"), "validating", stream=stream,
                                every_s=5.0, clock=lambda: next(ticks)))
    assert items == list("abcdefghij")
    lines = stream.getvalue().splitlines()
    # The clock reads 0 at the start and 2·(k + 1) before item k: a line at 6, 12, 18 s.
    assert lines[0] == "validating: 2/10 done, 6 s elapsed, about 24 s left (c)"
    assert lines[1] == "validating: 5/10 done, 12 s elapsed, about 12 s left (f)"
    assert len(lines) == 4 and lines[-1] == "validating: 10/10 done in 22 s"


def test_schedule_show_is_bounded(capsys):
    code, _, err = cli(["schedule", "show", "1f1b", "--stages", "100000",
                        "--microbatches", "100000"], capsys)
    assert code == 2 and "16,384" in err and err.count("\n") == 1


def test_time_gemms_runs_the_bundled_script(tmp_path, capsys):
    from llmsim.cli_time_gemms import script_path

    assert script_path().is_file()
    shapes = tmp_path / "shapes.csv"
    code, out, err = cli(["calibrate", "shapes", str(tiny(tmp_path)), "--out", str(shapes)],
                         capsys)
    assert code == 0, err
    assert f"llmsim calibrate time-gemms {shapes}" in out
    table = tmp_path / "gemm.csv"
    args = ["calibrate", "time-gemms", str(shapes), "--out", str(table), "--device", "cpu",
            "--seconds", "0.01", "--max-shapes", "1"]
    try:
        import torch  # noqa: F401
    except ImportError:
        code, out, _ = cli(args, capsys)
        assert code == 1 and "PyTorch is not installed" in out
        return
    code, out, err = cli(args, capsys)
    assert code == 0, err
    from llmsim.calibration import parse_gemm_csv

    assert len(parse_gemm_csv(table)) == 1


def test_time_gemms_needs_a_readable_shapes_file(tmp_path, capsys):
    code, _, err = cli(["calibrate", "time-gemms", str(tmp_path / "none.csv")], capsys)
    assert code == 2 and "file not found" in err
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n", encoding="utf-8")
    try:
        import torch  # noqa: F401
    except ImportError:
        pytest.skip("PyTorch is not installed: the script stops before it reads the CSV")
    code, _, err = cli(["calibrate", "time-gemms", str(bad), "--device", "cpu"], capsys)
    assert code == 2 and "no column" in err


def test_a_long_run_says_how_long_up_front(tmp_path, capsys, monkeypatch):
    import llmsim.cli

    monkeypatch.setattr(llmsim.cli, "LONG_RUN_PASSES", 10)
    code, out, err = cli(["run", str(tiny(tmp_path)), "--json"], capsys)
    assert code == 0 and "layer passes, about" in err
    json.loads(out)
