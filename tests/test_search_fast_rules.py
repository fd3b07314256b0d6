"""The search's scenario rules without a pydantic validation per layout
(:mod:`llmsim.search.fast_rules`, ``Scenario.check_switch_rules``) accept exactly the
layouts pydantic's validation accepts, make equal scenarios, and refuse the others with
the same exception and message."""

from __future__ import annotations

import ast
import random
from dataclasses import replace
from functools import cache
from pathlib import Path
from unittest.mock import patch

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import llmsim
from llmsim.errors import UserError
from llmsim.search import fast_rules
from llmsim.search.layout import SWITCHES, Layout
from llmsim.search.price import state_fits, with_switches
from llmsim.search.space import (
    ASYNCHRONOUS,
    SCHEDULES,
    SpaceOptions,
    apply,
    cores,
    parallelism_of,
    switch_variants,
    switched,
)
from llmsim.specs import Scenario

NAMES = ("selene-gpt3", "frontier", "frontier-moe", "deepseek-v3", "aurora")
"""Dense and MoE models, A100, MI250X, H800 and PVC nodes, DualPipe and the
interleaved schedule among the bases."""

VARIANT_FIELDS = (*SWITCHES, "moe_a2a_overlap", "moe_comm_units", "moe_shared_expert_overlap",
                  "tp_overlap_units")
"""The parallelism's fields (and property) that differ between switch variants."""


@cache
def _base(name: str) -> llmsim.specs.Scenario:
    return llmsim.load_scenario(name).model_copy(update={"fidelity": "reduced"})


@cache
def _cores(name: str) -> list[Layout]:
    """A seeded sample of the scenario's enumerated core layouts (an MoE model's at its
    own tp and micro-batch 1, its whole space being large)."""
    base = _base(name)
    fixed = {"tp": base.parallelism.tp, "micro_batch": 1} if base.model.moe else {}
    space = list(cores(base, SpaceOptions(fixed=fixed), state_fits(base, 0.1)))
    return sorted(random.Random(3).sample(space, min(200, len(space))))


def _outcome(base: llmsim.specs.Scenario, layout: Layout) -> tuple:
    """``apply``'s scenario and the fields it counts as set, or its exception and message."""
    try:
        scenario = apply(base, layout)
    except (ValueError, UserError) as exc:
        return type(exc), str(exc)
    return scenario, scenario.model_fields_set, scenario.parallelism.model_fields_set


@st.composite
def _layouts(draw: st.DrawFn) -> tuple[str, Layout]:
    """A catalog scenario and a layout of it: an enumerated core with its fields redrawn
    at random (valid or not: degrees that do not divide, a ZeRO stage pydantic refuses,
    switches without what they need, too many nodes)."""
    name = draw(st.sampled_from(NAMES))
    base = _base(name)
    core = draw(st.sampled_from(_cores(name)))
    changes = draw(st.fixed_dictionaries({}, optional={
        "tp": st.sampled_from([1, 2, 3, 4, 8, 16]),
        "pp": st.sampled_from([1, 2, 3, 4, 8, 16]),
        "dp": st.sampled_from([1, 2, 4, 16, 64]),
        "virtual_stages": st.sampled_from([1, 2, 3, 4]),
        "schedule": st.sampled_from(SCHEDULES + ASYNCHRONOUS),
        "micro_batch": st.sampled_from([1, 2, 3, 4]),
        "zero": st.integers(0, 4),
        "sequence_parallel": st.booleans(),
        "recompute": st.sampled_from(["none", "selective", "full"]),
        **{switch: st.booleans() for switch in SWITCHES},
        "moe_a2a_overlap": st.booleans(),
        "ep": st.sampled_from([1, 2, 8]),
        "cp": st.sampled_from([1, 2]),
        "expert_tp": st.sampled_from([0, 1, 2]),
        "parameter_servers": st.sampled_from([0, 1, 4]),
        "global_batch": st.sampled_from([base.training.global_batch, 96]),
    }))
    layout = replace(core, **changes)
    per_node = base.system.node.devices_per_node
    nodes = draw(st.sampled_from([max(1, layout.devices // per_node), base.nodes_used + 1]))
    return name, replace(layout, nodes=nodes)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_layouts())
def test_fast_rules_accept_what_pydantic_accepts(drawn: tuple[str, Layout]) -> None:
    """Property: the fast path and pydantic's validation of every field agree on random
    layouts of several catalog scenarios — the same scenario (and the same fields counted
    as set), or the same exception with the same message."""
    name, layout = drawn
    base = _base(name)
    with fast_rules.plain_validation():
        want = _outcome(base, layout)
    assert _outcome(base, layout) == want


def test_random_layouts_are_both_accepted_and_refused() -> None:
    """The property above sees both outcomes, and the fast path itself (not pydantic)."""
    rng, outcomes = random.Random(5), {True: 0, False: 0}
    for name in NAMES:
        base = _base(name)
        for core in rng.sample(_cores(name), 20):
            layout = replace(core, zero=rng.choice([0, 1, 2, 3]),
                             overlap_tp_comm=rng.random() < 0.5)
            with fast_rules.plain_validation():
                want = _outcome(base, layout)
            outcomes[not isinstance(want[0], type)] += 1
            assert _outcome(base, layout) == want
    assert min(outcomes.values()) > 5, outcomes


def test_known_values_skip_pydantic_and_a_refusal_is_pydantic_s_own() -> None:
    base = _base("selene-gpt3")
    par = base.parallelism
    valid = {"zero": 1, "micro_batch": 2}
    want = type(par).model_validate({**par.model_dump(), **valid})
    assert fast_rules.revalidated(par, valid, lambda: want) == want  # learns the values

    def not_called() -> None:
        raise AssertionError("pydantic was called")

    got = fast_rules.revalidated(par, valid, not_called)
    assert got == want and got.model_fields_set == want.model_fields_set
    assert got is not want
    # Known values that a rule refuses together (the parameter gather overlap at ZeRO 0):
    for known in ({"zero": 0}, {"zero": 1, "overlap_param_gather": True}):
        fast_rules.revalidated(par, known, lambda known=known: type(par).model_validate(
            {**par.model_dump(), **known}))
    refused = {"zero": 0, "overlap_param_gather": True}
    with pytest.raises(ValueError) as plain:
        type(par).model_validate({**par.model_dump(), **refused})
    with pytest.raises(ValueError) as fast:
        fast_rules.revalidated(par, refused,
                               lambda: type(par).model_validate({**par.model_dump(), **refused}))
    assert type(fast.value) is type(plain.value) and str(fast.value) == str(plain.value)
    # A value pydantic refuses as a field (ZeRO 4) is never taken as known:
    with pytest.raises(ValueError, match="zero"):
        parallelism_of(base, replace(_cores("selene-gpt3")[0], zero=4))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(NAMES), st.data())
def test_switch_variants_checked_by_the_switch_rules_alone(name: str, data: st.DataObject
                                                             ) -> None:
    """Property: a valid core layout with any overlap switches, checked by the
    parallelism's rules and only the scenario's switch rules (``with_switches``), is
    accepted exactly where every rule of the scenario accepts it, as an equal scenario,
    and refused with the same rule's message."""
    base = _base(name)
    core = data.draw(st.sampled_from(_cores(name)))
    with fast_rules.plain_validation():
        try:
            core_scenario = apply(base, core)
        except (ValueError, UserError):
            return
    layout = replace(core, **data.draw(st.fixed_dictionaries(
        {switch: st.booleans() for switch in (*SWITCHES[1:], "moe_a2a_overlap")})))
    with patch.object(Scenario, "check_switch_rules", Scenario._check_layout):
        want = _switched(core_scenario, layout)
    assert _switched(core_scenario, layout) == want


def _switched(core: Scenario, layout: Layout) -> tuple:
    try:
        return (with_switches(core, layout),)
    except ValueError as exc:
        return type(exc), str(exc)


def test_enumerated_switch_variants_equal_the_whole_validation() -> None:
    """Every switch variant the search makes of a sample of valid core layouts equals
    ``switched``'s (the variant's parallelism and scenario validated whole)."""
    checked = 0
    for name in NAMES:
        base = _base(name)
        for core in _cores(name)[::4]:
            try:
                core_scenario = apply(base, core)
            except (ValueError, UserError):
                continue
            for layout in switch_variants(core, {}):
                with fast_rules.plain_validation():
                    want = switched(core_scenario, base, layout)
                assert with_switches(core_scenario, layout) == want
                checked += 1
    assert checked > 100


def _attributes(path: Path) -> set[str]:
    """The attribute names read in ``path`` and the strings that name one (``getattr``)."""
    tree = ast.parse(path.read_text())
    return {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)} | {
        node.value for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        and node.value.isidentifier()}


def test_only_the_switch_rules_read_the_switches() -> None:
    """Ties ``Scenario.check_switch_rules`` to the validation: no other rule of the
    scenario's (its module, the placement's checks, the layer split) reads a field that
    differs between switch variants, and no property of the parallelism it calls does
    but ``tp_overlap_units``."""
    specs = Path(llmsim.__file__).parent / "specs"
    for path in (specs / "scenario.py", specs / "placement.py",
                 Path(llmsim.__file__).parent / "partition.py"):
        assert not _attributes(path) & set(VARIANT_FIELDS), path
    assert {"moe_a2a_overlap", "moe_shared_expert_overlap", "tp_overlap_units"} <= \
        _attributes(specs / "switch_rules.py")
    tree = ast.parse((specs / "parallelism.py").read_text())
    reads = {fn.name for fn in ast.walk(tree) if isinstance(fn, ast.FunctionDef)
             and any(isinstance(d, ast.Name) and d.id == "property" for d in fn.decorator_list)
             and {n.attr for n in ast.walk(fn) if isinstance(n, ast.Attribute)}
             & set(VARIANT_FIELDS)}
    assert reads == {"tp_overlap_units"}
