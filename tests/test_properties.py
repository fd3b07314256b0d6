"""Step-level invariants (hypothesis): more hardware never makes a step slower."""

from __future__ import annotations

import pytest
from helpers import make_scenario
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmsim import simulate

FAST = settings(max_examples=12, deadline=None,
                suppress_health_check=[HealthCheck.too_slow])

layouts = st.sampled_from([
    {"nodes": 2, "parallelism__tp": 2, "parallelism__pp": 2},
    {"nodes": 2, "parallelism__tp": 8, "parallelism__pp": 2, "parallelism__zero": 1},
    {"nodes": 4, "parallelism__tp": 1, "parallelism__pp": 4, "parallelism__schedule": "zb-h1"},
    {"nodes": 2, "parallelism__tp": 4, "parallelism__pp": 1, "parallelism__zero": 3},
    {"nodes": 2, "parallelism__tp": 2, "parallelism__pp": 2,
     "parallelism__schedule": "interleaved-1f1b", "parallelism__virtual_stages": 2,
     "parallelism__overlap_dp_comm": False},
    {"nodes": 2, "parallelism__tp": 8, "parallelism__pp": 2,
     "parallelism__sequence_parallel": True, "parallelism__overlap_tp_comm": True},
    {"nodes": 4, "parallelism__tp": 8, "parallelism__pp": 2, "parallelism__zero": 1,
     "parallelism__overlap_param_gather": True},
    {"nodes": 2, "parallelism__tp": 8, "parallelism__pp": 2,
     "parallelism__pp_scatter_gather": "megatron"},
    {"nodes": 4, "parallelism__tp": 4, "parallelism__pp": 2, "parallelism__zero": 1,
     "parallelism__schedule": "interleaved-1f1b", "parallelism__virtual_stages": 2,
     "parallelism__grad_bucket_nan_check": True, "parallelism__grad_bucket_prescale": True,
     "parallelism__grad_reduce_launch": "pp_aligned"},
    {"nodes": 1, "parallelism__tp": 2, "parallelism__pp": 4,  # posted ops hold NVLink units
     "parallelism__schedule": "interleaved-1f1b", "parallelism__virtual_stages": 2,
     "parallelism__overlap_pp_comm": True},
])
factors = st.floats(min_value=1.0, max_value=8.0)


def _step(layout: dict, **changes) -> float:
    return simulate(make_scenario(training__global_batch=32, **layout, **changes)).step_time_s


@FAST
@given(layout=layouts, factor=factors)
def test_more_fabric_bandwidth_never_slows_a_step(layout, factor):
    base = make_scenario(**layout).system.node.fabric[0]
    tier = base.model_dump() | {"gbps_per_direction": base.gbps_per_direction * factor}
    assert _step(layout, system__node__fabric=[tier]) <= _step(layout) * (1 + 1e-12)


@FAST
@given(layout=layouts, factor=factors)
def test_more_network_bandwidth_never_slows_a_step(layout, factor):
    nic = make_scenario(**layout).system.node.nic_gbit
    assert _step(layout, system__node__nic_gbit=nic * factor) <= _step(layout) * (1 + 1e-12)


@FAST
@given(layout=layouts, factor=factors)
def test_more_peak_flops_never_slows_a_step(layout, factor):
    peak = make_scenario(**layout).system.node.accelerator.dense_tflops.bf16
    faster = _step(layout, system__node__accelerator__dense_tflops__bf16=peak * factor)
    assert faster <= _step(layout) * (1 + 1e-12)


@FAST
@given(layout=layouts, factor=factors)
def test_more_memory_bandwidth_never_slows_a_step(layout, factor):
    hbm = make_scenario(**layout).system.node.accelerator.hbm_tbps
    assert _step(layout, system__node__accelerator__hbm_tbps=hbm * factor) <= _step(layout) * (
        1 + 1e-12)


@FAST
@given(layout=layouts, extra_us=st.floats(min_value=0.0, max_value=100.0))
def test_more_network_step_latency_never_speeds_a_step(layout, extra_us):
    latency = make_scenario(**layout).system.network.step_latency_us
    slower = _step(layout, system__network__step_latency_us=latency + extra_us)
    assert slower >= _step(layout) * (1 - 1e-12)


@FAST
@given(layout=layouts)
def test_stream_usage_and_breakdown_add_up(layout):
    result = simulate(make_scenario(training__global_batch=32, **layout))
    usage = result.stream_usage()
    assert ((usage.busy_s + usage.idle_s - result.step_time_s).abs() < 1e-9).all()
    for stage in result.stages:
        assert abs(sum(stage.as_dict().values()) - result.step_time_s) < 1e-9
        assert min(stage.as_dict().values()) >= 0


@given(comm=st.floats(0.0, 10.0), gemm=st.floats(0.0, 10.0), chunks=st.integers(1, 16))
def test_overlapped_tp_communication_exposes_between_nothing_and_all_of_it(comm, gemm, chunks):
    # Overlap as a whole may slow a step (its GEMMs run in chunks, beside kernels holding
    # SMs, as Transformer Engine's do); what it exposes of a transfer never exceeds it.
    from llmsim.blocks import exposed_overlap_s

    exposed = exposed_overlap_s(comm, gemm, chunks)
    assert -1e-12 <= exposed <= comm + 1e-12


@FAST
@given(layout=layouts, extra=st.integers(1, 64))
def test_more_units_held_by_tp_communication_never_speed_a_step(layout, extra):
    ub = {**layout, "parallelism__sequence_parallel": True,
          "parallelism__overlap_tp_comm": True}
    base = _step({**ub, "parallelism__tp_overlap_comm_units": 16})
    assert _step({**ub, "parallelism__tp_overlap_comm_units": 16 + extra}) >= base * (1 - 1e-12)


@FAST
@given(layout=layouts, units=st.integers(1, 64), more=st.integers(0, 24))
def test_units_held_by_data_parallel_collectives_never_speed_a_step(layout, units, more):
    # At most 88 held beside the 16 of the TP-overlap layout: valid on a 108-SM A100.
    fewer = _step(layout, system__node__collective_units=units)
    assert _step(layout, system__node__collective_units=units + more) >= fewer * (1 - 1e-12)
    assert fewer >= _step(layout) * (1 - 1e-12)


@FAST
@given(layout=layouts, units=st.integers(1, 64))
def test_stream_usage_and_breakdown_add_up_beside_collectives_holding_units(layout, units):
    result = simulate(make_scenario(training__global_batch=32, **layout,
                                    system__node__collective_units=units))
    for stage in result.stages:
        assert abs(sum(stage.as_dict().values()) - result.step_time_s) < 1e-9
        assert min(stage.as_dict().values()) >= 0


@FAST
@given(pp=st.sampled_from([2, 4, 8]), v=st.integers(2, 3), rounds=st.integers(1, 3),
       nodes=st.sampled_from([1, 2, 4]))
def test_posted_interleaved_pipelines_always_finish(pp, v, rounds, nodes):
    """Sends and receives posted ahead, each pair's in stream order, never deadlock."""
    scenario = make_scenario(nodes=nodes, parallelism__tp=1, parallelism__pp=pp,
                             parallelism__schedule="interleaved-1f1b",
                             parallelism__virtual_stages=v, parallelism__overlap_pp_comm=True,
                             model__layers=pp * v * 2, model__max_seq_len=512,
                             training__global_batch=rounds * pp * nodes * 8 // pp)
    result = simulate(scenario)
    assert result.step_time_s > 0
    assert sum(result.breakdown_s.values()) == pytest.approx(result.step_time_s)
