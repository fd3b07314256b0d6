"""A step's result to the calendar, and ``llmsim run`` reporting it end to end."""

from __future__ import annotations

import json

import pytest
from helpers import make_scenario
from test_cli import run_cli, tiny_file

from llmsim import simulate
from llmsim.calendar import summarize

QUIET = {"system.reliability.device_fit": 0, "system.reliability.node_fit": 0,
         "system.reliability.link_fit": 0}


def test_without_failures_calendar_days_are_todays_days_to_train():
    result = simulate(make_scenario(**{k.replace(".", "__"): v for k, v in QUIET.items()}))
    cal = summarize(result)
    assert cal.calendar_days == result.days_to_train
    assert cal.days_p10 == cal.days_median == cal.days_p90 == result.days_to_train
    assert cal.goodput == 1 and cal.plan.checkpoints() == 0


def test_goodput_falls_as_the_job_grows_at_fixed_per_device_rates():
    goodputs = []
    for nodes in (1, 2, 4, 8):
        s = make_scenario(nodes=nodes, training__global_batch=64, **{
            "system__reliability__device_fit": 2e6, "system__reliability__node_fit": 0,
            "system__reliability__link_fit": 0})
        goodputs.append(summarize(simulate(s)).goodput)
    assert goodputs == sorted(goodputs, reverse=True) and goodputs[-1] < goodputs[0]


def test_the_scenario_seed_drives_the_monte_carlo():
    high = {"system__reliability__device_fit": 5e6, "training__tokens": 1e11}
    a = summarize(simulate(make_scenario(seed=1, **high)))
    b = summarize(simulate(make_scenario(seed=1, **high)))
    c = summarize(simulate(make_scenario(seed=2, **high)))
    assert (a.days_p10, a.days_median, a.days_p90) == (b.days_p10, b.days_median, b.days_p90)
    assert a.days_median != c.days_median
    assert a.days_p10 < c.days_median < a.days_p90
    assert a.days_p10 < a.calendar_days < a.days_p90


def test_user_interval_and_async_checkpoints_are_used():
    s = make_scenario(calendar__checkpoint_interval_s=3600, calendar__async_checkpoint=True,
                      training__tokens=1e11)
    cal = summarize(simulate(s))
    assert cal.plan.interval_s == 3600
    assert cal.plan.checkpoint_s == cal.checkpoint.snapshot_s
    assert cal.plan.write_s == cal.checkpoint.write_s


def test_no_run_size_no_calendar():
    s = make_scenario(training__tokens=None)
    assert summarize(simulate(s)) is None


def test_run_json_has_the_calendar(tmp_path, capsys):
    code, out, _ = run_cli(["run", str(tiny_file(tmp_path)), "--json"], capsys)
    assert code == 0
    cal = json.loads(out)["calendar"]
    assert cal["calendar_days"] >= cal["days_to_train"] > 0
    assert cal["calendar_days_p10"] <= cal["calendar_days_median"] <= cal["calendar_days_p90"]
    assert 0 < cal["goodput"] <= 1
    assert {"size_bytes", "write_s", "interval_s", "restart_s"} <= set(cal["checkpoint"])
    assert cal["energy"]["run_mwh"] > 0


def test_run_reports_the_whole_run(tmp_path, capsys):
    code, out, _ = run_cli(["run", str(tiny_file(tmp_path))], capsys)
    assert code == 0
    for text in ("calendar days", "goodput", "checkpoint plan", "energy of the run"):
        assert text in out


@pytest.mark.parametrize(("key", "value", "field"), [
    ("calendar.checkpoint_interval_s", "-5", "calendar.checkpoint_interval_s"),
    ("calendar.checkpoint_interval_s", "often", "calendar.checkpoint_interval_s"),
    ("system.reliability.device_fit", "-1", "system.reliability.device_fit"),
    ("system.facility.pue", "0.5", "system.facility.pue"),
    ("calendar.monte_carlo_runs", "0", "calendar.monte_carlo_runs"),
])
def test_bad_calendar_input_is_one_sentence_and_exit_2(tmp_path, capsys, key, value, field):
    code, _, err = run_cli(["run", str(tiny_file(tmp_path)), "--set", f"{key}={value}"],
                           capsys)
    assert code == 2
    assert field in err and "Traceback" not in err


def test_table_columns_are_the_summary_or_none_without_a_run_size():
    from llmsim.calendar.summary import TABLE_COLUMNS, table_columns

    result = simulate(make_scenario(seed=3, system__reliability__device_fit=5e6))
    cal = summarize(result)
    cols = table_columns(result)
    assert tuple(cols) == TABLE_COLUMNS
    assert cols["calendar_days"] == cal.calendar_days and cols["goodput"] == cal.goodput
    assert (cols["calendar_days_p10"], cols["calendar_days_p90"]) == (cal.days_p10,
                                                                      cal.days_p90)
    assert cols["run_mwh"] == cal.energy.mwh
    no_size = simulate(make_scenario(training__tokens=None))
    assert table_columns(no_size) == dict.fromkeys(TABLE_COLUMNS)
