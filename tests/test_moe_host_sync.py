"""The dropless dispatchers' host synchronisation (llmsim.moe_dispatcher.dispatch_syncs_host): once
per MoE layer's forward, before the dispatch all-to-all, priced as the GPU idle measured
on an H100 (HOST_SYNC_GAP_S)."""

from __future__ import annotations

import pytest

import llmsim
import llmsim.moe as moe
from llmsim import validation as v
from llmsim.ops import CommOp
from llmsim.workload import build_workload

RUNS = {r.id: r for r in v.load_runs()}


def _scenario(dispatcher: str, capacity: float | None = None) -> llmsim.Scenario:
    s = v.scenario_for(RUNS["MBRIDGE-2604-MOE-02"])
    model = s.model.model_copy(update={"moe": s.model.moe.model_copy(
        update={"capacity_factor": capacity})})
    return s.model_copy(update={"model": model, "parallelism": s.parallelism.model_copy(
        update={"moe_dispatcher": dispatcher})})


@pytest.mark.parametrize(("dispatcher", "capacity", "syncs"), [
    ("alltoall", None, True),       # waits on the splits' device-to-host copy
    ("alltoall", 1.25, False),      # dropped and padded: the sizes are known on the host
    ("hybridep", None, True),       # cudaStreamSynchronize in metadata_preprocessing
    ("hybridep", 1.25, False),      # num_permuted_tokens given: non-blocking
    ("deepep", None, True),         # spins on moe_recv_counter
    ("deepep", 1.25, True),         # ... with a capacity too (internode: no num_worst_tokens)
    ("deepep_low_latency", None, False),  # fixed-size buffers
])
def test_which_dispatchers_wait_for_the_counts(dispatcher, capacity, syncs):
    s = _scenario(dispatcher, capacity)
    assert moe.dispatch_syncs_host(s.model.moe, s.parallelism) is syncs
    w = build_workload(s.model, s.parallelism, s.training, s.dp)
    ops = [op for op in w.chunks[(0, 0)].forward + w.chunks[(0, 0)].backward
           if isinstance(op, CommOp) and op.collective == "all_to_all"]
    waits = {op.name: op.host_s for op in ops}
    assert waits.pop("moe_dispatch") == (moe.HOST_SYNC_GAP_S if syncs else 0.0)
    assert set(waits.values()) == {0.0}  # the combine and the backward reuse the counts


def test_the_step_pays_one_wait_per_moe_layer_and_micro_batch(monkeypatch):
    """MBRIDGE-2604-MOE-02 (no pipeline, no all-to-all overlap: every wait is on the
    critical path): 48 MoE layers x 64 micro-batches (1,024 sequences over dp 16), to
    1e-4 — one wait more or less is 3.3e-4 — as the gradient reduction overlapped with the
    last backward shifts by a few microseconds with it."""
    run = RUNS["MBRIDGE-2604-MOE-02"]
    with_waits = v.predict(run).result.step_time_s
    monkeypatch.setattr(moe, "HOST_SYNC_GAP_S", 0.0)
    without = v.predict(run).result.step_time_s
    assert with_waits - without == pytest.approx(48 * 64 * 93.8e-6, rel=1e-4)
