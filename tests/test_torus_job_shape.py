"""The job's torus shape given by the user (``network.job_shape``).

On Fugaku a job asks the job manager for its shape (``pjsub -L "node=16:torus"``, a 1-D
shape of 16 nodes; ``"node=4x4x4:torus"``, 3-D), and the job manager lays each extent as
a ring of neighbouring nodes (Tofu's virtual torus). With ``job_shape`` the placement and
every torus cost run on that torus instead of the box llmsim picks from ``network.dims``
(docs/cost-models.md, "The job's shape").
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_cli import run_cli
from test_topology import costs, system, torus

from llmsim.costs.alltoall import torus_sub_block
from llmsim.costs.collectives.mpi_doubling import doubling_hops
from llmsim.costs.collectives.mpi_rules import group_geometry
from llmsim.costs.topology import job_shape_line, placement_rows, topology_of
from llmsim.loader import load_spec
from llmsim.ops import CommOp
from llmsim.plan import Plan
from llmsim.specs import Parallelism, System
from llmsim.specs.network import job_shape_fits

FUGAKU = [24, 23, 24, 2, 3, 2]
"""Fugaku's Tofu-D dimensions X, Y, Z, a, b, c (hardware/systems/fugaku.yaml)."""


def shaped(dims: list[int], shape: list[int] | None, nodes: int) -> System:
    """A torus system of ``nodes`` one-device nodes on ``dims`` with the job shape
    ``shape``."""
    return system({**torus(dims), "job_shape": shape}, nodes)


def fugaku_with(shape: list[int]) -> System:
    """The catalog's Fugaku with ``network.job_shape`` set."""
    fugaku = load_spec("systems", "fugaku")
    return System.model_validate({**fugaku.model_dump(),
                                  "network": {**fugaku.network.model_dump(),
                                              "job_shape": shape}})


def test_fugaku_takes_the_shapes_its_job_manager_gives() -> None:
    """The machine's torus as a job sees it is X·a × Y·b × Z·c = 48 × 69 × 48; the
    shapes of the runs in workloads/validation/collectives.csv fit it, a 1-D shape up
    to the whole machine, axes in any order."""
    network = fugaku_with([16]).network
    assert network.virtual_dims == [48, 69, 48]
    for shape in ([16], [32], [4, 4, 4], [4, 6, 16], [16, 4, 6], [48, 69, 48], [69, 48, 48],
                  [158976], [3312, 48]):
        assert job_shape_fits(shape, network.virtual_dims), shape
    for shape in ([158977], [49, 69, 48], [70, 70, 10], [100, 100, 100]):
        assert not job_shape_fits(shape, network.virtual_dims), shape


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 12), min_size=1, max_size=5), st.data())
def test_a_shape_fits_exactly_when_the_machine_can_hold_it(dims: list[int],
                                                           data: st.DataObject) -> None:
    """A shape made by giving each machine dimension to one extent, each extent at most
    the product of its own, fits; one that holds more nodes than the machine never does."""
    k = data.draw(st.integers(1, min(3, len(dims))))
    owner = data.draw(st.lists(st.integers(0, k - 1), min_size=len(dims), max_size=len(dims)))
    sizes = [math.prod(d for d, o in zip(dims, owner, strict=True) if o == j) for j in range(k)]
    shape = [data.draw(st.integers(1, size)) for size in sizes]
    assert job_shape_fits(shape, dims)
    bigger = [*shape[:-1], shape[-1] * math.prod(dims) + 1]
    assert not job_shape_fits(bigger, dims)


@pytest.mark.parametrize(("shape", "needle"), [
    ("[100,100,100]", "does not fit the machine's torus 48×69×48"),
    ("[200000]", "a 1-D shape at most the machine's 158976 nodes"),
    ("[2,2,2,2]", "has 4 extents; a job asks for a 1-D to 3-D shape"),
    ("[16]", "holds 16 nodes, fewer than the job's 158976"),
    ("[0,4]", "job_shape[0] = 0"),
])
def test_bad_job_shapes_are_one_line_errors(capsys, shape: str, needle: str) -> None:
    code, out, err = run_cli(["run", "fugaku", "--set", f"system.network.job_shape={shape}"],
                             capsys)
    assert code == 2
    assert needle in err and "job_shape" in err and "Traceback" not in err + out
    assert len(err.strip().splitlines()) == 1


def test_a_1d_shape_puts_the_ring_in_a_line_of_neighbours() -> None:
    """16 nodes on ``node=16:torus``: node i's neighbours are i ± 1 and the ring closes,
    so recursive doubling's partners are 1, 2, 4 and 8 hops away; llmsim's own box of
    Fugaku for 16 nodes (2×2×2×2, along Z, a, b... as its fill gives) puts every partner
    one hop away."""
    one_d = topology_of(fugaku_with([16]), 16)
    assert one_d.shape == [16] and one_d.names() == ["X"]
    assert [one_d.distance(0, b) for b in (1, 2, 4, 8, 15)] == [1, 2, 4, 8, 1]
    plan = Plan(fugaku_with([16]), 16, Parallelism(dp=16), 16)
    geometry = group_geometry(plan, "dp", 0)
    assert [h for h, _ in doubling_hops(geometry.nodes, geometry.hops)] == [1, 2, 4, 8]
    own = Plan(load_spec("systems", "fugaku"), 16, Parallelism(dp=16), 16)
    geometry = group_geometry(own, "dp", 0)
    assert [h for h, _ in doubling_hops(geometry.nodes, geometry.hops)] == [1, 1, 1, 1]


def test_a_given_shape_closes_every_extent_into_a_ring() -> None:
    """``node=4x4x4:torus``: each extent of 4 closes (the job holds all of its torus); on
    llmsim's own box of Fugaku the 64 nodes' ring along Z is a line of part of it."""
    topology = topology_of(fugaku_with([4, 4, 4]), 64)
    assert topology.shape == [4, 4, 4] and topology.names() == ["X", "Y", "Z"]
    assert topology.distance(0, 3) == 1 and topology.distance(0, 2) == 2
    dims = topology.dimensions_of(list(range(64)))
    assert dims is not None and all(d.wraps and d.size == 4 for d in dims)


def test_the_machine_fully_given_as_its_shape_changes_nothing() -> None:
    """A 3-D torus used whole, with ``job_shape`` equal to its ``dims``, prices every
    axis exactly as without it (the job's box is then the machine either way)."""
    dims, nodes = [4, 3, 2], 24
    plain, given_ = shaped(dims, None, nodes), shaped(dims, dims, nodes)
    for parallel in ({"tp": 2}, {"tp": 3}, {"tp": 4, "pp": 3}, {"pp": 2}):
        for axis in ("tp", "pp", "dp"):
            ops = [CommOp("x", "all_reduce", axis, "F", 8e6),
                   CommOp("x", "send_recv", axis, "F", 8e6)]
            for op in ops:
                a = costs(plain, nodes, **parallel).comm_s(op)
                b = costs(given_, nodes, **parallel).comm_s(op)
                assert a == b, (parallel, op)


def test_a_1d_shape_is_slower_than_the_box_for_a_strided_group() -> None:
    """The same 64 nodes as a 1-D ring or as a 4×4×4 torus: a data-parallel group of
    stride 4 is a box of the 3-D shape (one hop a step) and 4-hop steps sharing links on
    the 1-D one: the 1-D shape is never faster, and slower here."""
    op = CommOp("x", "all_reduce", "dp", "F", 64e6)
    one_d = costs(shaped([4, 4, 4], [64], 64), 64, tp=4).comm_s(op)
    three_d = costs(shaped([4, 4, 4], [4, 4, 4], 64), 64, tp=4).comm_s(op)
    assert one_d > three_d


def test_the_all_to_all_block_lies_in_the_given_shape() -> None:
    """The all-to-all's most compact sub-block is taken in the job's shape: 16 nodes of
    ``node=16:torus`` are a line of 16, where llmsim's own pick is a 2×2×2×2 block."""
    assert torus_sub_block(fugaku_with([16]).network, 16) == [16]
    assert sorted(torus_sub_block(load_spec("systems", "fugaku").network, 16)) == [
        1, 1, 2, 2, 2, 2]


def test_llmsim_run_says_whose_shape_it_used(capsys) -> None:
    """The run shows the job's torus and whether the user gave it."""
    code, out, _ = run_cli(["run", "fugaku"], capsys)
    assert code == 0 and "chosen by llmsim (give network.job_shape to set it)" in out
    code, out, err = run_cli(["run", "fugaku", "--set", "system.network.job_shape=[48,69,48]"],
                             capsys)
    assert code == 0, err
    assert "torus: the job's 3-D torus 48×69×48 as given (network.job_shape)" in out


def test_placement_names_the_given_shapes_axes() -> None:
    plan = Plan(shaped([4, 4, 4], [4, 16], 64), 64, Parallelism(tp=4, dp=16), 16)
    rows = {r["axis"]: r for r in placement_rows(plan)}
    assert "of the job's 4×16 torus" in str(rows["dp"]["route"])
    assert job_shape_line(plan) == "the job's 2-D torus 4×16 as given (network.job_shape)"
    assert np.array_equal(topology_of(plan.system, 64).coords(17), [1, 1])


def test_a_plan_larger_than_its_given_shape_is_refused() -> None:
    """Built without a scenario (as the collective checks build their plans), a job of
    more nodes than its given shape holds is still an error, not a silently wider box."""
    refused = r"job_shape \[4, 4\] holds 16 nodes, fewer than the job's 32"
    with pytest.raises(ValueError, match=refused):
        topology_of(shaped([4, 4, 4], [4, 4], 32), 32).shape  # noqa: B018
