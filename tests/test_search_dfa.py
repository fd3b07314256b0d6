"""The layout search on a DistFlashAttn scenario (DFA24-01): the base scenario's recompute
mode the search does not enumerate (``full_keep_attention``) kept as one more choice and
accepted by ``--fix``, and ``cp_schedule: distflash`` carried through at cp ≥ 2, dropped
where the search tries cp 1 and refused in a user's scenario at cp 1."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import get_args

import pytest
import yaml
from test_cli import run_cli

import llmsim
from llmsim.cli_search import RECOMPUTE_LABELS, describe
from llmsim.errors import UserError
from llmsim.search import search
from llmsim.search.fix import parse_fix
from llmsim.search.output import scenario_yaml
from llmsim.search.space import (
    RECOMPUTE,
    RECOMPUTE_VALUES,
    SpaceOptions,
    apply,
    cores,
    layout_of,
)
from llmsim.specs.parallelism import Parallelism
from llmsim.validation.runs import load_runs
from llmsim.validation.scenarios import scenario_for

FIX = {"zero": 3, "micro_batch": 1, "sequence_parallel": False}
"""DFA24-01's ZeRO stage, micro-batch and no sequence parallelism: a small space (tp·pp·cp
= 8, the global batch of one sequence leaves dp 1)."""


@pytest.fixture(scope="module")
def dfa() -> llmsim.specs.Scenario:
    run = next(r for r in load_runs() if r.id == "DFA24-01")
    scenario = scenario_for(run)
    par = scenario.parallelism
    assert (par.recompute, par.cp_schedule, par.cp) == ("full_keep_attention", "distflash", 8)
    return scenario


@pytest.fixture
def path(dfa, tmp_path: Path) -> Path:
    """DFA24-01 as a scenario file, for the CLI."""
    out = tmp_path / "dfa.yaml"
    out.write_text(scenario_yaml(dfa))
    return out


def test_the_base_scenario_s_recompute_mode_is_one_more_choice(dfa) -> None:
    layouts = list(cores(dfa, SpaceOptions(fixed=FIX, max_cp=8)))
    assert {x.recompute for x in layouts} == {*RECOMPUTE, "full_keep_attention"}
    assert {x.cp for x in layouts} == {1, 2, 4, 8}
    # a scenario whose mode the search enumerates gets the three, nothing more
    plain = dfa.model_copy(update={"parallelism": dfa.parallelism.model_copy(
        update={"recompute": "full"})})
    assert {x.recompute for x in cores(plain, SpaceOptions(fixed=FIX, max_cp=8))} \
        == set(RECOMPUTE)


def test_cp_schedule_is_kept_at_cp_two_or_more_and_dropped_at_cp_one(dfa) -> None:
    own = layout_of(dfa)
    for cp, expected in ((8, "distflash"), (2, "distflash"), (1, "te_ring")):
        layout = replace(own, cp=cp, tp=8 // cp)
        scenario = apply(dfa, layout)
        assert scenario.parallelism.cp == cp
        assert scenario.parallelism.cp_schedule == expected
        assert scenario.parallelism.recompute == "full_keep_attention"


def test_a_user_s_scenario_with_distflash_at_cp_one_is_refused_in_one_sentence(
        path: Path, capsys) -> None:
    code, _, err = run_cli(["run", str(path), "--set", "parallelism.cp=1",
                            "--set", "parallelism.dp=8"], capsys)
    assert code == 2 and "Traceback" not in err
    assert "parallelism.cp_schedule: distflash schedules context-parallel attention, and " \
        "cp is 1" in " ".join(err.split())


def test_a_tiny_search_keeps_full_keep_attention_and_distflash(dfa) -> None:
    table = search(dfa, objective="step_time", fix={**FIX, "recompute": "full_keep_attention"},
                   max_cp=8, max_layouts=3, top=1, workers=1)
    assert len(table) and set(table["recompute"]) == {"full_keep_attention"}
    best = table.iloc[0]
    par = table.attrs["best"].parallelism  # the best layout's scenario
    assert (par.recompute, par.cp) == ("full_keep_attention", best["cp"])
    assert par.cp_schedule == ("distflash" if par.cp > 1 else "te_ring")
    # the estimator against the engine on the best layout (docs/search.md: within 5 %)
    assert best["est_over_engine"] == pytest.approx(1.0, abs=0.05)
    assert "rc-full-keep-attn" in describe(best)


def test_fix_accepts_every_recompute_mode_the_spec_accepts() -> None:
    spec_modes = get_args(Parallelism.model_fields["recompute"].annotation)
    assert set(RECOMPUTE_VALUES) == set(spec_modes)
    for mode in spec_modes:
        assert parse_fix([f"parallelism.recompute={mode}"]) == {"recompute": mode}
    assert set(RECOMPUTE_LABELS) == set(spec_modes)  # describe() names each one
    with pytest.raises(UserError, match="must be one of none, selective, full, "
                       "full_keep_attention"):
        parse_fix(["recompute=keep_attention"])


def test_the_cli_searches_with_the_mode_fixed_and_writes_a_best_yaml_that_keeps_both(
        path: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    code, stdout, stderr = run_cli(
        ["search", str(path), "--fix", "parallelism.recompute=full_keep_attention",
         "--fix", "parallelism.cp=8", "--fix", "parallelism.zero=3", "--max-cp", "8",
         "--max-layouts", "2", "--top", "1", "--workers", "1", "--objective", "step_time",
         "--out", str(out)], capsys)
    assert code == 0, stdout + stderr
    assert "rc-full-keep-attn" in stdout
    best = yaml.safe_load((out / "best.yaml").read_text())["parallelism"]
    assert (best["recompute"], best["cp_schedule"], best["cp"]) == (
        "full_keep_attention", "distflash", 8)


@pytest.mark.parametrize("fix, message", [
    ("parallelism.recompute=keep", "--fix: recompute='keep' must be one of none, selective, "
     "full, full_keep_attention"),
    ("parallelism.cp_schedule=distflash", "--fix: 'parallelism.cp_schedule=distflash' is not "
     "FIELD=VALUE with FIELD one of"),
])
def test_bad_fix_values_are_one_line_errors(path: Path, capsys, fix: str,
                                            message: str) -> None:
    code, stdout, stderr = run_cli(["search", str(path), "--objective", "step_time",
                                    "--fix", fix], capsys)
    assert code == 2, stdout + stderr
    assert message in " ".join(stderr.split())
    assert "Traceback" not in stderr and len(stderr.strip().splitlines()) <= 3
