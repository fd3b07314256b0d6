"""FRONTIER24-01's FSDP traffic as train.sh and train.py make it (docs/validation.md §8,
"Frontier: Hugging Face Accelerate on 64 nodes"): every nn.Linear its own FSDP unit (7 a
Llama layer), each gathered three times a step (forward, the checkpoint's recompute,
backward) and reduce-scattered once, every call waited on with the 10 ms poll of
NCCL_BLOCKING_WAIT."""

from __future__ import annotations

import pytest

from llmsim import validation as v
from llmsim.validation import sensitivity as sens
from llmsim.workload import build_workload

ROW = next(r for r in v.load_runs() if r.id == "FRONTIER24-01")
UNITS_PER_LAYER = 7  # q, k, v, o, gate, up, down (LlamaDecoderLayer's nn.Linear modules)
LAYERS = 32
GATHERS_PER_UNIT = 3  # forward, recompute forward, backward
RING_STEPS = 511  # an all-gather or reduce-scatter over 512 GCDs
STEP_FLOOR_S = 30.9e-6  # frontier.yaml network.ring_step_floor.network_us
POLL_S = 0.010  # kSynchronizeBusyWaitMillis


def _workload(scenario):
    return build_workload(scenario.model, scenario.parallelism, scenario.training, scenario.dp)


def test_each_linear_is_a_unit_gathered_three_times_and_reduced_once():
    work = _workload(v.scenario_for(ROW))
    (chunk,) = work.chunks.values()
    assert work.gather_messages == UNITS_PER_LAYER and work.regather_for_recompute
    assert len(work.weight_gathers(chunk)) == LAYERS
    ((buckets, bucket),) = work.dp_grad_buckets(chunk)
    assert buckets == UNITS_PER_LAYER * LAYERS
    # equal shares of the weights (the embedding's and head's spread over the layers)
    assert bucket.bytes == pytest.approx(work.weight_gather(chunk).bytes)
    assert bucket.bytes == pytest.approx(chunk.params * 2 / buckets)


def test_without_module_count_the_fused_qkv_default_is_kept():
    """modules_per_layer None: QKV, attention output and the MLP's three, as before."""
    scenario = v.scenario_for(sens.with_values(ROW, {"parallelism.modules_per_layer": None}))
    assert _workload(scenario).gather_messages == 5


def test_exposed_fsdp_time_is_every_call_at_the_step_floor_seen_at_the_next_poll():
    """Every call (35.9-71.7 MB over 512 GCDs) is bounded by RCCL's step floor, 511 x 30.9
    us = 15.8 ms, and the host sees it at the 20 ms poll; all are exposed (blocking wait)
    but the forward's gathers after the first layer's, which run under the previous layer's
    queued kernels (prefetch_weights: forward): (2 x 7 x 32 gathers + 7 first-layer ones +
    7 x 32 reduce-scatters) x 20 ms = 13.58 s; 17.92 s with every gather waited for."""
    floor_s = RING_STEPS * STEP_FLOOR_S
    assert 0.01 < floor_s < 0.02
    result = v.predict(ROW).result
    assert result.breakdown_s["dp_comm"] == pytest.approx(_exposed_calls() * 2 * POLL_S,
                                                          rel=1e-6)
    waited = v.predict(sens.with_values(ROW, {"parallelism.prefetch_weights": False}))
    calls = (GATHERS_PER_UNIT + 1) * UNITS_PER_LAYER * LAYERS
    assert waited.result.breakdown_s["dp_comm"] == pytest.approx(calls * 2 * POLL_S,
                                                                 rel=1e-6)


def _exposed_calls() -> int:
    """The calls the host waits for with nothing queued: the recompute's and the
    backward's gathers, the reduce-scatters and the step's first forward layer's gathers."""
    waited_per_unit = (GATHERS_PER_UNIT - 1) + 1  # recompute and backward gathers, the RS
    return waited_per_unit * UNITS_PER_LAYER * LAYERS + UNITS_PER_LAYER


def test_the_poll_adds_the_rounding_of_each_call_and_nothing_else():
    base = v.predict(ROW).result
    no_poll = v.predict(sens.with_values(ROW, {"parallelism.collective_wait_poll_ms": 0.0}))
    launch_s = v.scenario_for(ROW).system.node.accelerator.kernel_launch_us * 1e-6
    unpolled_s = RING_STEPS * STEP_FLOOR_S + launch_s  # the floor and the call's launch
    added = base.step_time_s - no_poll.result.step_time_s
    assert added == pytest.approx(_exposed_calls() * (2 * POLL_S - unpolled_s), rel=1e-6)
    assert no_poll.result.breakdown_s["compute"] == pytest.approx(base.breakdown_s["compute"])


def test_the_poll_makes_the_row_a_step_function_of_rccls_step_time():
    """Every call is seen at 20 ms while 511 steps (and the launch) fit in 20 ms, up to
    about 39.1 µs a step; past it at 30 ms, 896 × 10 ms more (docs/validation.md §8), with
    every gather waited for (at 30 ms the forward's 7 gathers a layer outlast its compute,
    so with ``prefetch_weights: forward`` they no longer hide whole)."""
    def step_s(network_us):
        run = sens.with_values(ROW, {"system_set.network.ring_step_floor.network_us":
                                     network_us, "parallelism.prefetch_weights": False})
        return v.predict(run).result.step_time_s

    base = step_s(30.9)
    assert step_s(25.0) == pytest.approx(base) and step_s(39.0) == pytest.approx(base)
    calls = (GATHERS_PER_UNIT + 1) * UNITS_PER_LAYER * LAYERS
    assert step_s(39.2) - base == pytest.approx(calls * POLL_S, rel=1e-6)


def test_the_search_estimator_prices_the_units_and_the_poll_as_the_engine_does():
    from llmsim.search.estimate import Estimator
    from llmsim.simulation import simulate

    waited = v.scenario_for(sens.with_values(ROW, {"parallelism.prefetch_weights": False}))
    assert Estimator().estimate(waited).step_time_s == pytest.approx(
        simulate(waited).step_time_s, rel=1e-3)
    # with the forward's gathers ahead, the estimator's forward (the slower of compute and
    # gathers) misses the step's first layer's 7 gathers (0.14 s), as with prefetch on
    scenario = v.scenario_for(ROW)
    assert Estimator().estimate(scenario).step_time_s == pytest.approx(
        simulate(scenario).step_time_s, rel=1e-2)
