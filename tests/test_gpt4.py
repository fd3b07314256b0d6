"""The days-to-GPT-4 table: the source's method in closed form, device units, the CLI end
to end on one machine, and bad options as one line with exit code 2."""

from __future__ import annotations

import csv

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_cli import run_cli

from llmsim import gpt4, gpt4_sources, loader
from llmsim.errors import UserError
from llmsim.simulation import simulate


def test_source_method_reproduces_the_source_arithmetic():
    """brief.md: OpenAI's 25,000 A100 at BF16 312 TFLOP/s = 7.8 EFLOP/s need 45 days at
    peak for 3e25 FLOPs, "×2" → 89 days (the source's table: 90)."""
    peak = gpt4_sources.part_peak_flops(gpt4_sources.SOURCE_TABLE[0].parts[0])
    assert peak == pytest.approx(312e12 * 25_000)
    assert gpt4.source_method_days(3e25, peak, 1.0) == pytest.approx(3e25 / 7.8e18 / 86_400)
    assert gpt4.source_method_days(3e25, peak, 2.0) == pytest.approx(89.03, abs=0.01)


def test_source_method_counts_packages_in_llmsim_devices():
    """An MI250X package is two GCDs, a Ponte Vecchio GPU two stacks; ABCI adds its V100s."""
    rows = {r.system: r for r in gpt4_sources.SOURCE_TABLE}
    gcd = loader.load_spec("systems", "frontier").node.accelerator.peak_flops("bf16")
    frontier = gpt4_sources.part_peak_flops(rows["frontier"].parts[0])
    assert frontier == pytest.approx(2 * 37_888 * gcd)
    a100, v100 = rows["abci"].parts
    assert gpt4_sources.part_peak_flops(a100) + gpt4_sources.part_peak_flops(v100) == pytest.approx(
        960 * 312e12 + 4_352 * 125e12)
    fp32 = loader.load_spec("systems", "fugaku").node.accelerator.peak_flops("fp32")
    assert gpt4_sources.part_peak_flops(rows["fugaku"].parts[0]) == pytest.approx(158_976 * fp32)


@pytest.mark.parametrize(("system", "nodes", "source_devices"), [
    ("openai", 3_125, 25_000),    # 25,000 A100 = 3,125 nodes of 8, the whole machine
    ("frontier", 9_408, 75_776),  # 37,888 packages = 75,776 GCDs > 9,408 nodes × 8
    ("lumi", 2_978, 40_960),      # 20,480 packages = 40,960 GCDs > 2,978 nodes × 8
    ("aurora", 10_624, 127_488),  # 63,744 GPUs = 127,488 stacks = 10,624 nodes × 12
    ("fugaku", 158_976, 158_976),
])  # abci: its placements on the node groups are searched (test_cli_end_to_end...)
def test_search_base_is_the_sources_count_or_the_whole_machine(system, nodes, source_devices):
    row = next(r for r in gpt4_sources.SOURCE_TABLE if r.system == system)
    catalog, base, devices = gpt4.whole_machine(row)
    assert base.nodes_used == nodes
    assert devices == source_devices
    assert base.devices == min(source_devices, catalog.system.nodes
                               * catalog.system.node.devices_per_node)
    assert base.training.flops == 3e25 and base.model.name == "gpt4-proxy-dense"


OPENAI = gpt4.whole_machine(gpt4_sources.SOURCE_TABLE[0])[1]


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 3_125), st.integers(1, 3_125))
def test_largest_nodes_is_at_most_the_machine_and_grows_with_it(a, b):
    small, large = sorted((a, b))
    fill = [gpt4.largest_nodes(OPENAI.model_copy(update={"nodes": n}), None)
            for n in (small, large)]
    assert 0 <= fill[0] <= fill[1] <= large and fill[0] <= small


def test_why_line_states_the_sources_implied_efficiency():
    """OpenAI: 90 days against 44.5 at peak = 49 % of peak (3e25 / (7.8e18 × 90 days))."""
    row = gpt4_sources.SOURCE_TABLE[0]
    result = gpt4.SystemResult(row, 25_000, 25_000, 7.8e18, gpt4.source_method_days(
        3e25, 7.8e18, 2.0), None, {}, False, "", 0, 0, 0.0)
    assert "mean 49 % of BF16 peak" in result.why()


def test_why_line_says_when_the_source_s_count_exceeds_the_machine():
    """LUMI: the source's 40,960 GCDs are more than the machine's 23,824; the row is
    searched on the whole machine and its line says so (issue #35)."""
    row = next(r for r in gpt4_sources.SOURCE_TABLE if r.system == "lumi")
    result = gpt4.SystemResult(row, 40_960, 23_824, 7.84e18, 89.0, None, {}, False, "", 0,
                               0, 0.0)
    assert "the source's 40,960 devices exceed the machine's 23,824" in result.why()
    fits = gpt4.SystemResult(row, 23_824, 23_824, 7.84e18, 89.0, None, {}, False, "", 0, 0,
                             0.0)
    assert "exceed" not in fits.why()


def test_select_names_and_order():
    assert [r.system for r in gpt4.select("fugaku, openai")] == ["openai", "fugaku"]
    with pytest.raises(UserError, match="--systems"):
        gpt4.select("openai,summit")


def test_cli_end_to_end_on_one_machine(tmp_path, capsys):
    out = tmp_path / "out"
    code, stdout, err = run_cli(["gpt4", "--systems", "abci", "--max-layouts", "3", "--top",
                                 "1", "--workers", "1", "--confirm-timeout", "10",
                                 "--out", str(out)], capsys)
    assert code == 0, err
    assert "abci" in stdout and "llmsim days" in stdout and "heterogeneous" in stdout
    rows = list(csv.DictReader((out / "gpt4.csv").open()))
    assert [r["system"] for r in rows] == ["abci"]
    row = rows[0]
    assert float(row["source_days"]) == 770
    assert float(row["days_over_source"]) == pytest.approx(float(row["days"]) / 770)
    assert int(row["devices"]) + int(row["idle_devices"]) == 960 + 4_352  # the whole job
    # the catalog's placement is run too: a sampled placement search never makes it worse
    catalog = loader.load_scenario("abci")
    assert float(row["days"]) <= simulate(catalog).days_to_train * (1 + 1e-12)
    assert (row["catalog_layout_won"] == "True") == (row["layout"] == gpt4.compact_of(catalog))
    assert 0 < float(row["mfu"]) < 1 and 0 < float(row["memory_gb"]) <= 40
    # the whole run (llmsim.calendar): failures and checkpoints only add days
    assert float(row["days"]) <= float(row["calendar_days_p10"]) \
        <= float(row["calendar_days_p90"])
    assert float(row["days"]) <= float(row["calendar_days"]) <= float(row["calendar_days_p90"])
    assert 0 < float(row["goodput"]) <= 1 and float(row["run_mwh"]) > 0
    assert "calendar days (10–90 %)" in stdout and "MWh" in stdout
    assert (out / "gpt4.png").stat().st_size > 0
    best = loader.load_scenario(out / "abci-best.yaml")  # runs with `llmsim run` as is
    assert best.devices == int(row["devices"])
    assert gpt4.compact_of(best) in row["layout"]


def test_best_yaml_of_a_searched_placement_runs_as_is(tmp_path):
    """A heterogeneous row's best scenario carries the searched placement (41 stages), not
    the catalog's (83), with its layout and headroom."""
    from llmsim.cli_gpt4 import best_yaml
    from llmsim.search.placement_search import GroupLayout, apply_placement

    catalog = loader.load_scenario("abci")
    layout = GroupLayout("stages", 4, 41, 32, 2, "full", (("v100", 34), ("a100", 7)))
    best = apply_placement(catalog, layout, memory_headroom=0.2)
    row = gpt4_sources.select("abci")[0]
    result = gpt4.SystemResult(row, 5_312, 5_312, 1.0, 1.0, best, {}, False, "", 1, 0, 0.0)
    path = tmp_path / "abci-best.yaml"
    path.write_text(best_yaml(result), encoding="utf-8")
    again = loader.load_scenario(path)
    assert again.placement == best.placement and again.placement.memory_headroom == 0.2
    assert gpt4.compact_of(again) == gpt4.compact_of(best) and again.devices == 5_248


@pytest.mark.parametrize(("args", "needle"), [
    (["--systems", "summit"], "--systems"),
    (["--max-layouts", "0"], "--max-layouts"),
    (["--top", "0"], "--top"),
    (["--workers", "0"], "--workers"),
    (["--confirm-timeout", "0"], "--confirm-timeout"),
])
def test_bad_options_are_one_line_and_exit_2(args, needle, capsys):
    code, stdout, err = run_cli(["gpt4", *args], capsys)
    assert code == 2
    assert needle in err and len(err.strip().splitlines()) == 1
    assert "Traceback" not in err and not stdout
