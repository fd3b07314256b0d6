"""benchmarks/time_layers.py: the single-device scenario and llmsim's side always; the
PyTorch side as a CPU smoke run where PyTorch is installed (it is not a dependency)."""

from __future__ import annotations

import pytest
from helpers import load_script

from llmsim import load_scenario

time_layers = load_script("benchmarks/time_layers.py")

GPT3 = load_scenario("selene-gpt3")


def test_single_device_scenario_runs_one_micro_batch_on_one_device() -> None:
    one = time_layers.single_device(GPT3, 2)
    assert one.devices == 1 and one.model.layers == 2 and one.dp == 1
    assert one.training.global_batch == one.parallelism.micro_batch == one.micro_batches
    assert one.parallelism.recompute == "none" and one.training.hidden_dropout == 0
    shrunk = time_layers.single_device(GPT3, 1, shrink=16)
    assert shrunk.model.hidden == GPT3.model.hidden // 16


def test_one_tensor_parallel_rank() -> None:
    rank = time_layers.single_device(GPT3, 2, tp=8)
    assert rank.devices == 8 and rank.parallelism.tp == 8 and rank.dp == 1
    assert rank.system.node.devices_per_node == 8
    whole_fwd, whole_both = time_layers.predicted_s(time_layers.single_device(GPT3, 2))
    rank_fwd, rank_both = time_layers.predicted_s(rank)
    assert rank_fwd < whole_fwd / 4 and rank_both < whole_both / 4  # a share, not the whole


def test_validation_row_as_the_scenario() -> None:
    row = time_layers.resolve("MEGREADME-H100-04", [])
    assert row.system.node.accelerator.name == "h100-sxm5-80gb" and row.parallelism.tp == 8


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
