"""llmsim.costs.host_issue: the host's kernel issue as a queue, against a queue simulated
kernel by kernel, its limits, a pass's block and the H100 measurements of 2026-11-27."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from llmsim.blocks import Block
from llmsim.costs import HardwareCosts
from llmsim.costs.host_issue import HostIssue, pass_waits_s, queue_end_s, queue_waits_s
from llmsim.loader import load_spec
from llmsim.ops import CommOp, ComputeOp

H100 = load_spec("accelerators", "h100-sxm5-80gb")
MEASURED = Path(__file__).parents[1] / "benchmarks" / "results" / "h100-2026-11-27-host-queue"

durations = st.lists(st.floats(0.0, 1e-3, allow_nan=False), min_size=1, max_size=40)
intervals = st.floats(0.0, 2e-4, allow_nan=False)


def simulated_end_s(durations_s: list[float], interval_s: float) -> float:
    """A host that puts one kernel every ``interval_s`` into a queue and a device that runs
    them in order, as two SimPy processes: when the device finishes the last."""
    env = simpy.Environment()
    queue = simpy.Store(env)
    done = env.event()

    def host():
        for i, d in enumerate(durations_s):
            if i:
                yield env.timeout(interval_s)
            yield queue.put(d)

    def device():
        for _ in durations_s:
            d = yield queue.get()
            yield env.timeout(d)
        done.succeed(env.now)

    env.process(host())
    env.process(device())
    return env.run(until=done)


@settings(max_examples=200, deadline=None)
@given(durations, intervals)
def test_closed_form_is_the_queue_simulated(durations_s, interval_s):
    expected = simulated_end_s(durations_s, interval_s)
    assert queue_end_s(durations_s, interval_s) == pytest.approx(expected, rel=1e-9, abs=1e-15)
    waits = queue_waits_s(durations_s, interval_s)
    assert sum(waits) + sum(durations_s) == pytest.approx(expected, rel=1e-9, abs=1e-15)
    assert min(waits) >= 0.0 and waits[0] == 0.0


@given(durations)
def test_no_host_interval_gives_the_sum(durations_s):
    assert queue_end_s(durations_s, 0.0) == pytest.approx(math.fsum(durations_s))
    assert queue_waits_s(durations_s, 0.0) == [0.0] * len(durations_s)


@given(durations, intervals)
def test_the_end_is_at_least_the_device_and_the_host(durations_s, interval_s):
    end = queue_end_s(durations_s, interval_s)
    assert end >= math.fsum(durations_s) * (1 - 1e-12)
    assert end >= (len(durations_s) - 1) * interval_s + durations_s[-1] - 1e-15


@given(st.lists(st.floats(0.0, 1e-5), min_size=1, max_size=30), intervals)
def test_a_long_first_kernel_hides_every_dispatch(short_s, interval_s):
    long_s = len(short_s) * interval_s  # the host issues all the rest while it runs
    sequence = [long_s, *short_s]
    assert queue_end_s(sequence, interval_s) == pytest.approx(math.fsum(sequence))
    assert queue_end_s([*short_s, long_s], interval_s) >= len(short_s) * interval_s


def test_tiny_kernels_cost_the_host_dispatch_each():
    g, h, n = 1.15e-6, 9.1e-6, 100
    assert queue_end_s([g] * n, h) == pytest.approx((n - 1) * h + g)


def test_a_host_sync_issues_from_the_device_position():
    h = 10e-6
    waits = queue_waits_s([1e-3, 1e-6, 1e-6], h, syncs=[False, True, False])
    assert waits == [0.0, 0.0, pytest.approx(h - 1e-6)]  # the host restarts after the sync
    free = queue_waits_s([1e-3, 1e-6, 1e-6], h)
    assert free == [0.0, 0.0, 0.0]  # without it, the host was 1 ms ahead


def test_queue_of_the_h100_eager_and_with_graphs():
    eager, graphs = HostIssue.of(H100, cuda_graphs=False), HostIssue.of(H100, cuda_graphs=True)
    assert eager == HostIssue(H100.kernel_launch_us * 1e-6, H100.host_dispatch_us * 1e-6,
                              loop_interval_s=H100.host_dispatch_us * 1e-6)
    assert graphs == HostIssue(H100.graph_kernel_us * 1e-6, 0.0)
    assert 0 < graphs.kernel_gap_s < eager.kernel_gap_s < eager.interval_s
    unmeasured = H100.model_copy(update={"host_dispatch_us": 0.0})
    assert HostIssue.of(unmeasured, cuda_graphs=False).interval_s == 0.0


@given(durations, intervals)
def test_no_kernel_shorter_than_the_interval_means_no_wait(durations_s, interval_s):
    ops = [ComputeOp("k", "memory", "F", 0.0, 1.0)] * len(durations_s)
    longer = [max(d, interval_s) for d in durations_s]
    assert pass_waits_s(ops, longer, interval_s) == [0.0] * len(ops)
    assert queue_waits_s(longer, interval_s) == pytest.approx([0.0] * len(ops), abs=1e-18)


def test_split_ops_are_kernels_of_their_own():
    op = ComputeOp("s", "memory", "F", 0.0, 1.0, splits=4)
    waits = pass_waits_s([op], [4e-6], 10e-6)
    assert waits == [pytest.approx(3 * (10e-6 - 1e-6))]


class _Costs:
    """Fixed prices per op name and a host interval; each pass starts with an empty
    queue."""

    def __init__(self, prices: dict[str, float], host_issue_s: float) -> None:
        self.prices, self.host_issue = prices, HostIssue(0.0, host_issue_s)

    def compute_s(self, op):
        return self.prices[op.name]

    def comm_s(self, op):
        return self.prices[op.name]


OPS = (ComputeOp("gemm", "gemm", "F", 1.0, 0.0), ComputeOp("cast", "memory", "F", 0.0, 1.0),
       ComputeOp("norm", "memory", "F", 0.0, 1.0), CommOp("ar", "all_reduce", "tp", "F", 1e6),
       ComputeOp("add", "memory", "F", 0.0, 1.0), ComputeOp("add2", "memory", "F", 0.0, 1.0))
PRICES = {"gemm": 30e-6, "cast": 2e-6, "norm": 3e-6, "ar": 20e-6, "add": 2e-6, "add2": 2e-6}


@pytest.mark.parametrize("interval_s", [0.0, 5e-6, 10e-6, 40e-6])
def test_a_block_ends_when_its_queue_does(interval_s):
    block = Block.of(OPS, _Costs(PRICES, interval_s))
    sequence = [PRICES[op.name] for op in OPS]
    assert block.duration_s == pytest.approx(queue_end_s(sequence, interval_s))
    assert block.compute_s + block.tp_s == pytest.approx(block.duration_s)
    ends = [sp.offset_s + sp.duration_s for sp in block.spans]
    assert ends[-1] == pytest.approx(block.duration_s)
    starts = [sp.offset_s for sp in block.spans[1:]]
    assert starts == pytest.approx(ends[:-1])


def test_graphs_keep_the_block_a_sum_of_its_ops():
    from helpers import make_scenario

    from llmsim.plan import Plan

    scenario = make_scenario(system="eos", training__cuda_graphs=True)
    costs = HardwareCosts.from_scenario(scenario, Plan.from_scenario(scenario))
    assert costs.host_issue.interval_s == 0.0
    block = Block.of(OPS, costs)
    priced = [costs.compute_s(op) if isinstance(op, ComputeOp) else costs.comm_s(op)
              for op in OPS]
    assert block.duration_s == pytest.approx(math.fsum(priced))


def _measured() -> dict[tuple[str, str, int], list[float]]:
    """Seconds of each pass measured in runs 1 and 2 (``run.sh``), by (op, n, adds)."""
    rows: dict[tuple[str, str, int], list[float]] = {}
    for name in ("host_queue_1.csv", "host_queue_2.csv"):
        with (MEASURED / name).open() as f:
            for r in csv.DictReader(f):
                rows.setdefault((r["op"], r["gemm_n"], int(r["adds"])), []).append(
                    float(r["time_us"]) * 1e-6)
    return rows


ROWS = _measured()
PASSES = [(order, n, adds) for n in ("2048", "4096", "8192")
          for order in ("gemm_then_adds", "adds_then_gemm") for adds in (10, 30, 100, 300)]
FASTEST_HOST_S = 7.50e-6
"""The fastest dispatch per add seen that day: run 0 (``host_queue_0.csv``), 300 adds in
2,250.56 µs."""


def _predicted_s(order: str, n: str, adds: int, run: int, host_s: float) -> float:
    """The closed form for one measured pass: the GEMM's own time and the catalog's device
    gap per add, issued every ``host_s``; the synchronisation (~8 µs) on both sides."""
    sync = ROWS[("sync", "", 0)][run]
    gemm = ROWS[("gemm_then_adds", n, 0)][run] - sync
    add = H100.kernel_launch_us * 1e-6
    sequence = [gemm] + [add] * adds if order == "gemm_then_adds" else [add] * adds + [gemm]
    return queue_end_s(sequence, host_s) + sync


def _host_s(run: int) -> float:
    """The run's dispatch per add, from its 300 adds alone."""
    return (ROWS[("adds", "", 300)][run] - ROWS[("sync", "", 0)][run]) / 300


@pytest.mark.parametrize("case", PASSES, ids=lambda c: "-".join(map(str, c)))
def test_closed_form_predicts_the_measured_passes(case):
    """A BF16 n³ GEMM before or after N eager adds on the H100 (run 1, its host steady:
    10.5-11.2 µs per add in its adds-only rows): the closed form, with the run's own GEMM
    time and dispatch, within 15 % of every pass (0.86-1.05 of measured)."""
    order, n, adds = case
    predicted = _predicted_s(order, n, adds, 0, _host_s(0))
    assert predicted == pytest.approx(ROWS[case][0], rel=0.15)


@pytest.mark.parametrize("case", PASSES, ids=lambda c: "-".join(map(str, c)))
def test_measured_passes_lie_between_the_hosts_fastest_and_slowest(case):
    """Run 2, whose host sped up to ~7.6 µs per add halfway (the 2,048 and 4,096 rows
    with 30 or more adds): every pass lies within 15 % of the band the closed form gives
    between the day's fastest dispatch and the run's own."""
    order, n, adds = case
    low = _predicted_s(order, n, adds, 1, FASTEST_HOST_S)
    high = _predicted_s(order, n, adds, 1, _host_s(1))
    assert low * 0.85 <= ROWS[case][1] <= high * 1.15


def test_a_step_of_tiny_kernels_waits_for_the_host_and_graphs_do_not():
    """A tiny GPT on H100 nodes: its kernels are shorter than the host's dispatch, so the
    eager step is longer than the same step with no host queue, and with CUDA graphs
    (no queue, the device's smaller gap) shorter than both; the wait is compute time."""
    from helpers import make_scenario

    from llmsim import simulate

    eager = simulate(make_scenario(system="eos"))
    no_host = simulate(make_scenario(system="eos",
                                     system__node__accelerator__host_dispatch_us=0.0))
    graphs = simulate(make_scenario(system="eos", training__cuda_graphs=True))
    assert eager.step_time_s > no_host.step_time_s > graphs.step_time_s
    extra_s = eager.step_time_s - no_host.step_time_s
    compute_s = [b.compute_s for b in eager.stages], [b.compute_s for b in no_host.stages]
    assert max(e - n for e, n in zip(*compute_s, strict=True)) > 0.5 * extra_s


def test_the_slower_of_two_hosts_issue():
    """A message between node groups of different devices waits on the slower host: the
    longer gap and interval, ahead only where both hosts run ahead."""
    fast, slow = HostIssue(1e-6, 5e-6, True), HostIssue(3e-6, 9e-6, False)
    assert fast.slower(slow) == slow.slower(fast) == HostIssue(3e-6, 9e-6, False)
    assert fast.slower(HostIssue(2e-6, 1e-6, True)) == HostIssue(2e-6, 5e-6, True)
