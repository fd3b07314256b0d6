"""``llmsim compare`` and :func:`llmsim.compare.compare` end to end."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import yaml
from helpers import TINY_MODEL, make_scenario
from test_cli import run_cli as cli

from llmsim import simulate
from llmsim.compare import BREAKDOWN, compare


def tiny(tmp_path: Path, name: str, **parallelism: object) -> Path:
    raw = {"name": name, "system": "selene", "nodes": 1, "model": dict(TINY_MODEL),
           "parallelism": {"tp": 2, "pp": 4, **parallelism},
           "training": {"global_batch": 16, "seq_len": 512, "tokens": 1e9}}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return path


def test_compare_function_rows_follow_the_results():
    results = {"1f1b": simulate(make_scenario()),
               "gpipe": simulate(make_scenario(parallelism__schedule="gpipe"))}
    df = compare(results)
    assert list(df["label"]) == ["1f1b", "gpipe"]
    for row, result in zip(df.itertuples(), results.values(), strict=True):
        assert row.step_time_s == result.step_time_s and row.mfu == result.mfu
        parts = sum(getattr(row, f"{part}_s") for part in BREAKDOWN)
        assert parts == pytest.approx(row.step_time_s)  # the parts make up the step
        assert row.memory_gb == max(m.total_bytes for m in result.memory) / 1e9


def test_two_scenario_files_side_by_side_and_as_csv(tmp_path, capsys):
    a, b = tiny(tmp_path, "a"), tiny(tmp_path, "b", schedule="gpipe")
    csv = tmp_path / "out" / "cmp.csv"
    code, out, err = cli(["compare", str(a), str(b), "--csv", str(csv)], capsys)
    assert code == 0, err
    for text in ("step time", "exposed TP comm", "memory per device", "days to train",
                 "a.yaml", "b.yaml", "1f1b", "gpipe"):
        assert text in out
    df = pd.read_csv(csv)
    assert list(df["label"]) == ["a.yaml", "b.yaml"] and list(df["scenario"]) == ["a", "b"]
    expected = simulate(make_scenario(parallelism__schedule="gpipe")).step_time_s
    assert df["step_time_s"][1] == pytest.approx(expected, rel=1e-5)


def test_one_scenario_with_variants(tmp_path, capsys):
    a = tiny(tmp_path, "a")
    csv = tmp_path / "v.csv"
    code, out, err = cli(["compare", str(a), "--variant", "parallelism.micro_batch=2",
                          "--variant", "parallelism.schedule=gpipe parallelism.micro_batch=4",
                          "--csv", str(csv)], capsys)
    assert code == 0, err
    df = pd.read_csv(csv)
    assert len(df) == 3
    assert "mb 1 × 16" in df["layout"][0] and "mb 2 × 8" in df["layout"][1]
    assert "gpipe" in df["layout"][2] and "mb 4 × 4" in df["layout"][2]
    assert "a.yaml [parallelism.micro_batch=2]" in out  # a label with brackets, not markup
    assert "%)" in out  # changes against the first column


def test_compare_errors_are_one_line_and_come_before_simulating(tmp_path, capsys,
                                                                monkeypatch):
    import llmsim.simulation

    a = tiny(tmp_path, "a")
    code, _, err = cli(["compare", str(a)], capsys)
    assert code == 2 and "two or more" in err
    monkeypatch.setattr(llmsim.simulation, "simulate", lambda *a, **k: 1 / 0)
    code, _, err = cli(["compare", str(a), str(a), "--csv", str(tmp_path)], capsys)
    assert code == 2 and "--csv" in err and err.count("\n") == 1
    code, _, err = cli(["compare", str(a), "--variant", "parallelism.tp='4"], capsys)
    assert code == 2 and "--variant" in err
    code, _, err = cli(["compare", str(a), "--variant", "parallelism.tpp=4"], capsys)
    assert code == 2 and "did you mean 'tp'" in err
