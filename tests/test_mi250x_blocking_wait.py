"""The Frontier rows' blocking wait: every FSDP collective the host waits on is exposed.

Both Frontier sources launch with ``NCCL_BLOCKING_WAIT=1`` (FRONTIER24's ``train.sh`` at
8ff4d92; ``TORCH_NCCL_BLOCKING_WAIT=1`` in FRONTIER25's ``train_8B_n8_benchmark.sh`` at d4ffe60),
under which ``wait()`` holds the calling thread until the collective has finished on the device
(ProcessGroupNCCL's ``synchronizeInternal``), and FSDP issues its collectives as synchronous
calls: FSDP1's gathers and both FSDPs' reduce-scatters (choices.yaml ``FRONTIER24`` and
``FRONTIER25``, docs/validation.md section 8, "The Frontier runs waited on every collective").
So no reduce-scatter overlaps the backward in either row, and in FRONTIER24-01 no gather does
either; FRONTIER25-01's forward gathers still overlap the block before (the host waits for
block i + 1's gather while block i's queued kernels run).
"""

from __future__ import annotations

import pytest

from llmsim import validation as v
from llmsim.validation.sensitivity import with_values


def _row(row_id: str):
    return next(r for r in v.load_runs(row_id) if r.id == row_id)


def _dp_ops(result):
    frame = result.to_dataframe()
    return frame[(frame.device == 0) & (frame.stream == "dp")]


def test_the_rows_choose_no_overlap_for_what_the_host_waits_on() -> None:
    fsdp2 = v.scenario_for(_row("FRONTIER25-01")).parallelism
    assert not fsdp2.overlap_dp_comm and fsdp2.prefetch_weights and fsdp2.overlap_param_gather
    fsdp1 = v.scenario_for(_row("FRONTIER24-01")).parallelism
    assert not fsdp1.overlap_dp_comm and fsdp1.prefetch_weights == "forward"


def test_fsdp2_exposes_exactly_its_reduce_scatters() -> None:
    """FRONTIER25-01: the exposed data-parallel time is the sum of its reduce-scatters (one
    a block, 32, and the embedding's and the head's buckets: 0.45 s), the forward gathers stay
    hidden, and the step is longer than with the overlap by about that sum."""
    run = _row("FRONTIER25-01")
    result = v.predict(run).result
    dp = _dp_ops(result)
    reduce_scatters = dp[dp.name.str.startswith("dp_rs_")]
    rs_s = reduce_scatters.duration_s.sum()
    assert len(reduce_scatters) >= 32
    assert result.breakdown_s["dp_comm"] == pytest.approx(rs_s, rel=0.03)
    assert result.breakdown_s["dp_comm"] < 0.9 * dp.duration_s.sum()
    overlapped = v.predict(with_values(run, {"parallelism.overlap_dp_comm": True})).result
    added_s = result.step_time_s - overlapped.step_time_s
    assert added_s == pytest.approx(rs_s, rel=0.1)


def test_fsdp1_exposes_every_collective() -> None:
    """FRONTIER24-01: with the gathers and the reduce-scatters waited on, the exposed
    data-parallel time is all of the DP stream's work; with the forward's gathers behind
    the queued compute (prefetch_weights: forward), all of it but those, less the step's
    first layer's."""
    run = _row("FRONTIER24-01")
    waited = v.predict(with_values(run, {"parallelism.prefetch_weights": False})).result
    dp = _dp_ops(waited)
    assert set(dp.kind) == {"F", "W"}
    assert waited.breakdown_s["dp_comm"] == pytest.approx(dp.duration_s.sum(), rel=0.01)
    result = v.predict(run).result
    dp = _dp_ops(result)
    # each layer gathered for the forward, the recompute and the backward: a third of the
    # gathers are the forward's, and of those only the first of 32 layers waits
    forward_s = dp[dp.name.str.startswith("z3_ag")].duration_s.sum() / 3
    assert result.breakdown_s["dp_comm"] == pytest.approx(
        dp.duration_s.sum() - forward_s + forward_s / 32, rel=0.01)
