"""Issue #35's list, item by item, where no other test asserted it (docs/audits/issue-35.md): the
space varies every dimension the issue names, fewer nodes say their idle devices, the
command line's defaults are the ones it asks for (and the library's), and a space with
no valid layout says so."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import yaml
from test_cli import run_cli
from test_search import TINY, TINY_FIX

import llmsim
from llmsim import cli_search
from llmsim.search import DEFAULT_HEADROOM, OBJECTIVES, search
from llmsim.search.space import SCHEDULES, SpaceOptions, cores, switch_variants


def _space(scenario: llmsim.specs.Scenario) -> list:
    return [v for c in cores(scenario, SpaceOptions(fixed={}))
            for v in switch_variants(c, {})]


def test_the_space_varies_every_dimension_the_issue_names() -> None:
    """tp, pp, dp, virtual stages, micro-batch, ZeRO stage, recompute, schedule, sequence
    parallelism, the overlap switches and the nodes used each take more than one value in
    the space of a 12-layer model on 4 nodes of 8 A100s (no option narrowing it)."""
    scenario = llmsim.load_scenario(TINY)
    layouts = _space(scenario)

    def values(name: str) -> set:
        return {getattr(x, name) for x in layouts}

    assert values("tp") >= {1, 2, 4, 8}
    assert values("pp") >= {1, 2, 3, 4, 6, 12}
    assert len(values("dp")) > 4
    assert max(values("virtual_stages")) > 1
    assert len(values("micro_batch")) > 2
    assert values("zero") == {0, 1, 2, 3}
    assert values("recompute") == {"none", "selective", "full"}
    assert values("schedule") == set(SCHEDULES)  # every synchronous schedule
    for switch in ("sequence_parallel", "overlap_tp_comm", "overlap_pp_comm",
                   "overlap_param_gather"):
        assert values(switch) == {False, True}, switch
    assert values("overlap_dp_comm") == {True}  # on; --fix shows it off (docs/search.md)
    assert values("nodes") == {1, 2, 3, 4}  # fewer nodes than the scenario's are layouts
    assert values("global_batch") == {TINY["training"]["global_batch"]}


def test_fewer_nodes_leave_their_devices_idle_in_the_table() -> None:
    """A priced layout on fewer nodes says how many of the machine's devices it leaves
    idle: the scenario's devices less its own."""
    table = search(llmsim.load_scenario(TINY), fix=["parallelism.tp=8", "parallelism.pp=2",
                                                    "parallelism.zero=1",
                                                    "parallelism.recompute=none",
                                                    "parallelism.micro_batch=1"],
                   top=0, workers=1, objective="step_time")
    assert set(table["nodes"]) == {2, 4}
    assert (table["devices"] + table["idle_devices"] == 32).all()
    assert (table["devices"] == table["tp"] * table["pp"] * table["dp"]).all()


def test_the_command_line_defaults_are_the_issue_s_and_the_library_s() -> None:
    """--objective days, --top 20, --memory-headroom 10 % of device memory: the same in
    ``llmsim search`` and ``llmsim.search``."""
    cli = inspect.signature(cli_search.search).parameters
    lib = inspect.signature(search).parameters
    assert cli["objective"].default == lib["objective"].default == "days"
    assert cli["top"].default == lib["top"].default == 20
    assert cli["memory_headroom"].default is None and lib["memory_headroom"].default is None
    assert DEFAULT_HEADROOM == 0.10
    assert set(OBJECTIVES) == {"days", "step_time", "mfu", "tokens_per_device"}


def test_a_space_with_no_valid_layout_says_so_and_not_that_none_fits(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """tp 3 divides neither the 16 heads nor the 4,096-wide MLP: every layout is invalid,
    none was checked for memory, and the advice is about --fix, not the headroom."""
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(TINY))
    code, stdout, stderr = run_cli(["search", str(path), "--workers", "1", "--top", "1",
                                    "--fix", "parallelism.tp=3",
                                    *(a for f in TINY_FIX for a in ("--fix", f))], capsys)
    assert code == 0, stdout + stderr
    text = " ".join(stdout.split())
    assert "0 layouts priced, 0 over 90 % of device memory" in text
    assert "no layout is valid" in text and "--fix" in text
    assert "no layout fits" not in text
