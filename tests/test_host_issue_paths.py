"""llmsim.costs.host_issue by framework path (``training.host_path``): the host's time per
eager kernel for bare PyTorch ops and for a model's layers as Python modules under
autograd, measured on one H100's host (docs/calibration.md, "Host issue")."""

from __future__ import annotations

import itertools
import math
import sys

import pytest
import yaml
from helpers import make_scenario, tiny_raw
from hypothesis import given, settings
from hypothesis import strategies as st

from llmsim import simulate
from llmsim.blocks import Block
from llmsim.cli import main
from llmsim.costs import HardwareCosts
from llmsim.costs.host_issue import (
    HostIssue,
    host_runs_ahead,
    pass_queue,
    pass_waits_s,
    queue_end_s,
    queue_run,
)
from llmsim.errors import UserError
from llmsim.loader import load_spec
from llmsim.ops import CommOp, ComputeOp
from llmsim.plan import Plan

H100 = load_spec("accelerators", "h100-sxm5-80gb")
A100 = load_spec("accelerators", "a100-sxm4-80gb")


def test_each_path_takes_its_measured_host_time_and_graphs_take_none():
    for path, host_us in (("bare", 9.1), ("modules", 33.8)):
        issue = HostIssue.of(H100, False, path)
        assert issue.kernel_gap_s == pytest.approx(2.6e-6)
        assert issue.interval_s == pytest.approx(host_us * 1e-6)
    for path in ("bare", "modules"):
        issue = HostIssue.of(H100, True, path)
        assert issue.kernel_gap_s == pytest.approx(1.15e-6) and issue.interval_s == 0.0


def test_a_path_without_a_measurement_is_refused_in_one_sentence():
    assert A100.host_module_dispatch_us == 0.0
    with pytest.raises(UserError, match=r"training\.host_path: modules .* a100.*use bare"):
        HostIssue.of(A100, False, "modules")
    assert HostIssue.of(A100, True, "modules").interval_s == 0.0  # graphs: no host issue


def test_the_cli_refuses_the_unmeasured_path_with_exit_code_2(tmp_path, capsys):
    raw = tiny_raw()
    raw["training"]["host_path"] = "modules"  # Selene: A100s, no module measurement
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(raw))
    old, sys.argv = sys.argv, ["llmsim", "run", str(path)]
    try:
        with pytest.raises(SystemExit) as exc:
            main()
    finally:
        sys.argv = old
    err = " ".join(capsys.readouterr().err.split())
    assert exc.value.code == 2 and "Traceback" not in err
    assert "training.host_path: modules" in err and "host_module_dispatch_us" in err


class _Fixed:
    """Prices each op by its name from a table; the host issues every ``interval_s``,
    entering the pass ahead where ``ahead``."""

    def __init__(self, table_s: dict[str, float], interval_s: float,
                 ahead: bool = False) -> None:
        self.table_s, self.host_issue = table_s, HostIssue(0.0, interval_s, ahead)

    def compute_s(self, op: ComputeOp) -> float:
        return self.table_s[op.name]

    def comm_s(self, op: object) -> float:
        raise AssertionError("no collectives here")


def test_an_op_of_n_short_kernels_ends_after_n_minus_1_dispatches():
    """Closed form at the modules rate: an op of ``n`` kernels of ``d/n`` each, each
    shorter than the host's 33.8 us, lasts (n − 1)·h + d/n — the host sets its pace; a
    20 us op after it that the host reached while it ran adds only its own time."""
    h = HostIssue.of(H100, False, "modules").interval_s
    n, d = 10, 50e-6
    ops = (ComputeOp("loop", "memory", "F", 0.0, 1.0, splits=n),
           ComputeOp("add", "memory", "F", 0.0, 1.0))
    block = Block.of(ops, _Fixed({"loop": d, "add": 20e-6}, h))
    assert block.spans[0].duration_s == pytest.approx((n - 1) * h + d / n)
    assert block.spans[1].duration_s == pytest.approx(h - d / n + 20e-6)
    assert block.duration_s == pytest.approx(queue_end_s([d / n] * n + [20e-6], h))


kernels = st.lists(st.tuples(st.floats(1e-7, 2e-4), st.integers(1, 6)), min_size=1,
                   max_size=25)


@settings(max_examples=150, deadline=None)
@given(kernels, st.floats(0.0, 6e-5), st.floats(0.0, 6e-5))
def test_more_host_time_per_dispatch_never_shortens_a_pass(ops_spec, h1, h2):
    low, high = sorted((h1, h2))
    ops = tuple(ComputeOp(f"op{i}", "memory", "F", 0.0, 1.0, splits=n)
                for i, (_, n) in enumerate(ops_spec))
    table = {op.name: d for op, (d, _) in zip(ops, ops_spec, strict=True)}
    fast, slow = Block.of(ops, _Fixed(table, low)), Block.of(ops, _Fixed(table, high))
    assert slow.duration_s >= fast.duration_s - 1e-15
    assert fast.duration_s >= sum(table.values()) - 1e-15


def test_a_step_on_the_modules_path_is_no_shorter_and_graphs_remove_the_path():
    """The tiny GPT on H100 nodes (kernels shorter than either dispatch): the modules path
    waits longer for the host than bare ops; under CUDA graphs the path changes nothing."""
    bare = simulate(make_scenario(system="eos"))
    modules = simulate(make_scenario(system="eos", training__host_path="modules"))
    assert modules.step_time_s > bare.step_time_s
    graphs = [simulate(make_scenario(system="eos", training__cuda_graphs=True,
                                     training__host_path=p)).step_time_s
              for p in ("bare", "modules")]
    assert graphs[0] == graphs[1] < bare.step_time_s


def test_a_host_ahead_of_the_pass_waits_only_after_its_first_sync():
    """Ten 5 us kernels, then a collective the host syncs before, then ten more: entering
    ahead, the first ten never wait; after the sync the host issues from the device's
    position, as a pass that starts there with an empty queue would."""
    h = 10e-6
    short = [ComputeOp(f"k{i}", "memory", "F", 0.0, 1.0) for i in range(10)]
    sync = CommOp("ar", "all_reduce", "tp", "F", 1.0, host_s=1e-6)
    after = [ComputeOp(f"j{i}", "memory", "F", 0.0, 1.0) for i in range(10)]
    ops = (*short, ComputeOp("gemm", "gemm", "F", 1.0, 1.0), sync, *after)
    d = [5e-6] * 10 + [400e-6, 1e-6] + [5e-6] * 10  # the GEMM gives the host its lead
    waits = pass_waits_s(ops, d, h, ahead=True)
    assert waits[:12] == [0.0] * 12
    tail = pass_waits_s(ops[11:], d[11:], h)  # from the sync on, an empty queue
    assert waits[11:] == pytest.approx(tail)
    assert sum(waits) == pytest.approx((h - 1e-6) + 9 * (h - 5e-6))  # j0 after the 1 us sync
    assert pass_waits_s(ops, d, h, ahead=False)[1:10] == [pytest.approx(h - 5e-6)] * 9


@settings(max_examples=150, deadline=None)
@given(kernels, st.floats(0.0, 6e-5))
def test_entering_ahead_never_lengthens_a_pass(ops_spec, h):
    ops = tuple(ComputeOp(f"op{i}", "memory", "F", 0.0, 1.0, splits=n)
                for i, (_, n) in enumerate(ops_spec))
    table = {op.name: d for op, (d, _) in zip(ops, ops_spec, strict=True)}
    behind, ahead = Block.of(ops, _Fixed(table, h)), Block.of(ops, _Fixed(table, h, True))
    assert sum(table.values()) - 1e-15 <= ahead.duration_s <= behind.duration_s + 1e-15


@pytest.mark.parametrize(("pp", "overlap", "ahead"), [
    (1, False, True),   # no pipeline: nothing between passes waits for the device
    (4, True, True),    # Megatron's overlapped messages: no synchronize after them
    (4, False, False),  # batched blocking messages: torch.cuda.synchronize()
])
def test_which_layouts_let_the_host_run_ahead(pp, overlap, ahead):
    s = make_scenario(system="eos", parallelism__pp=pp, parallelism__tp=8 // pp,
                      parallelism__overlap_pp_comm=overlap)
    assert host_runs_ahead(s.parallelism) is ahead
    plan = Plan.from_scenario(s)
    assert HardwareCosts.from_scenario(s, plan).host_issue.ahead is ahead


def test_a_host_behind_its_device_leaves_a_negative_lead():
    """Closed form: n kernels of d < h from an empty queue end at (n − 1)·h + d, and the
    host issues the next kernel at n·h: the lead it leaves is d − h."""
    h, d, n = 30e-6, 5e-6, 40
    waits, lead = queue_run([d] * n, h)
    assert sum(waits) + n * d == pytest.approx(queue_end_s([d] * n, h))
    assert sum(waits) + n * d == pytest.approx((n - 1) * h + d)
    assert lead == pytest.approx(d - h)


def test_a_held_kernel_makes_the_next_wait_one_dispatch():
    """A kernel that holds the host to its end (a sync after it): the host issues the next
    one a dispatch after it ends, whatever lead the kernel's length gave it."""
    h = 30e-6
    attention = ComputeOp("attn", "attention", "F", 1.0, 1.0, host_held=True)
    after = ComputeOp("norm", "memory", "F", 0.0, 1.0)
    waits, lead = pass_queue((attention, after), [1e-3, 5e-6], h, math.inf)
    assert waits == [0.0, pytest.approx(h)]
    assert lead == pytest.approx(5e-6 - h)  # the norm ends 5 us after its issue
    free = ComputeOp("attn", "attention", "F", 1.0, 1.0)
    assert pass_queue((free, after), [1e-3, 5e-6], h, 0.0)[0] == [0.0, 0.0]


@settings(max_examples=150, deadline=None)
@given(kernels, st.floats(1e-6, 6e-5), st.floats(0.0, 2e-3), st.floats(0.0, 2e-3))
def test_a_longer_lead_never_lengthens_a_pass(ops_spec, h, lead1, lead2):
    """A pass entered further ahead waits no longer; no lead is the empty queue, an
    infinite one the host ahead of every kernel (:attr:`HostIssue.ahead`)."""
    ops = tuple(ComputeOp(f"op{i}", "memory", "F", 0.0, 1.0, splits=n)
                for i, (_, n) in enumerate(ops_spec))
    d = [t for t, _ in ops_spec]
    short, long_ = sorted((lead1, lead2))
    waits = [sum(pass_queue(ops, d, h, lead)[0]) for lead in (0.0, short, long_, math.inf)]
    assert all(a >= b - 1e-15 for a, b in itertools.pairwise(waits))
    assert waits[0] == pytest.approx(sum(pass_waits_s(ops, d, h, ahead=False)))
    assert waits[-1] == sum(pass_waits_s(ops, d, h, ahead=True)) == 0.0


def test_without_a_pipeline_the_host_earns_its_lead():
    """The tiny GPT at pp 1 on H100 nodes, its kernels shorter than the modules path's
    33.8 µs: the host cannot be ahead of a device that outruns it, so the modules path
    lengthens the step (a host taken to enter every pass ahead gave both paths one time);
    with CUDA graphs the path changes nothing."""
    one = {"parallelism__pp": 1, "parallelism__tp": 8, "system": "eos"}
    bare = simulate(make_scenario(**one)).step_time_s
    modules = simulate(make_scenario(training__host_path="modules", **one)).step_time_s
    assert modules > bare
    graphs = [simulate(make_scenario(training__cuda_graphs=True, training__host_path=p,
                                     **one)).step_time_s for p in ("bare", "modules")]
    assert graphs[0] == graphs[1]


def test_a_kernel_whose_last_step_runs_after_the_hosts_last_sync_lets_it_go_early():
    """DistFlashAttn's attention: the host's last sync opens the last step, so the host is
    let go that step's time before the kernel ends (``host_held_tail`` of its device time,
    its sync gaps left out) and issues the next kernel a dispatch later: a 5 µs kernel
    after a 1 ms attention of 0.2 ms gaps and a quarter in its last step waits
    max(0, h − 0.2 ms) — none at h = 30 µs, 0.1 ms at h = 300 µs."""
    attention = ComputeOp("attn", "attention", "F", 1.0, 1.0, host_s=0.2e-3, host_held=True,
                          host_held_tail=0.25)
    after = ComputeOp("norm", "memory", "F", 0.0, 1.0)
    for h, wait in ((30e-6, 0.0), (300e-6, 0.1e-3)):
        waits, lead = pass_queue((attention, after), [1e-3, 5e-6], h, math.inf)
        assert waits[1] == pytest.approx(wait, abs=1e-15)
        assert lead == pytest.approx(1e-3 + wait + 5e-6 - (1e-3 - 0.2e-3 + 2 * h))
