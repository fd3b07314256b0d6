"""RCCL's algorithm choice (``network.collective_algorithms`` of ``frontier`` and ``lumi``):
its tuner runs an all-gather or reduce-scatter only as a ring, at any size and node count,
and an all-reduce as the ring or the tree (ROCm/rccl ``src/graph/tuning.cc`` @0cbce2a)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmsim.costs.collectives import algorithm_times_s, group_path, hierarchical_s, ring_s
from llmsim.costs.collectives.model import CollectiveModel
from llmsim.errors import UserError
from llmsim.loader import load_spec, validate
from llmsim.plan import Plan
from llmsim.specs import Parallelism, System

FRONTIER = load_spec("systems", "frontier")


def _dp_path(system: System, nodes: int, tp: int):
    """The path of a dp group with ``8 / tp`` members on each of ``nodes`` nodes."""
    plan = Plan(system, nodes, Parallelism(tp=tp, pp=1, dp=nodes * 8 // tp), nodes * 8 // tp)
    return plan, group_path(system, plan.placements["dp"], plan)


@settings(max_examples=25, deadline=None)
@given(nodes=st.sampled_from([2, 4, 16, 64, 128]), tp=st.sampled_from([1, 2, 4]),
       log2_bytes=st.integers(10, 32), collective=st.sampled_from(["all_gather",
                                                                   "reduce_scatter"]))
def test_rccl_prices_all_gather_and_reduce_scatter_as_the_ring(nodes, tp, log2_bytes,
                                                                collective):
    plan, path = _dp_path(FRONTIER, nodes, tp)
    nbytes = float(2**log2_bytes)
    times = algorithm_times_s(collective, nbytes, path, None,
                              FRONTIER.network.collective_algorithms)
    assert times == {"ring": ring_s(collective, nbytes, path)}
    launch_s = 1e-6 * FRONTIER.node.accelerator.kernel_launch_us
    model = CollectiveModel(FRONTIER, plan, launch_s=launch_s)
    assert model._price(collective, "dp", nbytes) == pytest.approx(
        ring_s(collective, nbytes, path) + launch_s)


def test_all_reduce_takes_the_ring_or_the_tree_never_two_level():
    _, path = _dp_path(FRONTIER, 64, 2)
    for nbytes in (2.0**12, 2.0**20, 2.0**30):
        times = algorithm_times_s("all_reduce", nbytes, path, None,
                                  FRONTIER.network.collective_algorithms)
        assert set(times) == {"ring", "tree"}


def test_without_the_field_the_two_level_algorithm_would_win():
    """The restriction matters: on 64 nodes x 8 a 32 MiB reduce-scatter (the
    FRONTIER-PCCL-C-RS0512-32M point) is cheaper as llmsim's two-level algorithm, which
    RCCL does not run: 511 ring steps against 7 + 63."""
    _, path = _dp_path(FRONTIER, 64, 1)
    nbytes = 32.0 * 2**20
    assert hierarchical_s("reduce_scatter", nbytes, path) < ring_s("reduce_scatter", nbytes,
                                                                    path)
    times = algorithm_times_s("reduce_scatter", nbytes, path)
    assert min(times, key=times.get) == "hierarchical"


def test_an_unknown_algorithm_is_a_one_sentence_error():
    raw = FRONTIER.model_dump(mode="json")
    raw["network"]["collective_algorithms"] = {"all_gather": ["two_level"]}
    with pytest.raises(UserError, match="collective_algorithms"):
        validate(System, raw, "frontier.yaml")


def test_a_listed_set_that_never_applies_is_a_one_sentence_error():
    """A collective listed with only algorithms that cannot run it (the tree cannot
    all-gather) is refused naming the field, not a traceback from an empty choice."""
    _, path = _dp_path(FRONTIER, 4, 1)
    with pytest.raises(UserError, match="collective_algorithms gives all_gather"):
        algorithm_times_s("all_gather", 2.0**20, path, None, {"all_gather": ["tree"]})
