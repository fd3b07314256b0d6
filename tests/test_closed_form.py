"""Collectives and sends priced in closed form give the trace of one event each.

Where a run of gradient buckets is queued on a device's ``dp`` stream with nothing to
wait for or slow (reduced fidelity, no compute units held by collectives), the engine
prices it in one process or as the marks launch it (``Engine._closed_form_run``,
``BucketRun``), and a send on a ``pp`` link as it is sent (``Engine._post_send``); with
``Engine.closed_form`` and ``Engine.closed_form_sends`` switched off it runs one SimPy
process per bucket and per send. Both must record the same trace, to 1e-9, over a grid of
schedules, ZeRO stages, launch points and overlap switches. Both run on SimPy here
(``Engine.tight_loop`` off): tests/test_uncontended.py compares the loop without SimPy.
"""

from __future__ import annotations

import pytest
from helpers import make_scenario

from llmsim.simulation import build_engine

GRID = [
    {"parallelism__schedule": "1f1b"},
    {"parallelism__schedule": "gpipe"},
    {"parallelism__schedule": "zb-h1"},
    {"parallelism__schedule": "interleaved-1f1b", "parallelism__virtual_stages": 2},
    {"parallelism__schedule": "interleaved-1f1b", "parallelism__virtual_stages": 2,
     "parallelism__overlap_pp_comm": False},
    {"parallelism__schedule": "1f1b", "parallelism__overlap_dp_comm": False},
    {"parallelism__schedule": "1f1b", "parallelism__zero": 1},
    {"parallelism__schedule": "1f1b", "parallelism__zero": 2,
     "parallelism__overlap_dp_comm": False},
    {"parallelism__schedule": "1f1b", "parallelism__zero": 3, "parallelism__pp": 1,
     "parallelism__tp": 4},
    {"parallelism__schedule": "1f1b", "parallelism__grad_reduce_launch": "pp_aligned"},
    {"parallelism__schedule": "interleaved-1f1b", "parallelism__virtual_stages": 2,
     "parallelism__grad_reduce_launch": "pp_aligned"},
    {"parallelism__schedule": "1f1b", "parallelism__grad_bucket_nan_check": True},
    {"parallelism__schedule": "1f1b", "parallelism__zero": 1,
     "parallelism__overlap_param_gather": True},
]


def _trace(extra: dict, closed_form: bool, events: list | None = None):
    """The trace of one step (each event the engine schedules appended to ``events``)."""
    engine = build_engine(make_scenario(nodes=2, training__global_batch=32,
                                        parallelism__dp_bucket_mb=4, **extra))
    engine.tight_loop = False
    if not closed_form:
        engine.closed_form = dict.fromkeys(engine.closed_form, False)
        engine.closed_form_sends = False
    if events is not None:
        schedule = engine.env.schedule

        def counted(event, *args, **kwargs):
            events.append(event)
            return schedule(event, *args, **kwargs)

        engine.env.schedule = counted
    return engine, engine.run()


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-9 * max(abs(a), abs(b), 1e-300) or a == b


@pytest.mark.parametrize("extra", GRID, ids=lambda e: ",".join(f"{k[13:]}={v}"
                                                                  for k, v in e.items()))
def test_closed_form_and_one_event_per_collective_record_the_same_step(extra):
    fast_engine, fast = _trace(extra, closed_form=True)
    _, slow = _trace(extra, closed_form=False)
    assert any(fast_engine.closed_form.values())
    assert _close(fast.step_end_s, slow.step_end_s)
    assert len(fast.records) == len(slow.records)
    key = lambda r: (r.device, r.stream, r.name, r.kind, r.microbatch, r.chunk,  # noqa: E731
                     round(r.start_s, 9))
    for a, b in zip(sorted(fast.records, key=key), sorted(slow.records, key=key),
                    strict=True):
        assert (a.device, a.stream, a.name, a.kind, a.microbatch, a.chunk) == \
            (b.device, b.stream, b.name, b.kind, b.microbatch, b.chunk)
        assert _close(a.start_s, b.start_s) and _close(a.end_s, b.end_s), (a, b)
    assert fast.stage_dp_done_s == pytest.approx(slow.stage_dp_done_s, rel=1e-9)


@pytest.mark.parametrize("extra", [{}, {"parallelism__overlap_dp_comm": False},
                                   {"parallelism__zero": 3, "parallelism__pp": 1}])
def test_a_run_of_buckets_is_a_few_events_not_several_per_bucket(extra):
    fast: list = []
    slow: list = []
    engine, _ = _trace({"parallelism__schedule": "1f1b", **extra}, True, fast)
    _trace({"parallelism__schedule": "1f1b", **extra}, False, slow)
    buckets = sum(len(ops) for ops in engine.bucket_ops.values())
    runs = len(engine.bucket_ops) * (engine.work.microbatches if engine.work.zero == 3 else 1)
    assert buckets > runs  # several buckets a run
    # one process, its start, one or two waits and its end per run, not per bucket
    assert len(slow) - len(fast) >= 3 * (buckets - runs)
