"""Fujitsu MPI's all-reduce above the ring's rule (``network.mpi``): recursive doubling
(:mod:`llmsim.costs.collectives.mpi_doubling`), Trinaryx3
(:mod:`llmsim.costs.collectives.mpi_trinary`) and the decision tree that picks among them
and the ring (:mod:`llmsim.costs.collectives.mpi_rules`): closed forms by hand, the
schedule's invariants, and which algorithm each call gets. The measured checks are
``FUGAKU-*-C-AR*`` in ``tests/test_collective_checks.py``."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from llmsim.costs import HardwareCosts
from llmsim.costs.collectives.mpi_doubling import doubling_hops, doubling_pairs, doubling_s
from llmsim.costs.collectives.mpi_ring import mpi_ring_s
from llmsim.costs.collectives.mpi_rules import mpi_all_reduce_s
from llmsim.costs.collectives.mpi_trinary import segment_bytes, trinary_s
from llmsim.costs.paths import GroupPath
from llmsim.loader import load_spec
from llmsim.ops import CommOp
from llmsim.plan import Plan
from llmsim.specs import Parallelism
from llmsim.specs.mpi import MpiCollectives

MIB = 2**20
MPI = MpiCollectives(ring_max_ranks=32, ring_min_bytes_per_rank=8192, step_overhead_us=7.2,
                     reduce_gbps=57.3, eager_overhead_us=1.26, eager_max_bytes=8192,
                     tree_max_ranks=3840, doubling_max_bytes=98304)
LINK = 6.8e9 * 0.93


def _path(ranks: int, per_node: int = 1) -> GroupPath:
    intra = 74e9 if per_node > 1 else float("inf")
    return GroupPath(ranks=ranks, nodes=ranks // per_node, per_node=per_node,
                     intra_bytes_per_s=intra, intra_latency_s=1e-6 if per_node > 1 else 0.0,
                     inter_bytes_per_s=2 * LINK, inter_latency_s=5e-7, link_bytes_per_s=LINK,
                     hop_latency_s=5e-7)


@settings(max_examples=60, deadline=None)
@given(ranks=st.integers(2, 300))
def test_the_doubling_schedule_leaves_every_rank_with_every_contribution(ranks: int) -> None:
    """Played out on sets: after Open MPI's steps every process holds all ``p`` inputs,
    in 1 + log2 p' + 1 steps (p' the largest power of two ≤ p), log2 p when p is one."""
    held = [{r} for r in range(ranks)]
    steps = doubling_pairs(ranks)
    for senders, receivers, reduces in steps:
        sent = [set(held[s]) for s in senders]
        for r, data in zip(receivers.tolist(), sent, strict=True):
            held[r] = held[r] | data if reduces else set(data)
    assert all(h == set(range(ranks)) for h in held)
    power = 1 << (ranks.bit_length() - 1)
    assert len(steps) == int(math.log2(power)) + (2 if power != ranks else 0)


def test_doubling_on_a_line_is_the_closed_form() -> None:
    """Four nodes on a line, 4 KiB (eager): step 1 swaps neighbours (1 hop), step 2 swaps
    0↔2 and 1↔3 (2 hops, 2 flows on the middle link): α + S/B + 3S/R, then
    α + t_hop + 2S/B + 3S/R."""
    nbytes = 4096
    reduce_s = 3 * nbytes / 57.3e9
    expected = (1.26e-6 + nbytes / LINK + reduce_s) + (1.26e-6 + 5e-7 + 2 * nbytes / LINK
                                                       + reduce_s)
    assert doubling_s(nbytes, _path(4), MPI, [(1, True), (2, True)], 5e-7) == pytest.approx(
        expected, rel=1e-12)


def test_a_large_doubling_message_pays_the_rendezvous() -> None:
    small, large = 8192, 8193
    per_byte = doubling_s(large, _path(2), MPI, [(1, True)], 5e-7) - doubling_s(
        small, _path(2), MPI, [(1, True)], 5e-7)
    assert per_byte == pytest.approx((7.2 - 1.26) * 1e-6 + 1 / LINK + 3 / 57.3e9, rel=1e-9)


@pytest.mark.parametrize(("nbytes", "segment"), [
    (98305, 4096), (393216, 4096), (393217, 16384), (6291456, 16384), (6291457, 65536)])
def test_the_segment_is_the_rules_one(nbytes: int, segment: int) -> None:
    assert segment_bytes(nbytes) == segment


def test_trinaryx3_is_the_closed_form() -> None:
    """4 MiB in 16 KiB segments over trees of depth 7: ⌈S / 3s⌉ + 2·7 rounds of
    3α + s/B + 9s/R."""
    s = 16384
    rounds = math.ceil(4 * MIB / (3 * s)) + 14
    per_round = 3 * 1.26e-6 + s / LINK + 9 * s / 57.3e9
    assert trinary_s(4 * MIB, _path(64), MPI, depth=7) == pytest.approx(
        rounds * per_round, rel=1e-12)


def test_processes_of_a_node_reduce_onto_one_first() -> None:
    """Four processes a node add two fabric steps each way: log2 4 reductions onto one
    process and log2 4 broadcast steps back."""
    alone = trinary_s(MIB, _path(64), MPI, depth=5)
    shared = trinary_s(MIB, _path(256, per_node=4), MPI, depth=5)
    move = 1e-6 + MIB / 74e9
    assert shared - alone == pytest.approx(2 * (move + 3 * MIB / 57.3e9) + 2 * move,
                                           rel=1e-9)


@settings(max_examples=40, deadline=None)
@given(small=st.floats(1e5, 1e9), factor=st.floats(1.01, 10), depth=st.integers(0, 40))
def test_trinaryx3_grows_with_the_message_and_the_depth(small: float, factor: float,
                                                         depth: int) -> None:
    path = _path(1024)
    assert trinary_s(small * factor, path, MPI, depth) >= trinary_s(small, path, MPI, depth)
    assert trinary_s(small, path, MPI, depth + 1) > trinary_s(small, path, MPI, depth)


def _priced(ranks: int, nbytes: float) -> tuple[float, float, HardwareCosts]:
    system = load_spec("systems", "fugaku")
    plan = Plan(system, ranks, Parallelism(tp=1, pp=1, dp=ranks), ranks)
    costs = HardwareCosts(system, plan, "fp32")
    launch_s = system.node.accelerator.kernel_launch_us * 1e-6
    priced = costs.comm_s(CommOp("dp", "all_reduce", "dp", "B", nbytes))
    return priced - launch_s, launch_s, costs


@pytest.mark.parametrize(("ranks", "nbytes", "algorithm"), [
    (32, 32 * 8192, "ring"),
    (16, 16 * 8192 - 4, "doubling"),     # under 8 KiB a process
    (64, 98304, "doubling"),             # up to 96 KiB above 32 processes
    (64, 98308, "trinary"),
    (64, 256 * MIB, "trinary"),
])
def test_the_rules_pick_the_algorithm(ranks: int, nbytes: int, algorithm: str) -> None:
    priced, _, costs = _priced(ranks, nbytes)
    model = costs.collectives
    path, where, mpi = model.path("dp"), model.geometry("dp"), model.system.network.mpi
    expected = {
        "ring": lambda: mpi_ring_s(nbytes, path, mpi),
        "doubling": lambda: doubling_s(nbytes, path, mpi,
                                       doubling_hops(where.nodes, where.hops), where.hop_s),
        "trinary": lambda: trinary_s(nbytes, path, mpi, where.depth),
    }[algorithm]()
    assert priced == pytest.approx(expected, rel=1e-12)


def test_past_the_rules_llmsims_own_algorithms_price_it() -> None:
    """More processes than ``tree_max_ranks``, a library without the eager cost, or
    another collective: no MPI algorithm (None)."""
    path = _path(4096)
    assert mpi_all_reduce_s(MPI, "all_reduce", MIB, path, lambda: None) is None  # type: ignore[arg-type,return-value]
    bare = MPI.model_copy(update={"eager_overhead_us": None, "tree_max_ranks": None,
                                  "doubling_max_bytes": None})
    assert mpi_all_reduce_s(bare, "all_reduce", MIB, _path(64), lambda: None) is None  # type: ignore[arg-type,return-value]
    assert mpi_all_reduce_s(MPI, "all_gather", MIB, _path(64), lambda: None) is None  # type: ignore[arg-type,return-value]


def test_the_tree_is_rooted_at_the_centre_of_the_box() -> None:
    """64 Fugaku nodes are an 8×2×2×2 box of the torus (Z line, a, b, c): a tree from its
    centre reaches every node in 4 + 1 + 1 + 1 hops."""
    _, _, costs = _priced(64, MIB)
    assert costs.collectives.geometry("dp").depth == 7


def test_doubling_steps_on_the_box_follow_its_dimensions() -> None:
    """On the 8×2×2×2 box rank bits 0-2 are c, b, a (one hop each), bits 3-5 the Z line
    (1, 2, 4 hops)."""
    _, _, costs = _priced(64, MIB)
    where = costs.collectives.geometry("dp")
    assert [h for h, _ in doubling_hops(where.nodes, where.hops)] == [1, 1, 1, 1, 2, 4]
    assert np.array_equal(where.nodes, np.arange(64))


def test_the_tree_rules_come_together() -> None:
    fields = dict(ring_max_ranks=32, ring_min_bytes_per_rank=8192, step_overhead_us=7.2,
                  reduce_gbps=57.3)
    with pytest.raises(ValidationError, match="doubling_max_bytes"):
        MpiCollectives(**fields, eager_overhead_us=1.26, tree_max_ranks=3840)
    with pytest.raises(ValidationError, match="tree_max_ranks"):
        MpiCollectives(**fields, eager_overhead_us=1.26, tree_max_ranks=16,
                       doubling_max_bytes=98304)
    with pytest.raises(ValidationError, match="eager_overhead_us"):
        MpiCollectives(**fields, eager_overhead_us=-1.0)
