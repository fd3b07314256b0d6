"""Specs: hypothesis round-trips through dicts and YAML, and field documentation."""

from __future__ import annotations

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from llmsim import load_spec, loader
from llmsim.errors import UserError
from llmsim.specs import Accelerator, Model, Parallelism, Scenario, System, Training


@st.composite
def models(draw):
    head_dim = draw(st.sampled_from([32, 64, 128]))
    heads = draw(st.sampled_from([4, 8, 16, 32]))
    kv = draw(st.sampled_from([h for h in (1, 2, 4, 8, heads) if heads % h == 0]))
    return Model(
        name="m", layers=draw(st.integers(1, 128)), hidden=heads * head_dim, heads=heads,
        kv_heads=kv, ffn_hidden=draw(st.integers(1, 8)) * 256, vocab=draw(st.integers(1, 10**6)),
        activation=draw(st.sampled_from(["gelu", "swiglu"])),
        tied_embeddings=draw(st.booleans()),
        position_embedding=draw(st.sampled_from(["learned", "rope"])),
        norm=draw(st.sampled_from(["layernorm", "rmsnorm"])), bias=draw(st.booleans()),
    )


parallelisms = st.builds(
    Parallelism, tp=st.integers(1, 16), pp=st.integers(1, 16),
    dp=st.one_of(st.just("auto"), st.integers(1, 1024)),
    schedule=st.sampled_from(["gpipe", "1f1b", "zb-h1"]), micro_batch=st.integers(1, 8),
    zero=st.integers(0, 3), sequence_parallel=st.booleans(),
    recompute=st.sampled_from(["none", "selective", "full"]), overlap_dp_comm=st.booleans(),
)
trainings = st.builds(
    Training, global_batch=st.integers(1, 10**5), seq_len=st.integers(1, 10**6),
    precision=st.sampled_from(["bf16", "fp16", "fp8", "fp32"]),
    attention_kernel=st.sampled_from(["flash", "cudnn", "unfused"]),
    tokens=st.one_of(st.none(), st.floats(1e6, 1e14)),
)


def _round_trip(spec):
    again = type(spec).model_validate(spec.model_dump())
    assert again == spec
    via_yaml = type(spec).model_validate(yaml.safe_load(yaml.safe_dump(spec.model_dump(
        mode="json"))))
    assert via_yaml == spec


@settings(max_examples=60, deadline=None)
@given(models())
def test_model_round_trips(model):
    _round_trip(model)
    assert model.params > 0


@settings(max_examples=60, deadline=None)
@given(parallelisms)
def test_parallelism_round_trips(par):
    _round_trip(par)


@settings(max_examples=60, deadline=None)
@given(trainings)
def test_training_round_trips(training):
    _round_trip(training)


@pytest.mark.parametrize("kind, name", [("accelerators", "h100-sxm5-80gb"),
                                        ("systems", "frontier"), ("systems", "fugaku"),
                                        ("models", "llama3-405b")])
def test_catalog_specs_round_trip(kind, name):
    _round_trip(load_spec(kind, name))


def test_scenario_round_trips():
    from llmsim import load_scenario

    _round_trip(load_scenario("frontier"))


@pytest.mark.parametrize("spec", [Accelerator, System, Model, Parallelism, Training, Scenario])
def test_every_field_is_documented(spec):
    docs = spec.field_descriptions()
    assert set(docs) == set(spec.model_fields)
    for name, doc in docs.items():
        assert doc, f"{spec.__name__}.{name} has no docstring"


def test_field_descriptions_are_the_attribute_docstrings_an_inherited_field_too():
    """Read from the source on first ask: the docstring under each field, cleaned of its
    indentation, the parent's for an inherited field, "" for a field without one."""
    from typing import ClassVar

    from llmsim.specs._base import Spec

    class Parent(Spec):
        a_s: float = 1.0
        """Seconds of a.

        Second paragraph."""

    class Child(Parent):
        b_bytes: int = 2
        """Bytes of b."""
        c: int = 3
        d: ClassVar[str] = "not a field"
        """A class variable's docstring is no field's."""

    assert Child.field_descriptions() == {"a_s": "Seconds of a.\n\nSecond paragraph.",
                                          "b_bytes": "Bytes of b.", "c": ""}


def test_specs_are_frozen_and_reject_unknown_fields():
    par = Parallelism()
    with pytest.raises(ValidationError):
        par.tp = 2
    with pytest.raises(ValidationError):
        Parallelism(tensor_parallel=2)


def test_a_list_item_with_too_few_entries_is_named_with_its_value():
    """A tile of one number (gemm.extra_tiles: [[128]]) is a clear user error, not a
    'missing field' with a tuple index for a name."""
    raw = load_spec("accelerators", "h100-sxm5-80gb").model_dump(mode="json")
    raw["gemm"]["extra_tiles"] = [[128]]
    with pytest.raises(UserError, match=r"gemm\.extra_tiles\[0\] = \[128\] has too few items"):
        loader.validate(Accelerator, raw, "bad.yaml")


def test_a_dropout_of_one_is_a_clear_user_error():
    """Dropout is a probability below 1; the message names the field, value and limit."""
    raw = {"global_batch": 8, "seq_len": 128, "hidden_dropout": 1.0}
    with pytest.raises(UserError, match=r"hidden_dropout.*1\.0.*less than 1"):
        loader.validate(Training, raw, "bad.yaml")


def test_an_unknown_tp_overlap_gemm_is_a_clear_user_error():
    """tp_overlap_gemms takes Transformer Engine's GEMM names; a typo names the key."""
    raw = {"tp": 2, "tp_overlap_gemms": {"fc3_fprop": {"method": "bulk"}}}
    with pytest.raises(UserError,
                       match=r"tp_overlap_gemms has the key .fc3_fprop., which is not allowed"):
        loader.validate(Parallelism, raw, "bad.yaml")


@pytest.mark.parametrize("field", ["grad_bucket_nan_check", "grad_bucket_prescale"])
def test_bucket_checks_with_zero_3_are_a_clear_user_error(field):
    """The bucket checks are Megatron-Core DDP's; ZeRO-3 reduces through its own hooks."""
    raw = {"zero": 3, field: True}
    with pytest.raises(UserError, match=rf"parallelism\.{field}: true with zero 3.*set zero"):
        loader.validate(Parallelism, raw, "bad.yaml")


@pytest.mark.parametrize(("schedule", "zero"), [("zb-h1", 1), ("1f1b", 3)])
def test_aligned_reductions_outside_megatron_cores_schedules_are_a_clear_user_error(
        schedule, zero):
    raw = {"pp": 2, "schedule": schedule, "zero": zero, "grad_reduce_launch": "pp_aligned"}
    with pytest.raises(UserError, match=r"grad_reduce_launch: pp_aligned with schedule "
                       rf"{schedule} and zero {zero}.*bucket_ready"):
        loader.validate(Parallelism, raw, "bad.yaml")
