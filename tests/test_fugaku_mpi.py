"""Fujitsu MPI's ring all-reduce on Fugaku (``network.mpi``,
:mod:`llmsim.costs.collectives.mpi_ring`): the closed form, the decision rule that picks
it, and that the cost model prices the rows' tensor-parallel all-reduces with it.
The measured checks are ``FUGAKU-BINE-C-*`` in ``tests/test_collective_checks.py``."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from llmsim.costs import HardwareCosts
from llmsim.costs.collectives.model import algorithm_times_s
from llmsim.costs.collectives.mpi_ring import mpi_ring_s, runs_ring
from llmsim.costs.paths import GroupPath, group_path
from llmsim.loader import load_spec
from llmsim.ops import CommOp
from llmsim.plan import Plan
from llmsim.specs import Parallelism
from llmsim.specs.mpi import MpiCollectives

MIB = 2**20


def _fugaku(name: str = "fugaku"):
    return load_spec("systems", name)


def _path(system, nodes: int, dp: int) -> GroupPath:
    plan = Plan(system, nodes, Parallelism(tp=1, pp=1, dp=dp), dp)
    return group_path(system, plan.placements["dp"], plan)


def test_fugaku_carries_fujitsu_mpis_rule() -> None:
    mpi = _fugaku().network.mpi
    assert mpi is not None
    assert (mpi.ring_max_ranks, mpi.ring_min_bytes_per_rank) == (32, 8192)
    assert _fugaku("fugaku-cmg").network.mpi == mpi


def test_ring_between_nodes_is_the_closed_form() -> None:
    """2(n−1) steps of α + (S/n)/B_link and n−1 reductions of 3·(S/n)/R, by hand."""
    system = _fugaku()
    mpi, path = system.network.mpi, _path(system, 4, 4)
    link = system.network.link_gbps_per_direction * system.network.efficiency * 1e9
    block = 8 * MIB / 4
    expected = (6 * (mpi.step_overhead_us * 1e-6 + block / link)
                + 3 * 3 * block / (mpi.reduce_gbps * 1e9))
    assert mpi_ring_s(8 * MIB, path, mpi) == pytest.approx(expected, rel=1e-12)


def test_ring_on_one_node_runs_on_the_fabric() -> None:
    """Four CMG processes of one node: the steps cross the ring bus, not Tofu-D."""
    system = _fugaku("fugaku-cmg")
    mpi, path = system.network.mpi, _path(system, 1, 4)
    assert (path.nodes, path.ranks) == (1, 4)
    block = 3 * MIB / 4
    expected = (6 * (path.intra_latency_s + block / path.intra_bytes_per_s)
                + 3 * 3 * block / (mpi.reduce_gbps * 1e9))
    assert mpi_ring_s(3 * MIB, path, mpi) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(("collective", "ranks", "nbytes", "ring"), [
    ("all_reduce", 32, 32 * 8192, True),
    ("all_reduce", 33, 33 * 8192, False),       # more processes: trinaryx3 and others
    ("all_reduce", 16, 16 * 8192 - 1, False),   # under 8 KiB a process: recursive doubling
    ("all_reduce", 1, MIB, False),
    ("all_gather", 16, 64 * MIB, False),
    ("reduce_scatter", 16, 64 * MIB, False),
])
def test_the_decision_rule(collective: str, ranks: int, nbytes: int, ring: bool) -> None:
    assert runs_ring(_fugaku().network.mpi, collective, ranks, nbytes) is ring


@settings(max_examples=40, deadline=None)
@given(n=st.integers(2, 32), small=st.floats(1e5, 1e8), factor=st.floats(1.01, 10))
def test_ring_time_grows_with_the_message(n: int, small: float, factor: float) -> None:
    system = _fugaku()
    path = GroupPath(ranks=n, nodes=n, per_node=1, intra_bytes_per_s=float("inf"),
                     intra_latency_s=0.0, inter_bytes_per_s=12.6e9, inter_latency_s=5e-7,
                     link_bytes_per_s=6.3e9)
    mpi = system.network.mpi
    assert mpi_ring_s(small * factor, path, mpi) > mpi_ring_s(small, path, mpi) > 0


def test_tensor_parallel_all_reduce_takes_the_ring() -> None:
    """FUGAKU-DEV-3's all-reduce of 20 MiB among 20 nodes is the ring plus the launch, and
    slower than the fastest of llmsim's own algorithms on the same path (it was the
    multi-dimensional torus rings)."""
    system = _fugaku()
    plan = Plan(system, 20, Parallelism(tp=20, pp=1, dp=1), 1)
    costs = HardwareCosts(system, plan, "fp32")
    path = group_path(system, plan.placements["tp"], plan)
    launch_s = system.node.accelerator.kernel_launch_us * 1e-6
    priced = costs.comm_s(CommOp("tp", "all_reduce", "tp", "F", 20 * MIB))
    assert priced == pytest.approx(mpi_ring_s(20 * MIB, path, system.network.mpi) + launch_s)
    fastest = min(algorithm_times_s("all_reduce", 20 * MIB, path).values()) + launch_s
    assert priced > 3 * fastest


def test_without_the_rule_nothing_changes() -> None:
    system = _fugaku()
    bare = system.model_copy(update={"network": system.network.model_copy(update={"mpi": None})})
    plan = Plan(bare, 20, Parallelism(tp=20, pp=1, dp=1), 1)
    path = group_path(bare, plan.placements["tp"], plan)
    priced = HardwareCosts(bare, plan, "fp32").comm_s(
        CommOp("tp", "all_reduce", "tp", "F", 20 * MIB))
    launch_s = bare.node.accelerator.kernel_launch_us * 1e-6
    assert priced == pytest.approx(min(algorithm_times_s("all_reduce", 20 * MIB, path).values())
                                   + launch_s)


@pytest.mark.parametrize("field", ["ring_max_ranks", "ring_min_bytes_per_rank", "reduce_gbps"])
def test_bad_values_are_refused_by_name(field: str) -> None:
    values = {"ring_max_ranks": 32, "ring_min_bytes_per_rank": 8192,
              "step_overhead_us": 7.2, "reduce_gbps": 57.3, field: 0}
    with pytest.raises(ValidationError, match=field):
        MpiCollectives(**values)
