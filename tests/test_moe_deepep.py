"""DeepEP's kernels priced at their measured rates (llmsim.costs.deepep): closed forms on
the H800 cluster, DeepEP's own published measurements reproduced at their shapes, the
low-latency kernels, and the links' time as a floor."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_cli import run_cli

import llmsim
from llmsim.costs import HardwareCosts
from llmsim.costs.alltoall import TokenDispatch, all_to_all_s, remote_nodes_per_token
from llmsim.costs.collectives import GroupPath
from llmsim.costs.deepep import (
    LOW_LATENCY_BYTES_PER_S,
    deepep_kernel_s,
    distinct_of,
    is_combine,
    low_latency_rate,
    normal_internode_rate,
)
from llmsim.ops import CommOp
from llmsim.plan import Plan

HIDDEN, TOP_K = 7168, 8
FP8_ROW = HIDDEN + HIDDEN / 128 * 4 + 16
"""Bytes of one FP8 row as DeepEP's low-latency test counts it (tests/test_low_latency.py
at ebfe47e: hidden bytes, an FP32 scale per 128, 16 bytes of header)."""


def _deepseek(**par: object) -> llmsim.Scenario:
    base = llmsim.load_scenario("deepseek-v3")
    return base.model_copy(update={"parallelism": base.parallelism.model_copy(update=par)})


def _price(scenario: llmsim.Scenario, name: str, nbytes: float) -> float:
    costs = HardwareCosts.from_scenario(scenario, Plan.from_scenario(scenario))
    return costs.comm_s(CommOp(name, "all_to_all", "ep", "F", nbytes))


def test_the_combine_kernels_are_the_forward_combine_and_the_dispatch_gradient() -> None:
    assert is_combine("moe_combine") and is_combine("moe_dispatch_bwd")
    assert not is_combine("moe_dispatch") and not is_combine("moe_combine_bwd")


def test_deepseek_v3_dispatch_at_deepep_s_measured_rate() -> None:
    """EP 64 over 8 nodes: the network kernel counts every node a token's experts are on
    (its own included, D·8/7 copies) at 51 GB/s dispatch, 50 GB/s combine (DeepEP
    docs/legacy.md); the H800's NIC is DeepEP's 50 GB/s one, so no scaling."""
    s = _deepseek()
    nbytes = 4096 * TOP_K * HIDDEN * 2.0
    launch = s.system.node.accelerator.kernel_launch_us * 1e-6
    costs = HardwareCosts.from_scenario(s, Plan.from_scenario(s))
    path = costs.all_to_all._shape("ep")[0]
    assert (path.ranks, path.nodes, path.per_node) == (64, 8, 8)
    copies = remote_nodes_per_token(TOP_K, 8, 4) * 8 / 7
    for name, rate in (("moe_dispatch", 51e9), ("moe_combine", 50e9)):
        want = path.inter_latency_s + nbytes / TOP_K * copies / rate + launch
        assert _price(s, name, nbytes) == pytest.approx(want, rel=1e-12)
        # the kernel is slower than the links alone would be (45 GB/s achieved, D copies)
        links = all_to_all_s(nbytes, path, dispatch=TokenDispatch(TOP_K, 4)) + launch
        assert _price(s, name, nbytes) > links


def test_the_normal_kernels_reproduce_deepeps_measured_bandwidth() -> None:
    """At DeepEP's test shape (4,096 tokens, FP8 rows) the counted bytes over the priced
    time, less its latency, give back the published bottleneck bandwidths."""
    rows = 4096 * TOP_K
    for nodes, (dispatch, combine) in ((2, (43e9, 43e9)), (4, (58e9, 57e9)),
                                       (8, (51e9, 50e9))):
        path = GroupPath(ranks=8 * nodes, nodes=nodes, per_node=8, intra_bytes_per_s=160e9,
                         intra_latency_s=0.0, inter_bytes_per_s=8 * 45e9,
                         inter_latency_s=0.0)
        d = remote_nodes_per_token(TOP_K, nodes, 4)
        counted = 4096 * FP8_ROW * d * nodes / (nodes - 1)
        for combine_kernel, rate in ((False, dispatch), (True, combine)):
            t = deepep_kernel_s(rows * FP8_ROW, path, TOP_K, "normal", combine_kernel,
                                50e9, d)
            assert counted / t == pytest.approx(rate, rel=1e-12)


def test_one_node_counts_a_token_once_per_rank_over_nvlink() -> None:
    """EP 8 inside a node: the rows each rank receives, a token once per rank its
    experts are on (8·(1 − (7/8)^8) = 5.25 of its 8 rows), at 153 / 158 GB/s on the
    H800's 160 GB/s NVLink; twice the fabric, half the time."""
    assert distinct_of(8, 8) == pytest.approx(8 * (1 - (7 / 8) ** 8))
    nbytes = 4096 * TOP_K * HIDDEN * 2.0
    for fabric, scale in ((160e9, 1.0), (320e9, 2.0)):
        path = GroupPath(ranks=8, nodes=1, per_node=8, intra_bytes_per_s=fabric,
                         intra_latency_s=3e-6, inter_bytes_per_s=float("inf"),
                         inter_latency_s=0.0)
        for combine, rate in ((False, 153e9), (True, 158e9)):
            want = 3e-6 + nbytes / TOP_K * distinct_of(TOP_K, 8) / (rate * scale)
            got = deepep_kernel_s(nbytes, path, TOP_K, "normal", combine, 50e9, 0.0)
            assert got == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize(("ep", "dispatch_us", "combine_us"),
                         [(8, 77, 114), (16, 118, 195), (32, 155, 273),
                          (64, 173, 314), (128, 192, 369), (256, 194, 360)])
def test_low_latency_kernels_take_deepeps_measured_latency(ep: int, dispatch_us: float,
                                                            combine_us: float) -> None:
    """128 tokens, top 8: FP8 dispatch and BF16 combine rows at the measured rates take
    the published latencies within 5 % (the table's rates are rounded to whole GB/s)."""
    path = GroupPath(ranks=ep, nodes=max(1, ep // 8), per_node=min(ep, 8),
                     intra_bytes_per_s=160e9, intra_latency_s=0.0,
                     inter_bytes_per_s=8 * 45e9, inter_latency_s=0.0)
    for combine, row, want_us in ((False, FP8_ROW, dispatch_us),
                                  (True, HIDDEN * 2.0, combine_us)):
        t = deepep_kernel_s(128 * TOP_K * row, path, TOP_K, "low_latency", combine, 50e9,
                            0.0)
        assert t * 1e6 == pytest.approx(want_us, rel=0.05)


@given(st.integers(min_value=2, max_value=4096), st.booleans())
@settings(max_examples=80, deadline=None)
def test_low_latency_rate_lies_between_its_measured_neighbours(ranks: int,
                                                               combine: bool) -> None:
    sizes = sorted(LOW_LATENCY_BYTES_PER_S)
    below = max([s for s in sizes if s <= ranks], default=sizes[0])
    above = min([s for s in sizes if s >= ranks], default=sizes[-1])
    a, b = (LOW_LATENCY_BYTES_PER_S[x][combine] for x in (below, above))
    assert min(a, b) - 1e-3 <= low_latency_rate(ranks, combine) <= max(a, b) + 1e-3
    if ranks in LOW_LATENCY_BYTES_PER_S:
        assert low_latency_rate(ranks, combine) == LOW_LATENCY_BYTES_PER_S[ranks][combine]


def test_normal_rates_beyond_the_measured_sizes_hold_ep64s() -> None:
    assert normal_internode_rate(64, False) == normal_internode_rate(8, False) == 51e9
    assert normal_internode_rate(3, True) == normal_internode_rate(2, True) == 43e9


@given(st.floats(min_value=1e3, max_value=1e9), st.booleans(),
       st.sampled_from(["deepep", "deepep_low_latency"]))
@settings(max_examples=30, deadline=None)
def test_the_links_time_is_a_floor(nbytes: float, combine: bool, dispatcher: str) -> None:
    """A DeepEP all-to-all never costs less than its traffic on the links."""
    s = _deepseek(moe_dispatcher=dispatcher)
    costs = HardwareCosts.from_scenario(s, Plan.from_scenario(s))
    path, share, crossing = costs.all_to_all._shape("ep")
    name = "moe_combine" if combine else "moe_dispatch"
    links = all_to_all_s(nbytes, path, share, crossing, costs.all_to_all.dispatch)
    assert costs.all_to_all.comm_s("ep", nbytes, name) >= links


def test_low_latency_dispatcher_runs_and_is_slower_for_training_batches(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The low-latency kernels send every row over RDMA: at a training micro-batch on
    EP 64 they cost more than the normal kernels' forwarding; the CLI takes the value
    and rejects an unknown one in one sentence."""
    nbytes = 4096 * TOP_K * HIDDEN * 2.0
    normal = _price(_deepseek(), "moe_dispatch", nbytes)
    low = _price(_deepseek(moe_dispatcher="deepep_low_latency"), "moe_dispatch", nbytes)
    assert low > normal
    code, out, _ = run_cli(["run", "deepseek-v3", "--set",
                            "parallelism.moe_dispatcher=deepep_low_latency"], capsys)
    assert code == 0 and "deepep_low_latency dispatch" in out
    code, out, err = run_cli(["run", "deepseek-v3", "--set",
                              "parallelism.moe_dispatcher=deepep_fast"], capsys)
    assert code == 2 and "moe_dispatcher" in out + err and "Traceback" not in out + err


def test_hybridep_reproduces_its_measured_h100_bandwidth() -> None:
    """HybridEP counts the bytes as DeepEP does (its own node included): at its test
    shape (4,096 BF16 tokens, top 8, uniform routing, 16 SMs) the priced time gives back
    the H100 figures of docs/README_Hybrid-EP.md; faster than DeepEP's H800 kernels at
    EP 16."""
    rows = 4096 * TOP_K
    for nodes, (dispatch, combine) in ((2, (54.47e9, 53.35e9)), (4, (47.36e9, 52.53e9)),
                                       (8, (41.24e9, 46.57e9))):
        path = GroupPath(ranks=8 * nodes, nodes=nodes, per_node=8, intra_bytes_per_s=360e9,
                         intra_latency_s=0.0, inter_bytes_per_s=8 * 45e9,
                         inter_latency_s=0.0)
        d = remote_nodes_per_token(TOP_K, nodes)
        counted = 4096 * HIDDEN * 2.0 * d * nodes / (nodes - 1)
        for combine_kernel, rate in ((False, dispatch), (True, combine)):
            t = deepep_kernel_s(rows * HIDDEN * 2.0, path, TOP_K, "hybridep", combine_kernel,
                                50e9, d)
            assert counted / t == pytest.approx(rate, rel=1e-12)
            normal = deepep_kernel_s(rows * HIDDEN * 2.0, path, TOP_K, "normal",
                                     combine_kernel, 50e9, d)
            if nodes == 2:
                assert t < normal
