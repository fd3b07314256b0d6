"""A collective as a polling host sees it (llmsim.costs.collectives.wait_poll): the call
rounded up to whole poll periods (PyTorch's ProcessGroupNCCL under NCCL_BLOCKING_WAIT,
``sleep_for(kSynchronizeBusyWaitMillis)``, 10 ms)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmsim.costs.collectives.wait_poll import polled_s


@pytest.mark.parametrize(("duration_s", "expected_s"), [
    (0.0158, 0.020),  # RCCL's step floor over 512 GCDs, 511 x 30.9 us: the second poll
    (0.001, 0.010),   # a short call is seen at the first poll after the check at issue
    (0.020, 0.020),   # a call that ends on a poll is seen at that poll
    (0.115, 0.120),
])
def test_a_call_is_seen_at_the_first_poll_after_it_ends(duration_s, expected_s):
    assert polled_s(duration_s, 0.010) == pytest.approx(expected_s)


def test_no_poll_and_no_call_leave_the_time_as_it_is():
    assert polled_s(0.0158, 0.0) == 0.0158
    assert polled_s(0.0, 0.010) == 0.0


@given(st.floats(1e-7, 10.0), st.floats(1e-4, 0.1))
def test_polled_time_is_the_next_whole_number_of_periods(duration_s, period_s):
    seen = polled_s(duration_s, period_s)
    assert seen >= duration_s * (1 - 1e-9)
    assert seen - duration_s < period_s * (1 + 1e-9)
    assert math.isclose(seen / period_s, round(seen / period_s), abs_tol=1e-6)


def test_fsdp2_pays_the_poll_only_where_the_host_waits_on_the_critical_path():
    """FRONTIER25-01 (TORCH_NCCL_BLOCKING_WAIT=1, PyTorch 2.7.0.dev20250221: a 1 ms poll):
    FSDP2's reduce-scatters are exposed, so each adds its rounding to whole milliseconds;
    of the forward gathers only the first (nothing queued before it) does, the others
    end under the block before them."""
    from llmsim import validation as v
    from llmsim.validation import sensitivity as sens

    row = next(r for r in v.load_runs("FRONTIER25-01") if r.id == "FRONTIER25-01")
    assert v.scenario_for(row).parallelism.collective_wait_poll_ms == 1.0
    polled = v.predict(row).result
    unpolled = v.predict(sens.with_values(row, {"parallelism.collective_wait_poll_ms": 0.0}))
    frame = unpolled.result.to_dataframe()
    dp = frame[(frame.device == 0) & (frame.stream == "dp")]
    reduce_scatters = dp[dp.name.str.startswith("dp_rs_")].duration_s
    gathers = dp[dp.name.str.startswith("dp_ag_")].sort_values("start_s").duration_s
    assert len(reduce_scatters) >= 33 and len(gathers) == 32
    rounding = [polled_s(t, 0.001) - t for t in reduce_scatters] + [
        polled_s(gathers.iloc[0], 0.001) - gathers.iloc[0]]
    added = polled.step_time_s - unpolled.result.step_time_s
    assert all(0 < r < 0.001 for r in rounding)
    assert added == pytest.approx(sum(rounding), rel=1e-6)
