"""Issue #36, audited (docs/audits/issue-36.md): the scenario figures docs/cost-models.md
quotes for the topology it adds are today's runs, docs/validation.md's per-machine table
(written by hand) is today's on the non-NVIDIA machines, and the issue's Fugaku target
stands as an expected failure until every row is within 20 %.

The step times of "The path" (Frontier packed against scattered over its dragonfly,
Frontier's overlapped reduction beside the pipeline's sends, Fugaku's TP and DP sharing a
node's six TNIs) had been left behind by later physics (51.145 → 55.248 s and 48.3 → 50.1 s
for a 65.5 s scenario, 228.45 → 230.16 s for a 491.3 s one); each is now read from the
page and compared with a run, the contention switched off by having ``concurrent_axes``
answer no axis, as the page says it was measured."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from llmsim import loader
from llmsim import validation as v
from llmsim.costs.topology import dragonfly, fat_tree, torus
from llmsim.simulation import simulate

DOCS = Path(__file__).parents[1] / "docs"
PAGE = DOCS / "cost-models.md"
NON_NVIDIA = ("fugaku", "fugaku-cmg", "lumi", "aurora", "frontier")
"""The systems of issue #36's machines that have validation rows (ABCI has none)."""
ARROW = r"([\d.]+) → ([\d.]+) s"


def _step_s(name: str, sets: list[str]) -> float:
    return simulate(loader.load_scenario(name, sets)).step_time_s


def _quoted(pattern: str) -> tuple[float, float]:
    """The "before → after" pair the page states after ``pattern`` (whitespace collapsed)."""
    text = " ".join(PAGE.read_text().split())
    found = re.search(pattern + r"\s*" + ARROW, text)
    assert found, f"docs/cost-models.md no longer says {pattern!r}"
    return float(found.group(1)), float(found.group(2))


def _without_contention(monkeypatch: pytest.MonkeyPatch) -> None:
    for module in (dragonfly, fat_tree, torus):
        monkeypatch.setattr(module, "concurrent_axes", lambda parallelism, axis: ())


def test_frontier_scattered_over_its_groups_is_the_page_s_figure() -> None:
    packed, scattered = _quoted(r"Frontier's scenario scattered:")
    assert _step_s("frontier", []) == pytest.approx(packed, abs=1e-3)
    assert _step_s("frontier", ["system.network.job_placement=scattered"]) == pytest.approx(
        scattered, abs=1e-3)
    assert scattered > packed


def test_contention_between_axes_moves_the_seed_scenarios_as_the_page_says(
        monkeypatch: pytest.MonkeyPatch) -> None:
    frontier = _quoted(r"keeps 57 % of line rate \(step")
    fugaku = _quoted(r"pipeline's send, 9\):")
    shipped = (_step_s("frontier", []), _step_s("fugaku", []))
    _without_contention(monkeypatch)
    alone = (_step_s("frontier", []), _step_s("fugaku", []))
    assert alone[0] == pytest.approx(frontier[0], abs=1e-3)
    assert shipped[0] == pytest.approx(frontier[1], abs=1e-3)
    assert alone[1] == pytest.approx(fugaku[0], abs=1e-2)
    assert shipped[1] == pytest.approx(fugaku[1], abs=1e-2)
    assert alone[0] < shipped[0] and alone[1] < shipped[1]  # sharing never speeds a step


@pytest.fixture(scope="module")
def non_nvidia() -> pd.DataFrame:
    """Every validation row on the issue's machines, predicted now, with its system."""
    runs = [r for r in v.load_runs() if v.scenario_for(r).system.name in NON_NVIDIA]
    frame = v.validate(runs, progress=False)
    frame["system"] = [v.scenario_for(r).system.name for r in runs]
    return frame


def _machine_table() -> dict[str, list[str]]:
    text = (DOCS / "validation.md").read_text()
    table = text[text.index("| machine (system) |"):]
    table = table[:table.index("\n\n")]
    return {cells[0]: cells[1:] for line in table.splitlines()[2:]
            for cells in [[c.strip() for c in line.strip("|").split("|")]]}


@pytest.mark.parametrize("system", NON_NVIDIA)
def test_the_per_machine_table_is_today_s_on_the_issue_s_machines(
        system: str, non_nvidia: pd.DataFrame) -> None:
    stated = _machine_table()[system]
    part = non_nvidia[non_nvidia["system"] == system]
    err = part["error_pct"]
    worst = err.abs().idxmax()
    assert int(stated[1]) == len(part)
    assert int(stated[2]) == part["source"].nunique()
    for cell, value in zip(stated[3:6], (err.abs().mean(), err.abs().median(), err.mean()),
                           strict=True):
        assert float(cell) == pytest.approx(value, abs=0.051), (system, cell, value)
    assert stated[6] == part.loc[worst, "id"]
    assert float(stated[7]) == pytest.approx(err[worst], abs=0.051)


@pytest.mark.xfail(strict=True, reason="issue #36's target, not met: FUGAKU-DEV-4 -39.2, -10 "
                   "-20.4, -13 -24.9, -14 -50.0 % (docs/validation.md section 8, Fugaku)")
def test_every_fugaku_row_is_within_20_percent(non_nvidia: pd.DataFrame) -> None:
    rows = non_nvidia[non_nvidia["id"].str.startswith("FUGAKU-DEV-")]
    assert len(rows) == 14
    errors = rows.set_index("id")["error_pct"]
    assert (errors.abs() <= 20).all(), errors[errors.abs() > 20].round(1).to_dict()
