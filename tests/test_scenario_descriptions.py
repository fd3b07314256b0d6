"""Each seed scenario's description says what limits it (issue #36) with the shares of the
busiest stage's step that ``llmsim run`` prints under "Where the time goes": those figures
are read from the description and checked against a run of the scenario now, so a change
of the physics that moves a share by more than a point fails here until the sentence is
rewritten from a new run (``llmsim run <name>``)."""

from __future__ import annotations

import re

import pytest

from llmsim import catalog, load_scenario
from llmsim.simulation import simulate

SHARE_POINTS = 1.0
"""How far, in percentage points, a stated share may be from the run's: the descriptions
round to whole per cent (0.5), plus half a point so that a small change does not force a
rewording."""

NUMBER = r"(\d+(?:\.\d+)?)"

CLAIMS: dict[str, list[tuple[str, str]]] = {
    "abci": [(rf"compute is {NUMBER} % of such a stage's step", "compute"),
             (rf"pipeline fill of 83 stages \({NUMBER} %\)", "bubble"),
             (rf"TP \({NUMBER} %\)", "tp_comm"), (rf"PP \({NUMBER} %,", "pp_comm")],
    "aurora": [(rf"TP over twelve tiles \({NUMBER} %", "tp_comm"),
               (rf"compute \({NUMBER} %\)", "compute"), (rf"the bubble \({NUMBER} %\)", "bubble")],
    "deepseek-v3": [(rf"compute \({NUMBER} %", "compute"),
                    (rf"leave exposed \({NUMBER} %\)", "ep_all_to_all"),
                    (rf"the bubble \({NUMBER} %\)", "bubble")],
    "el-capitan": [(rf"compute \({NUMBER} %", "compute"), (rf"DP \({NUMBER} %", "dp_comm"),
                   (rf"the bubble \({NUMBER} %\)", "bubble"), (rf"TP \({NUMBER} %\)", "tp_comm")],
    "frontier": [(rf"compute \({NUMBER} %", "compute"), (rf"the bubble \({NUMBER} %\)", "bubble"),
                 (rf"DP \({NUMBER} %\)", "dp_comm"), (rf"links \({NUMBER} %\)", "tp_comm"),
                 (rf"exposed PP {NUMBER} %", "pp_comm")],
    "frontier-moe": [(rf"compute \({NUMBER} %", "compute"),
                     (rf"the bubble \({NUMBER} %\)", "bubble"),
                     (rf"links \({NUMBER} %\)", "tp_comm"),
                     (rf"EP all-to-all \({NUMBER} %\)", "ep_all_to_all")],
    "lumi": [(rf"compute \({NUMBER} %", "compute"), (rf"links \({NUMBER} %\)", "tp_comm"),
             (rf"the bubble \({NUMBER} %\)", "bubble")],
    "mdx": [(rf"compute \({NUMBER} %", "compute"), (rf"TP \({NUMBER} %\)", "tp_comm")],
    "openai-a100": [(rf"compute \({NUMBER} %", "compute"),
                    (rf"the bubble \({NUMBER} %\)", "bubble"), (rf"TP \({NUMBER} %\)", "tp_comm"),
                    (rf"DP \({NUMBER} %\)", "dp_comm")],
    "openai-a100-moe": [(rf"compute \({NUMBER} %", "compute"),
                        (rf"the bubble \({NUMBER} %\)", "bubble"),
                        (rf"TP \({NUMBER} %\)", "tp_comm"),
                        (rf"EP all-to-all \({NUMBER} %\)", "ep_all_to_all")],
    "selene-gpt3": [(rf"compute \({NUMBER} %", "compute"), (rf"TP \({NUMBER} %\)", "tp_comm"),
                    (rf"the bubble \({NUMBER} %\)", "bubble"), (rf"DP \({NUMBER} %\)", "dp_comm")],
}
"""Per scenario, each stated share: a pattern of its description (after "What limits it")
whose one group is the share in per cent, and the part of ``Result.breakdown_s`` it
states. Fugaku states no shares (its figures are checked below)."""


def limits_text(name: str) -> str:
    """The description from "What limits it" on, its whitespace collapsed."""
    text = " ".join(load_scenario(name).description.split())
    assert "What limits it" in text, f"{name}: its description does not say what limits it"
    return text[text.index("What limits it"):]


def stated(text: str, pattern: str) -> float:
    """The one figure ``pattern`` finds in ``text``."""
    found = re.findall(pattern, text)
    assert len(found) == 1, f"{pattern!r} found {len(found)} times in: {text}"
    return float(found[0])


def test_every_seed_scenario_is_checked() -> None:
    assert set(CLAIMS) | {"fugaku"} == set(catalog.names("scenarios"))
    for name in catalog.names("scenarios"):
        limits_text(name)


@pytest.mark.parametrize("name", sorted(CLAIMS))
def test_the_stated_shares_are_today_s(name: str) -> None:
    text = limits_text(name)
    result = simulate(load_scenario(name))
    for pattern, part in CLAIMS[name]:
        share = 100 * result.breakdown_s[part] / result.step_time_s
        assert stated(text, pattern) == pytest.approx(share, abs=SHARE_POINTS), (name, part)
    if name == "deepseek-v3":  # "DP and PP are 1 % or less each"
        most = stated(text, rf"DP and PP are {NUMBER} % or less each")
        for part in ("dp_comm", "pp_comm"):
            assert 100 * result.breakdown_s[part] / result.step_time_s <= most + 0.5


def test_fugaku_s_figures_are_today_s() -> None:
    """The step, MFU and days at the production run's 2.2 GHz and at the 2.0 GHz command
    the description gives, the exposed TP of the catalog layout against the TP-16 layout
    it gives as a command, and the step with glibc's allocator: all as stated, to 2 %."""
    scenario = load_scenario("fugaku")
    assert scenario.system.node.accelerator.name == "a64fx-boost"  # its system_set
    text = " ".join(scenario.description.split())
    result = simulate(scenario)
    clocks = re.search(r"([\d.]+) s a step, ([\d.]+) % MFU of the [\d.]+ TFLOP/s FP32 peak, "
                       r"([\d,]+) days\. At the validation rows' 2\.0 GHz, `([^`]*)`, it is "
                       r"([\d.]+) s a step and ([\d,]+) days", text)
    assert clocks is not None
    step_s, mfu, days, slow_step_s, slow_days = (
        float(clocks.group(i).replace(",", "")) for i in (1, 2, 3, 5, 6))
    assert step_s == pytest.approx(result.step_time_s, rel=0.02)
    assert mfu == pytest.approx(100 * result.mfu, abs=SHARE_POINTS)
    assert days == pytest.approx(result.days_to_train, rel=0.02)
    at_2_ghz = load_scenario("fugaku", overrides=re.findall(r"--set (\S+)", clocks.group(4)))
    assert at_2_ghz.system.node.accelerator.name == "a64fx"  # the override wins
    slow = simulate(at_2_ghz)
    assert slow_step_s == pytest.approx(slow.step_time_s, rel=0.02)
    assert slow_days == pytest.approx(slow.days_to_train, rel=0.02)
    match = re.search(r"exposes about (\d+)x more: (\d+) s against (\d+) s a step, with `([^`]*)`",
                      text)
    assert match is not None
    ratio, wide_s, unit_s = (float(match.group(i)) for i in (1, 2, 3))
    overrides = re.findall(r"--set (\S+)", match.group(4))
    unit_tp_s = result.breakdown_s["tp_comm"]
    wide_tp_s = simulate(load_scenario("fugaku", overrides=overrides)).breakdown_s["tp_comm"]
    assert unit_s == pytest.approx(unit_tp_s, abs=0.5)
    assert wide_s == pytest.approx(wide_tp_s, rel=0.02)
    assert ratio == pytest.approx(wide_tp_s / unit_tp_s, abs=1.0)
    glibc_s = stated(text, rf"with glibc: {NUMBER} s a step")
    glibc = simulate(load_scenario("fugaku", overrides=["training.allocator=glibc"]))
    assert glibc_s == pytest.approx(glibc.step_time_s, rel=0.02)
