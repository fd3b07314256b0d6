"""A scenario's ``system_set`` (llmsim.loader.apply_system_set): a catalog system run with a
documented change. It equals the same ``--set system.<field>=<value>`` on the command
line, the command line's own ``--set`` wins over it, bad input is one sentence naming the
field with exit code 2, and what writes a scenario back out (``llmsim search --out``'s
best.yaml, ``llmsim gpt4``'s best scenario) runs as is to the same result."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from test_cli import run_cli

from llmsim import gpt4, gpt4_sources, loader
from llmsim.errors import UserError
from llmsim.simulation import simulate

ROOT = Path(__file__).parents[1]

TINY = {  # 2 nodes of Selene with the A100 40 GB in place of its 80 GB one
    "name": "tiny-system-set",
    "system": "selene",
    "system_set": {"node.accelerator": "a100-sxm4-40gb"},
    "nodes": 2,
    "model": {"name": "small-gpt", "layers": 4, "hidden": 512, "heads": 8,
              "ffn_hidden": 2048, "vocab": 32000, "max_seq_len": 1024},
    "parallelism": {"tp": 2, "pp": 2, "dp": "auto", "micro_batch": 1},
    "training": {"global_batch": 16, "seq_len": 1024, "precision": "bf16", "tokens": 1e9},
}


def _without_system_set(raw: dict) -> dict:
    return {k: v for k, v in raw.items() if k != "system_set"}


def test_fugaku_yaml_is_its_catalog_system_with_the_boost_device() -> None:
    """The seed scenario equals its file without system_set plus the same --set."""
    raw = loader.read_yaml(ROOT / "workloads/scenarios/fugaku.yaml")
    assert raw["system"] == "fugaku" and raw["system_set"] == {"node.accelerator": "a64fx-boost"}
    scenario = loader.load_scenario("fugaku")
    by_cli = loader.load_scenario(_without_system_set(raw),
                                  ["system.node.accelerator=a64fx-boost"])
    assert scenario.system == by_cli.system
    assert scenario.system.node.accelerator == loader.load_spec("accelerators", "a64fx-boost")
    assert scenario.system.nodes == loader.load_spec("systems", "fugaku").nodes
    assert loader.load_spec("scenarios", "fugaku") == scenario  # the API's catalog read too
    # its JSON dump (search.json's manifest, sweep --set's source) has the system in full
    dumped = scenario.model_dump(mode="json")
    assert "system_set" not in dumped and loader.load_scenario(dumped) == scenario


@settings(max_examples=25, deadline=None)
@given(nodes=st.integers(2, 280), efficiency=st.floats(0.05, 1.0),
       accelerator=st.sampled_from(["a100-sxm4-40gb", "a100-sxm4-80gb", "h100-sxm5-80gb"]))
def test_system_set_is_the_command_line_s_set(nodes: int, efficiency: float,
                                               accelerator: str) -> None:
    changes = {"nodes": nodes, "network.efficiency": efficiency,
               "node.accelerator": accelerator}
    given_in_file = loader.load_scenario(TINY | {"system_set": changes})
    by_cli = loader.load_scenario(_without_system_set(TINY),
                                  {f"system.{k}": v for k, v in changes.items()})
    assert given_in_file == by_cli
    assert given_in_file.system.nodes == nodes
    assert given_in_file.system.node.accelerator.name == accelerator


def test_the_command_line_s_set_wins() -> None:
    at_2_ghz = loader.load_scenario("fugaku", ["system.node.accelerator=a64fx"])
    assert at_2_ghz.system == loader.load_spec("systems", "fugaku")
    # a later --set edits the device system_set chose
    less_hbm = loader.load_scenario("fugaku", ["system.node.accelerator.hbm_gb=16"])
    assert less_hbm.system.node.accelerator.name == "a64fx-boost"
    assert less_hbm.system.node.accelerator.hbm_gb == 16
    # and it prices what it says: the 1.1x clock shortens the step, not by more than 1.1x
    boost = simulate(loader.load_scenario(TINY | {"system": "fugaku", "system_set": {
        "node.accelerator": "a64fx-boost"}, "nodes": 4, "training": TINY["training"] | {
            "precision": "fp32"}}))
    normal = simulate(loader.load_scenario(TINY | {"system": "fugaku", "system_set": {
        "node.accelerator": "a64fx-boost"}, "nodes": 4, "training": TINY["training"] | {
            "precision": "fp32"}}, ["system.node.accelerator=a64fx"]))
    assert normal.step_time_s / 1.1 * (1 - 1e-9) <= boost.step_time_s < normal.step_time_s


@pytest.mark.parametrize(("system_set", "message"), [
    ({"node.acelerator": "a64fx-boost"},
     "x.yaml: system_set: unknown field 'node.acelerator'; remove it (did you mean "
     "'accelerator'?)"),
    ({"nodes": "many"},
     "x.yaml: system_set: nodes = 'many' is invalid (input should be a valid integer, unable "
     "to parse string as an integer); correct the value"),
    ({"nodes.x": 1},
     "x.yaml: system_set nodes.x: nodes is 560, not a mapping; set nodes itself instead"),
    ({"node.accelerator": "a100-sxm9"},
     "system.node.accelerator: unknown accelerator 'a100-sxm9'; did you mean"),
    (["node.accelerator=a100-sxm4-40gb"],
     "x.yaml: system_set = ['node.accelerator=a100-sxm4-40gb'] is not a mapping of system "
     "fields to values; write it as e.g. system_set: {node.accelerator: a64fx-boost}, or "
     "remove it"),
    ({}, "x.yaml: system_set = {} changes nothing"),
    ({"node..accelerator": "a64fx"}, "x.yaml: system_set key 'node..accelerator' is not a "
                                     "dotted field of the system"),
    ({1: 2}, "x.yaml: system_set key 1 is not a dotted field of the system"),
])
def test_bad_system_set_is_one_sentence_and_exit_2(tmp_path, capsys, system_set,
                                                    message) -> None:
    path = tmp_path / "x.yaml"
    path.write_text(yaml.safe_dump(TINY | {"system_set": system_set}), encoding="utf-8")
    code, out, err = run_cli(["run", str(path)], capsys)
    assert code == 2
    assert "Traceback" not in out + err and len(err.strip().splitlines()) == 1
    assert message in err
    with pytest.raises(UserError):
        loader.load_scenario(path)


def test_a_system_set_without_a_system_and_one_on_the_command_line_are_refused(
        tmp_path, capsys) -> None:
    path = tmp_path / "x.yaml"
    path.write_text(yaml.safe_dump({k: v for k, v in TINY.items() if k != "system"}),
                    encoding="utf-8")
    code, _, err = run_cli(["run", str(path)], capsys)
    assert code == 2 and "x.yaml: system_set needs a system to change" in err
    code, _, err = run_cli(["run", "fugaku", "--set", "system_set.nodes=2"], capsys)
    assert code == 2 and "--set system_set.nodes: system_set is read before the overrides" in err


def test_search_best_yaml_runs_as_is_to_the_same_result(tmp_path, capsys) -> None:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(TINY), encoding="utf-8")
    out = tmp_path / "out"
    code, _, err = run_cli(["search", str(path), "--top", "2", "--workers", "1",
                            "--fix", "parallelism.tp=2", "--fix", "parallelism.pp=2",
                            "--fix", "parallelism.zero=1", "--out", str(out)], capsys)
    assert code == 0, err
    written = loader.read_yaml(out / "best.yaml")
    assert "system_set" not in written  # the system as run, in full
    assert written["system"]["node"]["accelerator"]["name"] == "a100-sxm4-40gb"
    code, stdout, err = run_cli(["run", str(out / "best.yaml"), "--json"], capsys)
    assert code == 0, err
    import pandas as pd

    best = pd.read_csv(out / "layouts.csv").iloc[0]
    assert json.loads(stdout)["step_time_s"] == pytest.approx(best["step_time_s"], rel=1e-9)


def test_gpt4_best_yaml_keeps_system_set_and_runs_as_is(tmp_path, capsys) -> None:
    """``llmsim gpt4 --out``'s fugaku-best.yaml is the catalog file with the layout
    replaced: its system_set stays, and it runs to the result of the scenario it wrote."""
    from llmsim.cli_gpt4 import best_yaml

    best = loader.load_scenario("fugaku")
    row = gpt4_sources.select("fugaku")[0]
    result = gpt4.SystemResult(row, 158_976, 158_976, 1.0, 1.0, best, {}, True, "", 1, 0,
                               0.0)
    path = tmp_path / "fugaku-best.yaml"
    path.write_text(best_yaml(result), encoding="utf-8")
    assert loader.read_yaml(path)["system_set"] == {"node.accelerator": "a64fx-boost"}
    again = loader.load_scenario(path)
    assert again.system == best.system and again.parallelism == best.parallelism
    code, stdout, err = run_cli(["run", str(path), "--json"], capsys)
    assert code == 0, err
    assert json.loads(stdout)["step_time_s"] == pytest.approx(simulate(best).step_time_s,
                                                             rel=1e-12)
