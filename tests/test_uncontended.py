"""The tight loop and SimPy replay a step where nothing contends into the same trace.

``Engine.run`` replays a step without SimPy (:mod:`llmsim.engine.uncontended`) where no
device shares anything with another but its pipeline messages; with ``Engine.tight_loop``
off the same engine runs its SimPy processes. Over a grid of schedules, layouts (stages,
chunks, micro-batches, data-parallel degree, nodes) and overlap switches both must give
every record's start and end, the waits, the stage times and the step time to 1e-9; where
something contends the loop must not be taken. Where only compute units are shared (posted
pipeline operations, collectives holding units) the contended loop
(:mod:`llmsim.engine.contended`) must give the same, the passes' slowed time included.
"""

from __future__ import annotations

import itertools
import math

import pytest
from helpers import make_scenario

from llmsim import simulate
from llmsim.engine import contended, uncontended
from llmsim.simulation import build_engine

SCHEDULES = [("1f1b", 1), ("gpipe", 1), ("zb-h1", 1), ("interleaved-1f1b", 2)]
LAYOUTS = [  # (nodes, pp, global batch): dp follows from the nodes
    (1, 4, 16), (2, 4, 32), (2, 2, 16), (2, 8, 24),
]
SWITCHES = [
    {},
    {"parallelism__overlap_dp_comm": False},
    {"parallelism__overlap_pp_comm": False},
    {"parallelism__overlap_pp_comm": True},
    {"parallelism__zero": 1},
    {"parallelism__zero": 2, "parallelism__overlap_dp_comm": False},
    {"parallelism__grad_reduce_launch": "pp_aligned"},
    {"model__tied_embeddings": True},
    {"parallelism__pp_scatter_gather": "megatron"},
    {"parallelism__pp_scatter_gather": "deepspeed", "parallelism__overlap_dp_comm": False},
    # ZeRO's per-layer weight gathers on the dp stream beside the gradient buckets
    {"parallelism__zero": 3},
    {"parallelism__zero": 3, "parallelism__overlap_dp_comm": False},
    {"parallelism__zero": 3, "parallelism__prefetch_weights": False},
    {"parallelism__zero": 3, "parallelism__regather_for_recompute": True,
     "parallelism__recompute": "full"},
    {"parallelism__zero": 3, "parallelism__prefetch_weights": "forward",  # ahead in the
     "parallelism__regather_for_recompute": True,  # forward only
     "parallelism__recompute": "full"},
    {"parallelism__zero": 1, "parallelism__overlap_param_gather": True},
    {"parallelism__zero": 3, "parallelism__gather_per_module": True},  # a layer's gathers
    # back to back: each joins the stream when the one before it ends
    {"parallelism__zero": 3, "parallelism__gather_per_module": True,
     "parallelism__overlap_dp_comm": False},
]


def _grid():
    for (schedule, v), (nodes, pp, batch), switch in itertools.product(SCHEDULES, LAYOUTS,
                                                                       SWITCHES):
        if switch.get("parallelism__grad_reduce_launch") and schedule not in (
                "1f1b", "interleaved-1f1b"):
            continue
        if schedule == "interleaved-1f1b" and switch.get("parallelism__overlap_pp_comm"):
            continue  # Megatron-LM's posted sends hold compute units: SimPy (tested below)
        yield {"nodes": nodes, "parallelism__pp": pp, "training__global_batch": batch,
               "parallelism__schedule": schedule, "parallelism__virtual_stages": v,
               "model__layers": 2 * pp * v, "parallelism__dp_bucket_mb": 4, **switch}


GRID = list(_grid())


def _engine(overrides: dict, tight: bool):
    engine = build_engine(make_scenario(**overrides))
    engine.tight_loop = tight
    return engine


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-9 * max(abs(a), abs(b), 1e-300) or a == b


def _key(r):
    return (r.device, r.stream, r.name, r.kind, r.microbatch, r.chunk, round(r.start_s, 9))


def assert_same_trace(fast, slow, slowed: bool = False) -> None:
    """Both traces record the same step to 1e-9; ``slowed``: passes may run slower for
    posted pipeline operations (:attr:`Trace.pp_slowed_s`, compared too), else none."""
    assert _close(fast.step_end_s, slow.step_end_s)
    assert _close(fast.optimizer_start_s, slow.optimizer_start_s)
    assert len(fast.records) == len(slow.records)
    for a, b in zip(sorted(fast.records, key=_key), sorted(slow.records, key=_key),
                    strict=True):
        assert (a.device, a.stage, a.stream, a.name, a.kind, a.microbatch, a.chunk,
                a.block_from_s, a.block_to_s) == (b.device, b.stage, b.stream, b.name,
                                                  b.kind, b.microbatch, b.chunk,
                                                  b.block_from_s, b.block_to_s)
        assert _close(a.start_s, b.start_s) and _close(a.end_s, b.end_s), (a, b)
    # the trace lists each device's records by start time
    assert [(r.device, r.start_s) for r in fast.records] == \
        sorted((r.device, r.start_s) for r in fast.records)
    for stage, t in slow.stage_last_compute_s.items():
        assert _close(fast.stage_last_compute_s[stage], t)
        assert _close(fast.stage_dp_done_s[stage], slow.stage_dp_done_s[stage])
    waits = [sorted(w for w in trace.pp_waits if w[2] > w[1]) for trace in (fast, slow)]
    assert len(waits[0]) == len(waits[1])
    for a, b in zip(*waits, strict=True):
        assert a[0] == b[0] and all(_close(x, y) for x, y in zip(a[1:], b[1:], strict=True))
    dp_waits = [sorted(trace.dp_waits) for trace in (fast, slow)]
    assert len(dp_waits[0]) == len(dp_waits[1])
    for a, b in zip(*dp_waits, strict=True):
        assert a[0] == b[0] and all(_close(x, y) for x, y in zip(a[1:], b[1:], strict=True))
    if not slowed:
        assert fast.pp_slowed_s == slow.pp_slowed_s == {}
    assert fast.pp_slowed_s.keys() == slow.pp_slowed_s.keys()
    for device, slowed_s in slow.pp_slowed_s.items():
        assert _close(fast.pp_slowed_s[device], slowed_s)


@pytest.mark.parametrize("overrides", GRID, ids=lambda o: "-".join(
    str(v) for k, v in o.items() if k != "parallelism__dp_bucket_mb"))
def test_tight_loop_and_simpy_record_the_same_step(overrides):
    engine = _engine(overrides, tight=True)
    assert uncontended.applies(engine) and uncontended.simpy_reason(engine) == ""
    if uncontended.replay(_engine(overrides, tight=True)) is None:
        # A pass reaches a layer part at the instant its ZeRO-3 gather ends (equal chunks'
        # equal times line up; since the A100's 128x128 tiles, interleaved 2-4-32 with
        # per-module gathers): the tight loop hands such a step to SimPy by design.
        pytest.skip("a pass meets its gather's end at the same instant: SimPy orders it")
    fast = engine.run()
    assert engine.env.now == 0  # no SimPy event ran
    slow_engine = _engine(overrides, tight=False)
    assert not uncontended.applies(slow_engine)
    assert_same_trace(fast, slow_engine.run())


def test_the_step_has_what_the_grid_means_to_cover():
    """The grid reaches gradient buckets launched inside passes, data-parallel groups
    and sends within and between nodes (else it would compare little)."""
    engine = _engine(GRID[len(SWITCHES)], tight=True)  # 1f1b on 2 nodes, pp 4: dp 2
    trace = engine.run()
    assert engine.work.grad_ranks > 1
    names = {r.name for r in trace.records}
    assert any(n.startswith("dp_ar") for n in names) and "pp_send" in names
    assert len({engine._within_node(d, s) for d in engine.devices
                for s in range(engine.work.stages)}) == 2


@pytest.mark.parametrize(("overrides", "why"), [
    ({"fidelity": "full", "nodes": 2}, "group members"),
])
def test_where_something_contends_simpy_runs(overrides, why):
    engine = _engine(overrides, tight=True)
    assert not uncontended.applies(engine)
    assert why in uncontended.simpy_reason(engine)
    trace = engine.run()
    assert engine.env.now == trace.step_end_s > 0


@pytest.mark.parametrize(("schedule", "v"), SCHEDULES)
def test_buckets_after_their_kernels_on_the_contended_loop(schedule, v):
    """Kernels the compute stream runs before each bucket's reduction (Megatron-Core's NaN
    check) pause the pass that launches the bucket, or delay the walk that issues it:
    the contended loop's, with nothing else shared (the tight loop does not pause), the
    same as SimPy's, kernels ("D") and split pass records included."""
    overrides = {"parallelism__grad_bucket_nan_check": True, "nodes": 2,
                 "parallelism__pp": 4, "model__layers": 8 * v,
                 "training__global_batch": 32, "parallelism__schedule": schedule,
                 "parallelism__virtual_stages": v, "parallelism__dp_bucket_mb": 4}
    engine = _engine(overrides, tight=True)
    assert not uncontended.applies(engine) and contended.applies(engine)
    assert not engine.collective_units and not engine.rendezvous
    fast = engine.run()
    assert engine.env.now == 0  # no SimPy event ran
    assert any(r.kind == "D" for r in fast.records)
    assert any(r.stream == "compute" and r.block_to_s < math.inf and r.kind in "BW"
               for r in fast.records)  # a pass paused for a bucket's kernels
    assert_same_trace(fast, _engine(overrides, tight=False).run())


def test_an_unknown_schedule_runs_on_simpy():
    engine = _engine({"nodes": 2}, tight=True)
    assert uncontended.applies(engine)
    engine.schedule_name = "a-schedule-added-later"
    assert not uncontended.applies(engine)


def test_a_whole_result_is_the_same_on_both_paths(monkeypatch):
    scenario = make_scenario(nodes=2, training__global_batch=32,
                             parallelism__dp_bucket_mb=4)
    fast = simulate(scenario)
    monkeypatch.setattr(uncontended, "applies", lambda engine: False)
    slow = simulate(scenario)
    assert _close(fast.step_time_s, slow.step_time_s)
    for a, b in zip(fast.stages, slow.stages, strict=True):
        for x, y in zip(vars(a).values(), vars(b).values(), strict=True):
            assert x == pytest.approx(y, rel=1e-9, abs=1e-15)
    assert fast.bubble_fraction_per_stage == pytest.approx(slow.bubble_fraction_per_stage,
                                                           rel=1e-9, abs=1e-15)


def test_the_grid_reaches_zero3_gathers_and_their_waits():
    """ZeRO-3's rows of the grid gather weights beside the gradient buckets and make passes
    wait for them, on the tight loop (else the comparison would cover little)."""
    overrides = next(o for o in GRID if o.get("parallelism__zero") == 3 and o["nodes"] == 2
                     and o["parallelism__pp"] == 4 and o["parallelism__schedule"] == "1f1b"
                     and len(o) == 8)
    engine = _engine(overrides, tight=True)
    trace = engine.run()
    assert engine.env.now == 0 and engine.work.grad_ranks > 1
    names = {r.name for r in trace.records}
    assert any(n.startswith("z3_ag") for n in names)
    assert any(n.startswith("dp_rs") for n in names)
    assert trace.dp_waits


def test_a_gather_ending_as_its_layer_is_reached_sends_the_step_to_simpy(monkeypatch):
    """Where a pass reaches a layer at the instant its gather ends, SimPy's order of two
    events at one time decides whether it waits: the loop gives the step back
    (``SameInstant``) and SimPy replays it from the start, its trace the SimPy path's."""
    from llmsim.engine import uncontended_gathers

    overrides = {"nodes": 2, "parallelism__zero": 3, "parallelism__dp_bucket_mb": 4}
    slow = _engine(overrides, tight=False).run()
    calls = []

    def same_instant(self, i, now_s, label, woken=False):
        calls.append(label)
        raise uncontended_gathers.SameInstant(label)

    monkeypatch.setattr(uncontended_gathers.DeviceGathers, "gathered_pass", same_instant)
    engine = _engine(overrides, tight=True)
    assert uncontended.applies(engine)
    fast = engine.run()
    assert calls and engine.env.now == fast.step_end_s > 0  # SimPy ran the step
    assert engine.passes_started == sum(len(engine.schedule[d.stage]) for d in engine.devices)
    assert_same_trace(fast, slow)


# The contended loop (llmsim.engine.contended): Megatron-LM's posted pipeline operations
# (interleaved, overlap_pp_comm) and collectives holding the node's compute units, each
# over the layouts and the switches that reach its different paths.
CONTENDED_SWITCHES = [
    {},
    {"parallelism__overlap_dp_comm": False},
    {"parallelism__zero": 1},
    {"parallelism__grad_reduce_launch": "pp_aligned"},
    {"model__tied_embeddings": True},
    {"parallelism__pp_scatter_gather": "megatron"},
    {"parallelism__pp_scatter_gather": "deepspeed", "parallelism__overlap_dp_comm": False},
]
NARROW_SWITCHES = [  # on one layout (ZeRO-1's gathers on two), to keep the file's time
    # weight gathers on the dp stream, holding units beside the passes
    # (llmsim.engine.contended_gathers)
    {"parallelism__zero": 1, "parallelism__overlap_param_gather": True},
    {"parallelism__zero": 2, "parallelism__overlap_param_gather": True,
     "parallelism__overlap_dp_comm": False, "parallelism__prefetch_weights": False},
    {"parallelism__zero": 1, "parallelism__overlap_param_gather": True,
     "parallelism__grad_reduce_launch": "pp_aligned"},
    {"parallelism__zero": 3},
    {"parallelism__zero": 3, "parallelism__overlap_dp_comm": False},
    {"parallelism__zero": 3, "parallelism__prefetch_weights": False},
    {"parallelism__zero": 3, "parallelism__regather_for_recompute": True,
     "parallelism__recompute": "full"},
    {"parallelism__zero": 3, "parallelism__prefetch_weights": "forward",  # ahead in the
     "parallelism__regather_for_recompute": True,  # forward only
     "parallelism__recompute": "full"},
    {"parallelism__zero": 3, "parallelism__gather_per_module": True},
    # kernels on the compute stream before each bucket's reduction (Megatron-Core's
    # aligned launches; after the last pass without overlap; from marks inside a pass)
    {"parallelism__grad_bucket_nan_check": True, "parallelism__grad_bucket_prescale": True,
     "parallelism__grad_reduce_launch": "pp_aligned"},
    {"parallelism__grad_bucket_nan_check": True, "parallelism__overlap_dp_comm": False},
    {"parallelism__grad_bucket_prescale": True, "parallelism__zero": 1,
     "parallelism__overlap_param_gather": True, "parallelism__grad_reduce_launch": "pp_aligned"},
    {"parallelism__grad_bucket_nan_check": True},  # launched from marks: passes pause
]
CONTENDED_PATHS = [  # (schedule, virtual stages, switches that make it contended)
    ("interleaved-1f1b", 2, {"parallelism__overlap_pp_comm": True}),
    ("interleaved-1f1b", 3, {"parallelism__overlap_pp_comm": True,
                             "system__node__collective_units": 4}),
    ("1f1b", 1, {"system__node__collective_units": 4}),
    ("zb-h1", 1, {"system__node__collective_units": 4,
                  "parallelism__overlap_pp_comm": False}),
]


def _contended_grid():
    for (schedule, v, path), (nodes, pp, batch), switch in itertools.product(
            CONTENDED_PATHS, LAYOUTS[1:], CONTENDED_SWITCHES + NARROW_SWITCHES):
        if switch.get("parallelism__grad_reduce_launch") and schedule == "zb-h1":
            continue
        if switch in NARROW_SWITCHES and (nodes, pp, batch) != (2, 4, 32) and (
                switch is not NARROW_SWITCHES[0] or pp != 2):
            continue
        if nodes * 8 == 2 * pp and "parallelism__overlap_pp_comm" not in switch \
                and v == 1:
            continue  # dp 1 (tp 2): no data-parallel collective to hold units
        yield {"nodes": nodes, "parallelism__pp": pp, "training__global_batch": batch,
               "parallelism__schedule": schedule, "parallelism__virtual_stages": v,
               "model__layers": 2 * pp * v, "parallelism__dp_bucket_mb": 4, **path, **switch}


CONTENDED_GRID = list(_contended_grid())


@pytest.mark.parametrize("overrides", CONTENDED_GRID, ids=lambda o: "-".join(
    str(v) for k, v in o.items() if k != "parallelism__dp_bucket_mb"))
def test_contended_loop_and_simpy_record_the_same_step(overrides):
    engine = _engine(overrides, tight=True)
    assert not uncontended.applies(engine) and contended.applies(engine)
    fast = engine.run()
    assert engine.env.now == 0  # no SimPy event ran
    slow_engine = _engine(overrides, tight=False)
    assert not contended.applies(slow_engine)
    assert_same_trace(fast, slow_engine.run(), slowed=True)


def test_the_contended_grid_reaches_gathers_that_hold_units_and_waits():
    """The contended grid's ZeRO rows gather weights beside the gradient buckets, the
    gathers holding compute units and the passes waiting for them, on the contended loop
    (ZeRO-1's first forwards and ZeRO-3's every pass)."""
    for zero in (1, 3):
        overrides = next(o for o in CONTENDED_GRID if o.get("parallelism__zero") == zero
                         and (zero == 3 or o.get("parallelism__overlap_param_gather"))
                         and o["parallelism__schedule"] == "1f1b" and o["nodes"] == 2
                         and o["parallelism__pp"] == 4)
        engine = _engine(overrides, tight=True)
        assert engine.collective_units and not engine.hooks_closed_form
        trace = engine.run()
        assert engine.env.now == 0 and trace.dp_waits
        assert any(r.name.startswith(("z3_ag", "dp_ag_params")) for r in trace.records
                   if r.stream == "dp")


def test_a_gather_ending_as_its_layer_is_reached_on_the_contended_loop_goes_to_simpy(
        monkeypatch):
    """Where the contended loop meets an order of one instant that SimPy's events decide
    (``SameInstant``), it gives the step back and SimPy replays it from the start."""
    from llmsim.engine import contended_gathers

    overrides = next(o for o in CONTENDED_GRID if o.get("parallelism__zero") == 3
                     and o["parallelism__schedule"] == "1f1b")
    slow = _engine(overrides, tight=False).run()
    calls = []

    def same_instant(self, ds, op, by):
        calls.append(op.name)
        raise contended_gathers.SameInstant(op.name)

    monkeypatch.setattr(contended_gathers.GatheredPasses, "join", same_instant)
    engine = _engine(overrides, tight=True)
    assert contended.applies(engine)
    fast = engine.run()
    assert calls and engine.env.now == fast.step_end_s > 0  # SimPy ran the step
    assert engine.passes_started == sum(len(engine.schedule[d.stage]) for d in engine.devices)
    assert_same_trace(fast, slow, slowed=True)


def test_the_contended_grid_slows_passes_by_both_holders():
    """Posted operations and collectives holding units make passes slower on the
    contended loop (else its grid would compare the tight loop's sums again)."""
    posted = _engine(CONTENDED_GRID[0], tight=True)
    trace = posted.run()
    assert posted.rendezvous and sum(trace.pp_slowed_s.values()) > 0
    held = next(o for o in CONTENDED_GRID if o["parallelism__schedule"] == "1f1b"
                and o["nodes"] == 2 and o["parallelism__pp"] == 4)
    free = {k: v for k, v in held.items() if k != "system__node__collective_units"}
    with_units, without = (_engine(o, tight=True) for o in (held, free))
    assert with_units.collective_units and contended.applies(with_units)
    assert uncontended.applies(without)
    assert with_units.run().step_end_s > without.run().step_end_s


# GPT-3 175B on Selene as the layout search's best (tp 4, pp 4, 24 virtual stages, ZeRO-2,
# weight gathers overlapped): a first forward's gather ends at the very instant the
# message that lets the pass start comes in (the stages' equal times line up).
SELENE_TIE = ["parallelism.tp=4", "parallelism.pp=4", "parallelism.dp=auto",
              "parallelism.schedule=interleaved-1f1b", "parallelism.virtual_stages=24",
              "parallelism.micro_batch=2", "parallelism.zero=2", "parallelism.recompute=none",
              "parallelism.overlap_dp_comm=true", "parallelism.overlap_tp_comm=false",
              "parallelism.overlap_param_gather=true"]


@pytest.mark.parametrize("overlap_pp, loop", [(True, contended), (False, uncontended)],
                         ids=["contended", "tight"])
def test_a_gather_ending_as_a_message_wakes_its_pass_stays_on_the_loop(monkeypatch,
                                                                        overlap_pp, loop):
    """A pass woken by a message that comes in at the instant its first part's gather
    ends: in SimPy the message's event is scheduled at that instant, after the gather's
    last timeout (scheduled when that all-gather started), so the gather has ended and
    the pass does not wait. Both loops replay it so (no SimPy event runs), and the trace
    is SimPy's, every record and wait exactly."""
    from llmsim import load_scenario
    from llmsim.engine import contended_gathers, uncontended_gathers

    scenario = load_scenario("selene-gpt3", [*SELENE_TIE,
                                             f"parallelism.overlap_pp_comm={overlap_pp}"])
    ties = []
    if loop is contended:
        ended_first = contended_gathers.GatheredPasses.ended_first

        def spy(self, ds, chain):
            ties.append(ended_first(self, ds, chain))
            return ties[-1]

        monkeypatch.setattr(contended_gathers.GatheredPasses, "ended_first", spy)
    else:
        gathered_pass = uncontended_gathers.DeviceGathers.gathered_pass

        def spy(self, i, now_s, label, woken=False):
            ends = self.end_s[i]
            tie = woken and bool(ends) and ends[0] == now_s
            ties.append(tie)
            return gathered_pass(self, i, now_s, label, woken)

        monkeypatch.setattr(uncontended_gathers.DeviceGathers, "gathered_pass", spy)
    engine = build_engine(scenario)
    assert loop.applies(engine)
    fast = engine.run()
    assert engine.env.now == 0 and any(ties)  # the loop met the tie and kept the step
    slow_engine = build_engine(scenario)
    slow_engine.tight_loop = False
    slow = slow_engine.run()
    assert slow_engine.env.now > 0
    assert sorted(fast.records) == sorted(slow.records)
    assert sorted(fast.dp_waits) == sorted(slow.dp_waits)
    assert fast.step_end_s == slow.step_end_s
    assert_same_trace(fast, slow, slowed=True)
