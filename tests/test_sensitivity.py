"""The range the unstated settings of a validation row give (llmsim.validation.sensitivity,
workloads/validation/sensitivity.yaml, benchmarks/sensitivity.py)."""

from __future__ import annotations

import math

import pytest
from helpers import load_script

from llmsim.errors import UserError
from llmsim.validation import load_runs, predict
from llmsim.validation.sensitivity import (
    Variation,
    combinations,
    load_variations,
    ranges,
    sensitivity,
    variations_for,
    with_values,
)

ROW = "NAR21-T2-06"


def test_every_varied_row_has_its_chosen_value_among_the_values() -> None:
    runs = load_runs()
    varied = [r for r in runs if variations_for(r)]
    assert len(load_variations()) >= 3 and len(varied) >= 20
    for run in varied:
        combos = combinations(run, variations_for(run))
        assert combos[0] == {k: run.value(k) for k in variations_for(run)}
        # Values may be mappings (a whole model.moe): compare the combinations by repr.
        assert len(combos) == len({repr(sorted(c.items(), key=str)) for c in combos})


def test_the_chosen_combination_is_the_validated_prediction() -> None:
    run = load_runs(ROW)[0]
    df = sensitivity(run)
    assert len(df) == math.prod(len(v.values) for v in variations_for(run).values())
    chosen = df[df.chosen]
    assert len(chosen) == 1
    assert chosen.error_pct.iloc[0] == pytest.approx(predict(run).error_pct, rel=1e-12)
    table = ranges([df]).iloc[0]
    assert table.low_error_pct <= table.chosen_error_pct <= table.high_error_pct
    assert table.low_error_pct < table.high_error_pct  # the settings move this row


def test_a_chosen_value_outside_the_values_is_refused() -> None:
    run = load_runs(ROW)[0]
    bad = {"parallelism.prefetch_weights": Variation("parallelism.prefetch_weights",
                                                      (True,), "test")}
    with pytest.raises(UserError, match="not among the values"):
        combinations(run, bad)


def test_with_values_replaces_and_drops_choices() -> None:
    run = load_runs(ROW)[0]
    changed = with_values(run, {"parallelism.prefetch_weights": True,
                                "parallelism.grad_all_reduce": None})
    assert changed.value("parallelism.prefetch_weights") is True
    assert "parallelism.grad_all_reduce" not in changed.choices
    assert run.value("parallelism.grad_all_reduce") is True  # the original is unchanged


def _script():
    return load_script("benchmarks/sensitivity.py", "sensitivity_script")


def test_script_prints_the_table_and_writes_every_combination(tmp_path, capsys) -> None:
    out = tmp_path / "combos.csv"
    assert _script().main([ROW, "--csv", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("| row |") and ROW in printed
    assert len(out.read_text().splitlines()) == 1 + 4


def test_script_refuses_an_unknown_or_unvaried_prefix(capsys) -> None:
    assert _script().main(["NO-SUCH-ROW"]) == 2
    assert _script().main(["ZB24-T4-01"]) == 2
    assert "error:" in capsys.readouterr().err
