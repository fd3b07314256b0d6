"""Issue #36, audited (docs/audits/issue-36.md): the scenario figures docs/cost-models.md
quotes for the topology it adds are today's runs, and the issue's Fugaku target stands
as an expected failure until every row is within 20 %.

The step times of "The path" (Frontier packed against scattered over its dragonfly,
Frontier's overlapped reduction beside the pipeline's sends, Fugaku's TP and DP sharing a
node's six TNIs) had been left behind by later physics (51.145 → 55.248 s and 48.3 → 50.1 s
for a 65.5 s scenario, 228.45 → 230.16 s for a 491.3 s one); each is now read from the
page and compared with a run, the contention switched off by having ``concurrent_axes``
answer no axis, as the page says it was measured."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from llmsim import loader
from llmsim import validation as v
from llmsim.costs.topology import dragonfly, fat_tree, torus
from llmsim.simulation import simulate

PAGE = Path(__file__).parents[1] / "docs" / "cost-models.md"
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


@pytest.mark.xfail(strict=True, reason="issue #36's target, not met: FUGAKU-DEV-4 -39.2, -10 "
                   "-20.4, -13 -24.9, -14 -50.0 % (docs/validation.md section 8, Fugaku)")
def test_every_fugaku_row_is_within_20_percent() -> None:
    rows = [r for r in v.load_runs() if r.id.startswith("FUGAKU-DEV-")]
    assert len(rows) == 14
    errors = v.validate(rows, progress=False).set_index("id")["error_pct"]
    assert (errors.abs() <= 20).all(), errors[errors.abs() > 20].round(1).to_dict()
