"""The layout search over an MoE model's switches with expert and context parallelism:
ZeRO-3 and the overlapped parameter gather with ep or cp, and the MoE all-to-all overlap
(llmsim.search.space), priced by the estimator within 5 % of the engine."""

from __future__ import annotations

import random

import pytest
from test_search import TINY

import llmsim
from llmsim.search import search
from llmsim.search.estimate import Estimator
from llmsim.search.fix import parse_fix
from llmsim.search.price import applied, with_switches
from llmsim.search.space import (
    SpaceOptions,
    a2a_overlap_allowed,
    apply,
    cores,
    layout_of,
    parallelism_of,
    switch_variants,
    switched,
)
from llmsim.simulation import simulate

SMALL_MOE = dict(TINY, name="tiny-moe-search",
                 model=dict(TINY["model"], name="small-moe", activation="swiglu", bias=False,
                            norm="rmsnorm", position_embedding="rope", tied_embeddings=False,
                            moe={"experts": 4, "top_k": 2, "ffn_hidden": 2048}))
"""test_search's 12-layer model with 4 experts, 2 per token, on 4 nodes of 8 A100s."""

MIXTRAL = {"name": "mixtral-search", "system": "selene", "nodes": 4, "model": "mixtral-8x7b",
           "parallelism": {"tp": 1, "pp": 1, "ep": 8, "dp": "auto", "micro_batch": 1},
           "training": {"global_batch": 64, "seq_len": 4096, "precision": "bf16",
                        "tokens": 1e11}}
"""Mixtral 8x7B on 4 nodes of 8 A100s (80 GB)."""


def _variants(scenario: llmsim.specs.Scenario, fixed: dict, max_cp: int = 1) -> list:
    return [v for c in cores(scenario, SpaceOptions(fixed=fixed, max_cp=max_cp))
            for v in switch_variants(c, fixed)]


def test_zero3_and_the_gather_overlap_are_tried_with_ep_and_cp() -> None:
    scenario = llmsim.load_scenario(SMALL_MOE)
    fixed = {"recompute": "none", "sequence_parallel": False, "micro_batch": 1, "pp": 2,
             "schedule": "interleaved-1f1b"}
    layouts = _variants(scenario, fixed, max_cp=2)
    assert any(x.zero == 3 and x.ep > 1 for x in layouts)
    assert any(x.zero == 3 and x.cp > 1 for x in layouts)
    assert any(x.overlap_param_gather and x.ep > 1 for x in layouts)
    assert any(x.overlap_param_gather and x.cp > 1 for x in layouts)
    assert all(x.zero in (1, 2) for x in layouts if x.overlap_param_gather)


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_the_all_to_all_overlap_is_tried_only_where_megatron_core_runs_it(
        recompute: str) -> None:
    """Both ways on every layout with an all-to-all, no full recompute, and pp 1 or the
    interleaved schedule (Megatron-Core 4415119414's rules) or DualPipe (DeepSeek-V3's
    own pairs); never elsewhere, even when fixed on; the key tells the two apart."""
    scenario = llmsim.load_scenario(SMALL_MOE)
    fixed = {"recompute": recompute, "sequence_parallel": True, "micro_batch": 1,
             "zero": 1}
    layouts = _variants(scenario, fixed)
    on = [x for x in layouts if x.moe_a2a_overlap]
    for x in layouts:
        all_to_all = x.ep * (x.tp if x.expert_tp == 1 else 1) > 1
        allowed = all_to_all and recompute != "full" and (
            x.pp == 1 or x.schedule in ("interleaved-1f1b", "dualpipe"))
        assert a2a_overlap_allowed(x) == allowed
        if x.moe_a2a_overlap:
            assert allowed
    if recompute == "full":
        assert not on
        assert not [x for x in _variants(scenario, {**fixed, "moe_a2a_overlap": True})
                    if x.moe_a2a_overlap]
    else:
        assert {x.pp for x in on} > {1}
        assert {x.schedule for x in on} == {"1f1b", "interleaved-1f1b", "dualpipe"}
        keys = {x.key for x in layouts}
        assert all(x.key.endswith(".a2a") and x.key.removesuffix(".a2a") in keys for x in on)
    assert parse_fix(["parallelism.moe_a2a_overlap=true"]) == {"moe_a2a_overlap": True}


@pytest.mark.parametrize(("name", "fixed"), [
    ("frontier-moe", {"tp": 8, "ep": 16, "micro_batch": 1, "recompute": "selective",
                      "sequence_parallel": True}),
    ("deepseek-v3", {"tp": 1, "pp": 1, "micro_batch": 1, "recompute": "none", "zero": 1}),
])
def test_switch_variants_by_copy_equal_validated_ones(name: str, fixed: dict) -> None:
    """The search's quick copy of a core's scenario with other switches equals the
    validated one, the all-to-all overlap among them: DeepSeek-V3's 20 units held while
    its all-to-alls overlap, none when they do not."""
    scenario = llmsim.load_scenario(name).model_copy(update={"fidelity": "reduced"})
    space = list(cores(scenario, SpaceOptions(fixed=fixed)))
    sample = random.Random(3).sample(space, min(12, len(space)))
    checked = flipped = 0
    for core in sample:
        par, training = parallelism_of(scenario, core)
        try:
            core_scenario = applied(scenario, core, par, training)
        except ValueError:
            continue
        for layout in switch_variants(core, fixed):
            want = switched(core_scenario, scenario, layout)
            got = with_switches(core_scenario, layout)
            assert got == want
            flipped += layout.moe_a2a_overlap != core.moe_a2a_overlap
            units = got.parallelism.moe_comm_units
            assert units == (scenario.parallelism.moe_comm_units
                             if layout.moe_a2a_overlap else 0)
            checked += 1
    assert checked >= 12 and flipped >= 4


def test_the_scenario_s_own_layout_keeps_its_all_to_all_overlap() -> None:
    scenario = llmsim.load_scenario("deepseek-v3")
    layout = layout_of(scenario)
    assert layout.moe_a2a_overlap and layout.key.endswith(".a2a")
    assert apply(scenario, layout).parallelism == scenario.parallelism


AGREEMENT = [
    ("frontier-moe", ["parallelism.zero=3"]),
    ("frontier-moe", ["parallelism.overlap_param_gather=true"]),
    ("frontier-moe", ["parallelism.moe_a2a_overlap=true", "parallelism.recompute=selective"]),
    ("frontier-moe", ["parallelism.cp=2", "parallelism.dp=auto", "parallelism.zero=3",
                      "parallelism.moe_a2a_overlap=true", "parallelism.recompute=selective"]),
    ("frontier-moe", ["parallelism.cp=2", "parallelism.dp=auto",
                      "parallelism.overlap_param_gather=true"]),
    ("openai-a100-moe", ["parallelism.zero=3"]),
    ("openai-a100-moe", ["parallelism.zero=2", "parallelism.overlap_param_gather=true",
                         "parallelism.moe_a2a_overlap=true",
                         "parallelism.recompute=selective"]),
    ("deepseek-v3", ["parallelism.zero=2", "parallelism.overlap_param_gather=true"]),
]
"""Catalog MoE scenarios with ZeRO-3, the overlapped gather and the all-to-all overlap,
with ep (16, 16, 64) and cp 2."""


@pytest.mark.parametrize(("name", "sets"), AGREEMENT)
def test_estimator_agrees_with_the_engine_on_moe_switches(name: str, sets: list[str]) -> None:
    scenario = llmsim.load_scenario(name, sets).model_copy(update={"fidelity": "reduced"})
    assert Estimator().estimate(scenario).step_time_s == pytest.approx(
        simulate(scenario).step_time_s, rel=0.05)


def test_estimator_agrees_with_the_engine_over_a_small_moe_space() -> None:
    """A seeded sample of a small space of the 4-expert model (tp 2, pp 2 with two chunks
    a stage) at ep or cp 2 or more with ZeRO-3, the overlapped gather or the all-to-all
    overlap, within 5 % of the engine (all 306 of the space: 0.978–1.002)."""
    scenario = llmsim.load_scenario(SMALL_MOE)
    fixed = {"recompute": "selective", "sequence_parallel": True, "micro_batch": 2, "tp": 2,
             "pp": 2, "schedule": "interleaved-1f1b", "overlap_pp_comm": True,
             "virtual_stages": 2}
    space = [x for x in _variants(scenario, fixed, max_cp=2)
             if (x.ep > 1 or x.cp > 1)
             and (x.zero == 3 or x.overlap_param_gather or x.moe_a2a_overlap)]
    layouts = random.Random(5).sample(space, 40)
    assert {x.zero for x in layouts} >= {1, 2, 3} and any(x.moe_a2a_overlap for x in layouts)
    assert any(x.cp > 1 for x in layouts) and any(x.ep > 1 for x in layouts)
    one = Estimator()
    for layout in layouts:
        sc = apply(scenario, layout)
        assert one.estimate(sc).step_time_s == pytest.approx(simulate(sc).step_time_s,
                                                             rel=0.05), layout.key


def test_a_search_picks_zero3_and_the_all_to_all_overlap_where_they_win() -> None:
    """Mixtral 8x7B on 32 A100s without pipeline or tensor parallelism: only ZeRO-3 fits
    (ZeRO-1 and 2 hold a rank's expert weights and gradients whole), and the
    all-to-all overlap hides the dispatch and combine: the best layout, confirmed by the
    engine, is ZeRO-3 with expert parallelism and the overlap, faster in the engine than
    the same layout without it. (Before ep and ZeRO-3 were searched together the only
    layout that fit was ep 1.)"""
    scenario = llmsim.load_scenario(MIXTRAL)
    table = search(scenario, fix={"tp": 1, "pp": 1, "micro_batch": 1,
                                  "recompute": "selective"}, top=2, workers=1)
    assert table.attrs["summary"].out_of_memory > 0 and set(table["zero"]) == {3}
    best = table.iloc[0]
    assert best["zero"] == 3 and best["ep"] > 1 and best["moe_a2a_overlap"]
    without = table[table["key"] == best["key"].removesuffix(".a2a")].iloc[0]
    assert without["step_time_s"] > best["step_time_s"]


def test_cli_search_writes_the_best_moe_layout_with_its_switches(tmp_path, capsys) -> None:
    """``llmsim search`` end to end on the Mixtral job: the best layout's scenario keeps
    ZeRO-3 and the all-to-all overlap, and ``llmsim run`` of it gives the table's step."""
    import json

    import pandas as pd
    import yaml
    from test_cli import run_cli

    path = tmp_path / "mixtral.yaml"
    path.write_text(yaml.safe_dump(MIXTRAL))
    out = tmp_path / "out"
    code, stdout, stderr = run_cli(
        ["search", str(path), "--top", "1", "--workers", "1", "--out", str(out),
         "--fix", "parallelism.tp=1", "--fix", "parallelism.pp=1",
         "--fix", "parallelism.micro_batch=1", "--fix", "parallelism.recompute=selective"],
        capsys)
    assert code == 0, stdout + stderr
    best = llmsim.load_scenario(out / "best.yaml")
    assert best.parallelism.zero == 3 and best.parallelism.moe_a2a_overlap
    table = pd.read_csv(out / "layouts.csv")
    code, stdout, _ = run_cli(["run", str(out / "best.yaml"), "--json"], capsys)
    assert code == 0
    step = json.loads(stdout[stdout.index("{"):])["step_time_s"]
    assert step == pytest.approx(table.iloc[0]["step_time_s"], rel=1e-9)


def test_cli_refuses_a_bad_all_to_all_overlap_fix(capsys) -> None:
    from test_cli import run_cli

    code, stdout, stderr = run_cli(["search", "frontier-moe", "--fix",
                                    "parallelism.moe_a2a_overlap=maybe"], capsys)
    assert code == 2, stdout + stderr
    assert "moe_a2a_overlap" in stderr and "true or false" in stderr
    assert "Traceback" not in stderr and len(stderr.strip().splitlines()) <= 3
