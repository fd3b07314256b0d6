"""Checkpoint size from the layout, its time from the storage, and the Young/Daly interval."""

from __future__ import annotations

import math

import pytest
from helpers import make_scenario
from hypothesis import given
from hypothesis import strategies as st

from llmsim.calendar import checkpoint
from llmsim.calendar.checkpoint import daly_interval_s, young_interval_s
from llmsim.calendar.montecarlo import RunPlan, expected_run
from llmsim.specs import Scenario, Storage


def checkpoint_cost(s: Scenario) -> checkpoint.CheckpointCost:
    return checkpoint.checkpoint_cost(s.model, s.parallelism, s.training, s.dp, s.system,
                                      s.calendar.snapshot_gbps)


def test_size_is_weights_and_adam_state_of_every_parameter_once():
    s = make_scenario(parallelism__tp=1, parallelism__pp=1)
    cost = checkpoint_cost(s)
    assert cost.total_bytes == 14 * s.model.params  # 2 (bf16 weight) + 12 (fp32 Adam)
    assert cost.per_device_bytes == pytest.approx(cost.total_bytes / s.dp)


def test_fp32_training_saves_8_bytes_of_moments_beside_4_of_weight():
    s = make_scenario(parallelism__tp=1, parallelism__pp=1, training__precision="fp32")
    assert checkpoint_cost(s).total_bytes == 12 * s.model.params


def test_tensor_and_pipeline_shards_cover_the_model():
    flat = checkpoint_cost(make_scenario(parallelism__tp=1, parallelism__pp=1))
    s = make_scenario()  # tp 2, pp 4, tied embeddings, layernorm, biases
    split = checkpoint_cost(s)
    h, layers = s.model.hidden, s.model.layers
    # beyond one copy of each parameter: the last stage's copy of the tied embedding
    # (Megatron keeps one there when pp > 1), and on the second TP rank the replicated
    # two layernorms (2·2h) and two row-parallel biases (2h) per layer and the final norm
    tied_copy = s.model.vocab * h
    replicated = (s.parallelism.tp - 1) * (layers * 6 * h + 2 * h)
    assert split.total_bytes - flat.total_bytes == 14 * (tied_copy + replicated)


def test_write_time_is_the_slower_of_the_file_system_and_the_node():
    s = make_scenario()
    node_bytes_per_s = s.system.node.injection_bytes_per_s
    fs = Storage(name="fs", write_gbps=0.5, read_gbps=1.0)
    slow = checkpoint_cost(s.model_copy(update={"system": s.system.model_copy(
        update={"storage": fs})}))
    assert slow.write_s == pytest.approx(slow.total_bytes / 0.5e9)
    assert slow.read_s == pytest.approx(slow.total_bytes / 1.0e9)
    unbounded = checkpoint_cost(s)  # no storage in the catalog: the node's injection
    per_node = unbounded.per_device_bytes * s.system.node.devices_per_node
    assert unbounded.write_s == pytest.approx(per_node / node_bytes_per_s)


def test_snapshot_copies_each_device_share_at_the_host_link_rate():
    s = make_scenario(calendar__snapshot_gbps=10)
    cost = checkpoint_cost(s)
    assert cost.snapshot_s == pytest.approx(cost.per_device_bytes / 10e9)


def test_young_and_daly_closed_forms():
    delta, mtbf = 60.0, 3600.0
    assert young_interval_s(delta, mtbf) == pytest.approx(math.sqrt(2 * 60 * 3600))
    x = delta / (2 * mtbf)
    expected = math.sqrt(2 * delta * mtbf) * (1 + math.sqrt(x) / 3 + x / 9) - delta
    assert daly_interval_s(delta, mtbf) == pytest.approx(expected)
    assert daly_interval_s(8000.0, mtbf) == mtbf  # δ ≥ 2M: checkpoint every M
    assert math.isinf(daly_interval_s(delta, math.inf))


@given(st.floats(1.0, 600.0), st.floats(1800.0, 200_000.0))
def test_daly_interval_is_near_the_minimum_of_the_expected_run(delta, mtbf):
    def wall(tau: float) -> float:
        plan = RunPlan(work_s=1e4 * mtbf, interval_s=tau, checkpoint_s=delta, restart_s=0.0,
                       rate_per_s=1 / mtbf)
        return expected_run(plan).wall_s

    tau = daly_interval_s(delta, mtbf)
    best = min(wall(tau * f) for f in (0.5, 0.7, 0.85, 0.95, 1.05, 1.2, 1.5, 2.0))
    assert wall(tau) <= best * (1 + 1e-3)
