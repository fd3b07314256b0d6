"""Fugaku's core retention (:mod:`llmsim.costs.retention`, ``system.retention_state``).

Closed forms of the wake-up count (one per serial wait longer than the OpenMP block time)
and its price (count × the A64FX's 3 ms), the knob off giving the costs without it, the
direction (never faster with it on), the user errors, and the check against the source's
own runs with ``retention_state=0`` (docs/validation.md §8, "Core retention as a
mechanism"): the pairs were not used to choose anything here.
"""

from __future__ import annotations

import functools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_cli import run_cli

import llmsim.costs.retention as retention
from llmsim import validation as v
from llmsim.costs import HardwareCosts
from llmsim.costs.allocator import GLIBC_MMAP_THRESHOLD_MAX_BYTES, PageRoundTrip
from llmsim.costs.retention import OMP_BLOCKTIME_S, CoreRetention, wakeups
from llmsim.errors import UserError
from llmsim.loader import load_scenario, load_spec
from llmsim.ops import ComputeOp
from llmsim.plan import Plan
from llmsim.simulation import simulate
from llmsim.validation.scenarios import scenario_for

WAKE_S = 3e-3  # RIKEN's Fugaku user guide 1.49, section 7: "approximately 3ms"
MiB = 2**20


def op(output_bytes: float = 0.0, splits: int = 1) -> ComputeOp:
    """An element-wise kernel that writes a new tensor of ``output_bytes``."""
    return ComputeOp("t", "memory", "F", 0.0, 2.0 * output_bytes,  # type: ignore[arg-type]
                     splits=splits, output_bytes=output_bytes)


def test_one_wake_up_per_wait_longer_than_the_block_time():
    assert OMP_BLOCKTIME_S == 0.200  # LLVM libomp's KMP_DEFAULT_BLOCKTIME, ms
    assert wakeups([0.1, 0.2, 0.2000001, 3.0]) == 2  # at the block time itself: spinning
    assert wakeups([0.1, 0.2, 0.2000001, 3.0], blocktime_s=0.0) == 4  # passive: every wait
    assert wakeups([]) == 0


@settings(max_examples=60, deadline=None)
@given(st.floats(0.0, 10.0), st.floats(0.0, 1.0))
def test_a_collective_adds_one_wake_up_exactly_when_it_outlasts_the_block_time(seconds, block):
    r = CoreRetention(WAKE_S, 10e-6, None, blocktime_s=block)
    assert r.comm_s(seconds) == (WAKE_S if seconds > block else 0.0)
    assert r.comm_s(seconds) <= r.comm_s(seconds + 1.0)  # monotone in the wait


def test_a_compute_op_waits_for_its_launches_and_its_outputs_munmap():
    """The workers wait while the main thread launches the op's kernels (10 µs each) and,
    under glibc, unmaps its output of 32 MiB or more (at 33 GB/s); a wait past the block
    time costs one wake-up."""
    pages = PageRoundTrip(load_spec("accelerators", "a64fx"))
    r = CoreRetention(WAKE_S, 10e-6, pages)
    below = op(GLIBC_MMAP_THRESHOLD_MAX_BYTES - 1, splits=3)
    assert r.compute_wait_s(below) == pytest.approx(3 * 10e-6, rel=1e-12)
    at = op(GLIBC_MMAP_THRESHOLD_MAX_BYTES)
    assert r.compute_wait_s(at) == pytest.approx(10e-6 + 32 * MiB / 33.0e9, rel=1e-12)
    assert r.compute_s(at) == 0.0  # ~1 ms of munmap: the workers still spin
    huge = op(8e9)  # 8 GB unmapped: 0.24 s, past the block time
    assert r.compute_wait_s(huge) > OMP_BLOCKTIME_S
    assert r.compute_s(huge) == WAKE_S
    cached = CoreRetention(WAKE_S, 10e-6, None)  # tcmalloc: nothing unmapped
    assert cached.compute_wait_s(huge) == pytest.approx(10e-6)
    assert cached.compute_s(huge) == 0.0
    assert CoreRetention(WAKE_S, 10e-6, None, blocktime_s=0.0).compute_s(below) == WAKE_S


def test_the_a64fx_files_carry_rikens_wake_up_and_others_none():
    for name in ("a64fx", "a64fx-cmg", "a64fx-boost", "a64fx-cmg-boost"):
        acc = load_spec("accelerators", name)
        assert acc.retention_wake_ms == 3.0 and "3ms" in acc.sources["retention_wake_ms"]
    assert load_spec("accelerators", "h100-sxm5-80gb").retention_wake_ms is None


@functools.cache
def dev10_steps(blocktime_s: float) -> tuple[float, float]:
    """FUGAKU-DEV-10's step (124M, one node, glibc), s: (retention off, on) with the
    given block time."""
    run = next(r for r in v.load_runs() if r.id == "FUGAKU-DEV-10")
    on = scenario_for(run)
    assert on.system.retention_state  # the row's choice: RIKEN's default below 9,217 nodes
    off = on.model_copy(update={"system": on.system.model_copy(update={"retention_state": False})})
    old = retention.OMP_BLOCKTIME_S
    retention.OMP_BLOCKTIME_S = blocktime_s
    try:
        return simulate(off).step_time_s, simulate(on).step_time_s
    finally:
        retention.OMP_BLOCKTIME_S = old


def test_retention_off_prices_every_op_as_before():
    """With the knob off the cost model has no retention and each op costs what it did."""
    run = next(r for r in v.load_runs() if r.id == "FUGAKU-DEV-1")
    on = scenario_for(run)
    off = on.model_copy(update={"system": on.system.model_copy(update={"retention_state": False})})
    assert HardwareCosts.from_scenario(off, Plan.from_scenario(off)).retention is None
    assert HardwareCosts.from_scenario(on, Plan.from_scenario(on)).retention is not None


def test_at_the_block_time_of_libomp_no_wait_of_the_one_node_row_sleeps():
    """No op of FUGAKU-DEV-10 keeps the workers waiting 200 ms (its longest munmap, the
    196 MiB logits, takes 6 ms), so the row is not moved."""
    off, on = dev10_steps(OMP_BLOCKTIME_S)
    assert on == off


def test_with_passive_waiting_every_op_wakes_the_cores_once():
    """At a block time of 0 (``OMP_WAIT_POLICY=passive``) every op's parallel region pays
    one wake-up: the one-device step grows by 3 ms × its ops, a whole number of wake-ups,
    several in each of the 1,024 micro-batches (752,638: 735 ops a micro-batch)."""
    off, on = dev10_steps(0.0)
    count = (on - off) / WAKE_S
    assert on > off
    assert count == pytest.approx(round(count), abs=1e-3)
    assert round(count) > 100 * 1024


def test_the_source_pairs_lie_between_the_two_block_times():
    """The independent check: the source's own retention difference on this node, 88.6 s
    (1,489.7 s with retention, 1,401.1 s without; fugaku_sweep.md), is far above what
    libomp's block time gives (0) and far below what passive waiting gives (one wake-up
    per op, 2,258 s): the sourced mechanism does not reproduce it."""
    measured_s = 1489.7 - 1401.1
    off, on = dev10_steps(OMP_BLOCKTIME_S)
    assert on - off < 0.01 * measured_s
    off, passive = dev10_steps(0.0)
    assert passive - off > 10 * measured_s


def test_retention_on_a_device_without_a_wake_up_time_is_a_user_error(capsys):
    code, out, err = run_cli(["run", "selene-gpt3", "--set", "system.retention_state=true"],
                             capsys)
    assert code == 2
    assert "retention_wake_ms" in err and "false" in err and "Traceback" not in err + out


def test_retention_above_9216_nodes_is_a_user_error(capsys):
    """The fugaku scenario runs all 158,976 nodes, where RIKEN fixes the knob at 0."""
    scenario = load_scenario("fugaku")
    assert not scenario.system.retention_state  # production knobs: retention_state=0
    on = scenario.system.model_copy(update={"retention_state": True})
    with pytest.raises(UserError, match=r"retention_state: true on 158976 nodes.*9,216"):
        CoreRetention.of(on, scenario.nodes_used, None)
    code, out, err = run_cli(["run", "fugaku", "--set", "system.retention_state=true"], capsys)
    assert code == 2
    assert "9,216" in err and "Traceback" not in err + out


def test_llmsim_run_takes_the_knob_end_to_end(tmp_path, capsys):
    """`--set system.retention_state=true` on a one-node Fugaku scenario runs (exit 0) and,
    with no wait of 200 ms in its step, reports the same step time."""
    import re

    from test_fugaku_power_knobs import _one_node_file

    scenario = _one_node_file(tmp_path)
    code, off, err = run_cli(["run", scenario], capsys)
    assert code == 0, err
    code, on, err = run_cli(["run", scenario, "--set", "system.retention_state=true"], capsys)
    assert code == 0, err
    step = re.compile(r"step time\s*│\s*([\d,.]+ m?s)")
    assert step.search(on) and step.search(on).group(1) == step.search(off).group(1)


def test_the_512_node_pair_is_unmoved_by_retention():
    """The source's third pair (fugaku_sweep.md at 35c25d4, not used to choose anything):
    124M at DP 512 on 512 nodes, 2.2 GHz, glibc, 3.2 s a step with retention and without.
    Its caller blocks on a queued MPI collective 8 times a step (docs/validation.md §8,
    "The MPI backend's hand-off"), and no wait of its reaches libomp's block time, so the
    knob adds nothing; the measured difference is 0 within its 0.05 s rounding."""
    measured_on_s, measured_off_s = 3.2, 3.2
    run = next(r for r in v.load_runs() if r.id == "FUGAKU-DEV-10")
    row = scenario_for(run)
    boost = load_spec("accelerators", "a64fx-boost")
    system_on = row.system.model_copy(
        update={"node": row.system.node.model_copy(update={"accelerator": boost})})
    on = row.model_copy(update={"nodes": 512, "system": system_on,
                                "parallelism": row.parallelism.model_copy(update={"dp": 512})})
    off = on.model_copy(update={"system": system_on.model_copy(update={"retention_state": False})})
    assert on.system.retention_state and Plan.from_scenario(on).nodes == 512
    step_on, step_off = simulate(on).step_time_s, simulate(off).step_time_s
    assert step_on == step_off
    assert abs((step_on - step_off) - (measured_on_s - measured_off_s)) <= 0.05
