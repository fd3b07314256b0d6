"""Session s16's per-layout shortcuts (branch ``speedI``) make the objects and numbers of
the code they replace: the validated copies made in one step
(:func:`llmsim.search.fast_rules.copied`), the known values looked up with their type
(:func:`llmsim.search.fast_rules._known_valid`), the estimator's family index from the
last scenario (:meth:`llmsim.search.parts.SharedParts._family`) and a batch's columns
packed without a pass over its numpy arrays (:func:`llmsim.search.price.packed`)."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import llmsim
from llmsim.search import fast_rules
from llmsim.search.estimate import Estimator
from llmsim.search.price import packed

_BASE = llmsim.load_scenario("selene-gpt3").model_copy(update={"fidelity": "reduced"})
_OTHER = llmsim.load_scenario("frontier").model_copy(update={"fidelity": "reduced"})

_PAR_UPDATES = st.fixed_dictionaries({}, optional={
    "tp": st.sampled_from([1, 2, 4, 8]), "pp": st.sampled_from([1, 2, 4, 8]),
    "dp": st.sampled_from([1, 8, 64]), "zero": st.integers(0, 3),
    "micro_batch": st.sampled_from([1, 2]), "sequence_parallel": st.booleans(),
    "overlap_tp_comm": st.booleans(), "overlap_param_gather": st.booleans(),
    "recompute": st.sampled_from(["none", "selective", "full"]),
    "first_stage_layers": st.none(), "moe_comm_units": st.just(0)})


def _reference(obj, updates):
    """What :func:`fast_rules.revalidated` made before: ``model_copy`` with every field
    then counted as set."""
    out = obj.model_copy(update=updates)
    object.__setattr__(out, "__pydantic_fields_set__", set(type(obj).model_fields))
    return out


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_PAR_UPDATES, st.sampled_from([1, 16, 128]), st.booleans())
def test_copied_equals_model_copy_with_every_field_set(updates: dict, nodes: int,
                                                       whole: bool) -> None:
    """Property: ``copied`` of a parallelism and of a scenario (with that parallelism)
    equals ``model_copy``'s object field for field, with the same fields counted as set,
    the same extra and private parts, its own ``__dict__`` and its source unchanged."""
    par = _BASE.parallelism
    before = dict(par.__dict__)
    got, want = fast_rules.copied(par, updates), _reference(par, updates)
    assert type(got) is type(want) and got == want and got.__dict__ == want.__dict__
    assert got.model_fields_set == want.model_fields_set == set(type(par).model_fields)
    assert got.__pydantic_extra__ == want.__pydantic_extra__
    assert got.__pydantic_private__ == want.__pydantic_private__
    assert got.__dict__ is not par.__dict__ and par.__dict__ == before
    scenario_updates = {"nodes": nodes, "parallelism": got} if whole else {"nodes": nodes}
    sc = fast_rules.copied(_BASE, scenario_updates)
    assert sc == _reference(_BASE, scenario_updates)
    assert sc.model_fields_set == set(type(_BASE).model_fields)
    assert sc.parallelism is (got if whole else _BASE.parallelism)


def test_a_known_value_is_known_with_its_type() -> None:
    """A value pydantic kept is known as that type's: ``True`` equals ``1`` (and hashes
    alike), yet pydantic may keep one and convert the other, so ``zero=True`` is not
    known from ``zero=1``."""
    par = _BASE.parallelism
    cls = type(par)
    fast_rules.revalidated(par, {"zero": 1}, lambda: cls.model_validate(
        {**par.model_dump(), "zero": 1}))
    assert fast_rules._known_valid(cls, par, {"zero": 1})
    assert not fast_rules._known_valid(cls, par, {"zero": True})
    assert not fast_rules._known_valid(cls, par, {"zero": 1.0})


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=1, max_size=30))
def test_family_index_from_the_last_scenario(picks: list[int]) -> None:
    """Property: scenarios given in any order (the same object again, a copy sharing its
    system, model and training, another machine's) get the index of their (system,
    model, training) objects in order of first appearance, as the family key alone
    gives it."""
    pool = [_BASE, _BASE.model_copy(update={"nodes": 64}), _OTHER,
            _OTHER.model_copy(update={"nodes": 8}),
            _BASE.model_copy(update={"training": _BASE.training.model_copy()}), _BASE]
    est, first = Estimator(), {}
    for i in picks:
        sc = pool[i]
        key = (id(sc.system), id(sc.model), id(sc.training))
        want = first.setdefault(key, len(first))
        assert est._family(sc) == want
        assert est._family(sc) == want  # asked again (the fast path)


_COLUMN = st.one_of(
    st.lists(st.one_of(st.none(), st.floats(allow_nan=True)), max_size=6),
    st.lists(st.text(max_size=3), max_size=6),
    st.lists(st.integers(-5, 5), max_size=6),
    st.lists(st.booleans(), max_size=6),
    st.lists(st.floats(allow_nan=True), max_size=6).map(lambda v: np.array(v, dtype=float)),
    st.lists(st.integers(0, 9), max_size=6).map(np.array))


@given(st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), _COLUMN, max_size=4))
def test_packed_equals_a_pass_over_every_value(columns: dict) -> None:
    """Property: ``packed`` gives the arrays a pass over every value gave (an object array
    where a value is None), dtype for dtype and value for value."""
    got = packed(columns)
    assert list(got) == list(columns)
    for name, values in columns.items():
        want = np.asarray(values, dtype=object if any(v is None for v in values) else None)
        assert got[name].dtype == want.dtype
        np.testing.assert_array_equal(got[name], want)
