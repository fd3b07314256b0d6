"""benchmarks/time_layers.py: the single-device scenario and llmsim's side always; the
PyTorch side as a CPU smoke run where PyTorch is installed (it is not a dependency)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from llmsim import load_scenario

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "time_layers.py"
_spec = importlib.util.spec_from_file_location("time_layers", SCRIPT)
assert _spec is not None and _spec.loader is not None
time_layers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(time_layers)

GPT3 = load_scenario("selene-gpt3")


def test_single_device_scenario_runs_one_micro_batch_on_one_device() -> None:
    one = time_layers.single_device(GPT3, 2)
    assert one.devices == 1 and one.model.layers == 2 and one.dp == 1
    assert one.training.global_batch == one.parallelism.micro_batch == one.micro_batches
    assert one.parallelism.recompute == "none" and one.training.hidden_dropout == 0
    shrunk = time_layers.single_device(GPT3, 1, shrink=16)
    assert shrunk.model.hidden == GPT3.model.hidden // 16


def test_llmsim_side_grows_with_the_layers() -> None:
    fwd1, both1 = time_layers.predicted_s(time_layers.single_device(GPT3, 1))
    fwd2, both2 = time_layers.predicted_s(time_layers.single_device(GPT3, 2))
    assert 0 < fwd1 < both1 and fwd1 < fwd2 and both1 < both2


def test_layers_cut_to_fit_the_device() -> None:
    small = time_layers.layers_that_fit(GPT3, 1, 40.0)
    large = time_layers.layers_that_fit(GPT3, 1, 80.0)
    assert 1 <= small <= large < GPT3.model.layers


def test_cpu_smoke_run(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    code = time_layers.main(["selene-gpt3", "--device", "cpu", "--layers", "1",
                             "--shrink", "16", "--repeats", "1",
                             "--set", "training.seq_len=128"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "forward+backward" in out and "llmsim/PyTorch" in out
