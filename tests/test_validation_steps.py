"""Every validation row's predicted step time, compared with a stored table.

``tests/data/validation_steps.csv`` holds, for every row of ``llmsim validate``, the step
time llmsim predicted when the table was last written, to 17 significant digits. Work
that must not change the physics (speed, structure) is checked against it to a relative
1e-9; a commit that does change the physics regenerates the table and says so:

    python tests/test_validation_steps.py        # rewrites tests/data/validation_steps.csv

Simulating every row takes about a minute on two cores, so by default the test runs the
rows marked ``ci``: for each engine path the rows take (schedule, ZeRO stage, overlap
switches, collectives holding compute units, when gradients are launched) and for each
source, the row whose simulation kept the fewest trace records (the cheapest to run; ties
go to the first row), so the subset is the same at every regeneration (seconds in all);
``LLMSIM_ALL_ROWS=1 python -m pytest tests/test_validation_steps.py`` runs all of them.
"""

from __future__ import annotations

import csv
import os
import sys
from pathlib import Path

import pytest

from llmsim import validation as v

TABLE = Path(__file__).parent / "data" / "validation_steps.csv"
RELATIVE_TOLERANCE = 1e-9
ALL_ROWS = os.environ.get("LLMSIM_ALL_ROWS", "") not in ("", "0")


def _stored() -> list[dict[str, str]]:
    with TABLE.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


STORED = _stored() if TABLE.exists() else []
RUNS = {r.id: r for r in v.load_runs()}


def test_the_table_holds_every_validation_row():
    assert [row["id"] for row in STORED] == list(RUNS)


@pytest.mark.parametrize(
    "row",
    [row for row in STORED if ALL_ROWS or row["ci"] == "1"],
    ids=lambda row: row["id"],
)
def test_step_time_is_the_stored_one(row):
    predicted = v.predict(RUNS[row["id"]]).result.step_time_s
    stored = float(row["step_time_s"])
    assert abs(predicted - stored) <= RELATIVE_TOLERANCE * abs(stored), (
        f"{row['id']}: step time {predicted!r} s, stored {stored!r} s; if the physics "
        "changed on purpose, regenerate the table (python tests/test_validation_steps.py) "
        "and say so in the commit"
    )


def _engine_path(run: v.Run) -> tuple:
    """What decides which parts of the engine a row exercises."""
    scenario = v.scenario_for(run)
    par = scenario.parallelism
    return (par.schedule, par.zero, par.overlap_dp_comm, par.overlap_pp_comm,
            par.overlap_tp_comm, scenario.system.node.collective_units > 0,
            par.grad_reduce_launch)


def write_table(path: Path = TABLE) -> None:
    """Simulate every validation row and store its step time (and the CI subset)."""
    rows = []
    for run in RUNS.values():
        result = v.predict(run).result
        rows.append({"id": run.id, "groups": (run.source, _engine_path(run)),
                     "step_time_s": repr(result.step_time_s),
                     "records": len(result.trace.records)})
        print(f"{run.id:<32} {result.step_time_s:.9g} s", file=sys.stderr)
    fastest: dict[object, dict] = {}
    for row in rows:  # a deterministic cost, unlike a wall time: the subset stays put
        for group in row["groups"]:
            if group not in fastest or row["records"] < fastest[group]["records"]:
                fastest[group] = row
    ci = {id(row) for row in fastest.values()}
    with path.open("w", newline="", encoding="utf-8") as f:
        out = csv.writer(f, lineterminator="\n")
        out.writerow(["id", "step_time_s", "ci"])
        for row in rows:
            out.writerow([row["id"], row["step_time_s"], int(id(row) in ci)])


if __name__ == "__main__":
    write_table()
