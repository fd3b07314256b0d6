"""Layers per pipeline stage and chunk: even splits, lighter first/last stages, errors."""

from __future__ import annotations

import re

import pytest
from helpers import LayerOnlyCosts, make_scenario
from hypothesis import given
from hypothesis import strategies as st

from llmsim import simulate
from llmsim.errors import UserError
from llmsim.memory import memory_per_stage
from llmsim.partition import chunk_layers, stage_layers
from llmsim.specs import Parallelism
from llmsim.workload import build_workload


def _par(pp: int, v: int = 1, first: int | None = None, last: int | None = None) -> Parallelism:
    schedule = "interleaved-1f1b" if v > 1 else "1f1b"
    return Parallelism(pp=pp, virtual_stages=v, schedule=schedule,
                       first_stage_layers=first, last_stage_layers=last)


def test_default_is_an_even_split():
    assert stage_layers(96, _par(8)) == [12] * 8
    assert chunk_layers(96, _par(8, v=3)) == [[4, 4, 4]] * 8


def test_zero_bubble_first_and_last_stage_one_layer_fewer():
    # Qi et al. 2024: 22 layers on 8 stages, the first and last one layer fewer.
    assert stage_layers(22, _par(8, first=2, last=2)) == [2, 3, 3, 3, 3, 3, 3, 2]
    # One layer per chunk: the embedding's and the head's chunks are left empty.
    split = chunk_layers(22, _par(8, v=3, first=2, last=2))
    assert split[0] == [0, 1, 1] and split[7] == [1, 1, 0]
    assert all(s == [1, 1, 1] for s in split[1:7])


def test_bloom_partition_by_transformer_and_embedding():
    # 70 layers + embedding + tied head = 72 units on 12 stages (tr11-176B-ml.slurm).
    assert stage_layers(70, _par(12, first=5, last=5)) == [5] + [6] * 10 + [5]


def test_one_count_given_the_other_stages_share_the_rest():
    assert stage_layers(30, _par(4, first=3)) == [3, 9, 9, 9]
    assert stage_layers(30, _par(4, last=0)) == [10, 10, 10, 0]


@pytest.mark.parametrize(("layers", "par", "message"), [
    (10, _par(4), "model.layers: 10 is not divisible by pp·virtual_stages"),
    (22, _par(8, first=3, last=2), "leave 17 of model.layers=22 for the other 6 stage(s)"),
    (4, _par(4, first=3, last=3), "leave -2 of model.layers=4"),
    (20, _par(4, v=3, first=2, last=2), "parallelism.virtual_stages: 3 does not divide the 8"),
    (20, _par(4, v=3, first=0, last=2), "parallelism.first_stage_layers: 0 layers over 3"),
])
def test_splits_that_cannot_work_name_the_field(layers, par, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        chunk_layers(layers, par)


def test_edge_counts_need_a_pipeline():
    with pytest.raises(ValueError, match=re.escape("first_stage_layers: 2 needs pp ≥ 2")):
        Parallelism(pp=1, first_stage_layers=2)


@given(pp=st.integers(2, 12), v=st.integers(1, 4), mid=st.integers(1, 6),
       first=st.integers(0, 8), last=st.integers(0, 8))
def test_every_layer_lands_on_exactly_one_chunk(pp, v, mid, first, last):
    layers = first + last + (pp - 2) * mid * v
    try:
        split = chunk_layers(layers, _par(pp, v, first, last))
    except ValueError:
        return  # an edge stage too thin for its chunks: refused, with a sentence
    assert sum(map(sum, split)) == layers
    assert [sum(s) for s in split] == [first] + [mid * v] * (pp - 2) + [last]
    assert all(n > 0 for s in split[1:-1] for n in s)


def _uneven(**extra):
    return make_scenario(nodes=4, model__layers=16, parallelism__tp=8, parallelism__pp=4,
                         parallelism__first_stage_layers=3, parallelism__last_stage_layers=3,
                         training__global_batch=8, **extra)


def test_workload_and_memory_follow_the_split():
    s = _uneven()
    work = build_workload(s.model, s.parallelism, s.training, s.dp)
    assert [work.chunks[(i, 0)].layers for i in range(4)] == [3, 5, 5, 3]
    even = make_scenario(nodes=4, model__layers=16, parallelism__tp=8, parallelism__pp=4,
                         training__global_batch=8)
    even_work = build_workload(even.model, even.parallelism, even.training, even.dp)
    assert work.model_flops() == pytest.approx(even_work.model_flops(), rel=1e-12)
    assert sum(work.stage_params(i) for i in range(4)) == sum(
        even_work.stage_params(i) for i in range(4))
    memory = memory_per_stage(s.model, s.parallelism, s.training, s.dp,
                              s.system.node.accelerator)
    assert [m.layers for m in memory] == [3, 5, 5, 3]
    assert [m.params for m in memory] == [work.stage_params(i) for i in range(4)]
    assert memory[1].activations_bytes > memory[2].activations_bytes  # more in flight


def test_memory_refuses_a_split_with_a_user_error():
    s = _uneven()
    bad = s.parallelism.model_copy(update={"first_stage_layers": 4})
    with pytest.raises(UserError, match=re.escape("parallelism: first_stage_layers=4")):
        memory_per_stage(s.model, bad, s.training, s.dp, s.system.node.accelerator)


def test_gpipe_with_uneven_stages_matches_the_flow_shop_closed_form():
    # Free communication and identical micro-batches: the forward wave takes
    # Σ f_i + (m − 1)·max f_i, the backward wave the same in b_i (permutation flow shop).
    m = 8
    result = simulate(_uneven(parallelism__schedule="gpipe"), costs=LayerOnlyCosts())
    blocks = result.trace.blocks
    f = [blocks[(i, 0, "F")].duration_s for i in range(4)]
    # Without a split backward the weight gradients run right after the input gradients.
    b = [blocks[(i, 0, "B")].duration_s + blocks[(i, 0, "W")].duration_s for i in range(4)]
    assert f[1] / f[0] == pytest.approx(5 / 3)
    expected = sum(f) + (m - 1) * max(f) + sum(b) + (m - 1) * max(b)
    assert result.trace.stage_last_compute_s[0] == pytest.approx(expected, rel=1e-9)


def test_zero3_gathers_a_chunk_that_holds_only_the_embedding():
    s = make_scenario(nodes=4, model__layers=10, parallelism__tp=4, parallelism__pp=4,
                      parallelism__schedule="interleaved-1f1b", parallelism__virtual_stages=3,
                      parallelism__first_stage_layers=2, parallelism__last_stage_layers=2,
                      parallelism__zero=3, training__global_batch=16)
    work = build_workload(s.model, s.parallelism, s.training, s.dp)
    embedding_only = work.chunks[(0, 0)]
    assert s.dp == 2 and embedding_only.layers == 0 and embedding_only.first
    assert len(work.weight_gathers(embedding_only)) == 1
    result = simulate(s)
    assert result.step_time_s > 0
    assert sum(result.stages[0].as_dict().values()) == pytest.approx(result.step_time_s)


@given(st.integers(1, 130), st.integers(1, 16), st.integers(1, 6),
       st.one_of(st.none(), st.integers(0, 12)), st.one_of(st.none(), st.integers(0, 12)),
       st.one_of(st.none(), st.lists(st.integers(1, 20), min_size=1, max_size=16)))
def test_the_memoised_refusal_is_chunk_layers_own(layers: int, pp: int, v: int,
                                                  first: int | None, last: int | None,
                                                  per_stage: list[int] | None) -> None:
    """``split_refused`` (the scenario's validation's memoised check) says "" exactly where
    :func:`chunk_layers` splits the layers, and its sentence otherwise."""
    from llmsim.partition import split_refused
    from llmsim.specs import Parallelism

    par = Parallelism.model_construct(pp=pp, virtual_stages=v, first_stage_layers=first,
                                      last_stage_layers=last, layers_per_stage=per_stage)
    try:
        chunk_layers(layers, par)
        want = ""
    except ValueError as exc:
        want = str(exc)
    assert split_refused(layers, pp, v, first, last,
                         None if per_stage is None else tuple(per_stage)) == want
