"""Heterogeneous jobs (llmsim.hetero): two identical node groups give exactly the
homogeneous run, the balancing rule's closed forms and optimality, the link between groups
in the pipeline cost, and bad placements as one-line errors (exit code 2)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from test_cli import run_cli

from llmsim import hetero, loader
from llmsim.blocks import Block
from llmsim.simulation import build_engine, simulate

A100 = loader.read_yaml(Path(__file__).parents[1] / "hardware/systems/abci-a100.yaml")


def a100_nodes(nodes: int) -> dict[str, Any]:
    """The abci-a100 system with ``nodes`` nodes, as a raw mapping."""
    return {**A100, "nodes": nodes}


def tiny(system: Any, **changes: Any) -> dict[str, Any]:
    """tiny-gpt with 8 layers, tp 4 · dp 2 (8 devices a stage), pp 4, FP16."""
    raw: dict[str, Any] = {
        "name": "hetero-test", "system": system,
        "model": {**loader.read_yaml(Path(__file__).parents[1]
                                     / "workloads/models/tiny-gpt.yaml"), "layers": 8},
        "parallelism": {"tp": 4, "pp": 4, "dp": 2, "schedule": "1f1b", "zero": 1},
        "training": {"global_batch": 16, "seq_len": 256, "precision": "fp16", "tokens": 1e9},
    }
    for key, value in changes.items():
        raw[key] = {**raw[key], **value} if isinstance(value, dict) and key in raw else value
    return raw


def twin_system(nodes_each: int) -> dict[str, Any]:
    """Two identical groups of abci-a100 nodes, in abci-a100's facility (its PUE)."""
    return {"name": "twins", "facility": A100.get("facility", {}),
            "groups": [{"name": "left", "system": a100_nodes(nodes_each)},
                       {"name": "right", "system": a100_nodes(nodes_each)}]}


TWIN_PLACEMENT = {"stages": [{"group": "left", "stages": 2}, {"group": "right", "stages": 2}]}


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_two_identical_groups_equal_the_homogeneous_run(schedule: str) -> None:
    """The layers as given (even), the same layout: every number of the step is the same."""
    par = {"schedule": schedule, "layers_per_stage": [2, 2, 2, 2]}
    homo = simulate(loader.load_scenario(tiny(a100_nodes(4), parallelism=par)))
    twin = simulate(loader.load_scenario(tiny(
        twin_system(2), parallelism=par,
        placement={**TWIN_PLACEMENT, "balance": "given"})))
    assert twin.step_time_s == homo.step_time_s
    assert twin.stages == homo.stages
    assert [m.total_bytes for m in twin.memory] == [m.total_bytes for m in homo.memory]
    assert twin.mfu == homo.mfu
    assert twin.scenario.devices == homo.scenario.devices == 32
    assert twin.scenario.nodes_used == homo.scenario.nodes_used == 4


@settings(max_examples=8, deadline=None)
@given(st.sampled_from([(2, [4, 4]), (4, [2, 2, 2, 2]), (4, [1, 3, 3, 1])]),
       st.integers(1, 3), st.sampled_from([2, 4]), st.sampled_from([0, 1, 2, 3]),
       st.sampled_from(["1f1b", "gpipe", "zb-h1"]))
def test_identical_groups_equal_homogeneous_for_any_layout(pp_split, cut, dp, zero,
                                                           schedule) -> None:
    """Any split of the stages between two identical groups, any dp, ZeRO stage and
    schedule: the same step time and stage breakdown as on one group."""
    pp, split = pp_split
    cut = min(cut, pp - 1)
    par = {"pp": pp, "dp": dp, "zero": zero, "schedule": schedule, "layers_per_stage": split}
    nodes = pp * 4 * dp // 8  # a stage on tp·dp = 4·dp devices: whole A100 nodes
    homo = simulate(loader.load_scenario(tiny(a100_nodes(nodes), parallelism=par)))
    twin = simulate(loader.load_scenario(tiny(
        twin_system(nodes), parallelism=par,
        placement={"stages": [{"group": "left", "stages": cut},
                              {"group": "right", "stages": pp - cut}], "balance": "given"})))
    assert twin.step_time_s == homo.step_time_s and twin.stages == homo.stages


def test_identical_groups_balance_as_the_homogeneous_job_would() -> None:
    """By throughput, identical groups split as the rule splits one group's stages: the
    embedding's and head's extra work moves layers off the first and last stage only."""
    twin = hetero.balanced(loader.load_scenario(tiny(twin_system(2), placement=TWIN_PLACEMENT)))
    assert twin.placement is not None and twin.placement.memory_headroom == 0.1  # the default
    split = twin.parallelism.layers_per_stage
    assert split is not None and sum(split) == 8
    homo = simulate(loader.load_scenario(tiny(a100_nodes(4),
                                              parallelism={"layers_per_stage": split})))
    assert simulate(twin).step_time_s == homo.step_time_s
    assert split[1] == split[2] >= max(split[0], split[3])


def _memory_bound(headroom: float) -> dict[str, Any]:
    """24 layers of 0.8 B parameters on 2 A100 + 2 V100 stages (tests/test_placement_search's
    job): the speed split puts 4 layers on a V100 stage, 74 % of its 16 GB."""
    from test_placement_search import RAW

    return {**RAW, "model": {**RAW["model"], "layers": 24},
            "training": {**RAW["training"], "seq_len": 2048},
            "placement": {**RAW["placement"], "memory_headroom": headroom}}


def _peaks(scenario: Any) -> list[float]:
    return [m.total_bytes / m.capacity_bytes for m in hetero.group_memory(scenario)]


def test_the_balanced_split_leaves_the_headroom_on_every_stage() -> None:
    """``placement.memory_headroom``: every stage of the balanced split stays below its
    capacity less the headroom, where without it a stage goes above that."""
    kept = hetero.balanced(loader.load_scenario(_memory_bound(0.3)))
    full = hetero.balanced(loader.load_scenario(_memory_bound(0.0)))
    assert sum(kept.parallelism.layers_per_stage or []) == 24
    assert max(_peaks(kept)) <= 0.7 < max(_peaks(full))
    assert loader.load_scenario(RAW_DEFAULT).placement.memory_headroom == 0.1


def test_a_headroom_the_model_cannot_keep_fills_the_memory() -> None:
    """Caps at the headroom that cannot hold every layer give way to the whole memory's:
    the split of no headroom, not an overfilled stage."""
    given_up = hetero.balanced(loader.load_scenario(_memory_bound(0.5)))
    full = hetero.balanced(loader.load_scenario(_memory_bound(0.0)))
    assert given_up.parallelism.layers_per_stage == full.parallelism.layers_per_stage
    assert max(_peaks(given_up)) <= 1.0


RAW_DEFAULT = tiny(twin_system(2), placement=TWIN_PLACEMENT)
"""A placement without ``memory_headroom``."""


def test_balance_closed_forms() -> None:
    assert hetero.balance_layers(8, [1.0, 1.0, 1.0, 1.0]) == [2, 2, 2, 2]
    assert hetero.balance_layers(8, [1.0, 3.0]) == [6, 2]  # 6·1 = 2·3
    assert hetero.balance_layers(7, [1.0, 2.0, 4.0]) == [4, 2, 1]  # ∝ 1/t: 4 : 2 : 1
    assert hetero.balance_layers(4, [1.0, 1.0], extra_s=[0.0, 2.0]) == [3, 1]  # 3 = 2 + 1
    assert hetero.balance_layers(6, [1.0, 1.0], most=[2, 6]) == [2, 4]  # the cap binds
    assert hetero.balance_layers(6, [1.0, 1.0], most=[1, 1]) == [3, 3]  # caps too small


@settings(max_examples=150, deadline=None)
@given(st.lists(st.floats(0.1, 10.0), min_size=1, max_size=3),
       st.integers(0, 7), st.data())
def test_balance_is_optimal_and_complete(seconds: list[float], more: int, data) -> None:
    """The split holds every layer, each stage at least one, and no split of the same
    layers has a slower stage finishing earlier (brute force over all splits)."""
    layers = len(seconds) + more
    extra = data.draw(st.lists(st.floats(0.0, 5.0), min_size=len(seconds),
                               max_size=len(seconds)))
    split = hetero.balance_layers(layers, seconds, extra)
    assert sum(split) == layers and min(split) >= 1

    def slowest(counts: tuple[int, ...] | list[int]) -> float:
        return max(e + n * t for e, n, t in zip(extra, counts, seconds, strict=True))
    best = min(slowest(c) for c in itertools.product(range(1, layers + 1), repeat=len(seconds))
               if sum(c) == layers)
    assert slowest(split) <= best * (1 + 1e-12)


def mixed(**changes: Any) -> dict[str, Any]:
    """tiny-gpt on the catalog's abci: stages 0–1 on A100 nodes, 2–3 on V100 nodes."""
    placement = {"stages": [{"group": "a100", "stages": 2}, {"group": "v100", "stages": 2}],
                 **changes.pop("placement", {})}
    return tiny("abci", placement=placement, **changes)


def test_the_link_between_groups_is_in_the_pipeline_cost() -> None:
    """The send from the last A100 stage to the first V100 stage takes the slower side's
    time (the V nodes' 2 × EDR and their leaves' 1/3 taper), and the engine uses it."""
    scenario = hetero.balanced(loader.load_scenario(mixed()))
    result = simulate(scenario)
    border = hetero.border_sends(scenario, result.workload.pp_message_bytes)
    assert [(b["stage"], b["from"], b["to"]) for b in border] == [(1, "a100", "v100")]
    b = border[0]
    assert b["across_s"] == max(b["from_s"], b["to_s"]) > min(b["from_s"], b["to_s"])
    assert b["to_s"] > b["from_s"]  # EDR behind a tapered leaf is the slower path
    sends = [r for r in result.trace.records if r.name == "pp_send"]
    across = [r.end_s - r.start_s for r in sends if r.stage in (1, 2)
              and r.kind == ("F" if r.stage == 1 else "B")]
    assert across and across == pytest.approx([b["across_s"]] * len(across), rel=1e-9)
    inside = [r.end_s - r.start_s for r in sends if r.stage == 0 and r.kind == "F"]
    assert inside == pytest.approx([b["from_s"]] * len(inside), rel=1e-9)  # A100 to A100


def test_each_stage_is_priced_on_its_groups_hardware() -> None:
    """Same layers on every stage: each stage's pass is its group's cost model's price
    (tiny-gpt's small GEMMs happen to run faster on the V100), its memory its group's
    accelerator's (the V100's 16 GB)."""
    scenario = loader.load_scenario(mixed(parallelism={"layers_per_stage": [2, 2, 2, 2]},
                                          placement={"balance": "given"}))
    engine = build_engine(scenario)
    forward = [engine.blocks[(s, 0, "F")].compute_s for s in range(4)]
    assert forward[1] != forward[2]  # the middle stages: two layers each, nothing else
    costs = hetero.group_costs(scenario)
    for stage, group in ((1, "a100"), (2, "v100")):
        alone = Block.of(engine.work.chunks[(stage, 0)].forward, costs[group])
        assert forward[stage] == alone.compute_s
    result = simulate(scenario)
    assert [round(m.capacity_bytes / 1e9) for m in result.memory] == [40, 40, 16, 16]
    placed = result.to_dict()["placement"]  # result.json
    assert placed["groups"] == {
        "a100": {"stages": 2, "nodes": 2, "devices": 16, "accelerator": "a100-sxm4-40gb"},
        "v100": {"stages": 2, "nodes": 4, "devices": 16, "accelerator": "v100-sxm2-16gb"}}
    assert placed["layers_per_stage"] == [2, 2, 2, 2] and placed["balance"] == "given"
    assert scenario.devices == 32 and scenario.nodes_used == 2 + 4  # 8 a node, 4 a node


def test_throughput_balance_gives_the_faster_group_more_layers() -> None:
    split = hetero.balanced(loader.load_scenario(mixed())).parallelism.layers_per_stage
    assert split is not None and sum(split) == 8
    assert min(split[:2]) >= max(split[2:])


def test_a_system_without_placement_is_its_first_group() -> None:
    abci = loader.load_spec("systems", "abci")
    a100 = loader.load_spec("systems", "abci-a100")
    assert (abci.nodes, abci.node, abci.network) == (a100.nodes, a100.node, a100.network)
    assert abci.all_devices == 960 + 4_352 and abci.devices == 960
    plain = simulate(loader.load_scenario(tiny("abci", parallelism={"pp": 2}, nodes=2)))
    alone = simulate(loader.load_scenario(tiny("abci-a100", parallelism={"pp": 2}, nodes=2)))
    assert plain.step_time_s == alone.step_time_s


def test_abci_scenario_is_the_sources_whole_job(capsys) -> None:
    scenario = loader.load_scenario("abci")
    assert scenario.group_nodes() == {"a100": (120, 960), "v100": (1_088, 4_352)}
    code, out, err = run_cli(["run", "abci", "--set", "training.global_batch=1024"], capsys)
    assert code == 0, err
    assert "960 × a100-sxm4-40gb (120 nodes) + 4,352 × v100-sxm2-16gb (1,088 nodes)" in out
    assert "Node groups of abci" in out and "between groups: a pipeline send" in out
    assert "no validation run resembles this scenario" in out
    assert "does not fit" not in out


@pytest.mark.parametrize(("changes", "needle"), [
    ({"placement": {"stages": [{"group": "a100", "stages": 2},
                               {"group": "h100", "stages": 2}]}},
     "placement.stages[1].group: no node group 'h100' in system 'abci'; use one of a100, v100"),
    ({"placement": {"stages": [{"group": "a100", "stages": 3},
                               {"group": "v100", "stages": 2}]}},
     "placement.stages: the runs hold 5 stages but parallelism.pp is 4"),
    ({"placement": {"stages": [{"group": "a100", "stages": 4}]},
      "parallelism": {"dp": 128}, "training": {"global_batch": 256}},
     "placement.stages: 4 stages × 512 devices = 2048 on group 'a100', which has 960; use "
     "at most 1 stages there"),
    ({"parallelism": {"tp": 2, "dp": 1}},
     "a stage's tp·cp·ep·dp = 2 devices do not fill whole nodes of group 'a100'"),
    ({"parallelism": {"dp": "auto"}}, "parallelism.dp: auto with a placement"),
    ({"nodes": 10}, "nodes: 10 with a placement"),
    ({"training": {"precision": "bf16"}}, "training.precision: bf16 is not supported by "
                                          "v100-sxm2-16gb"),
    ({"parallelism": {"layers_per_stage": [5, 1, 1, 1]}},
     "placement.balance: throughput computes parallelism.layers_per_stage"),
    ({"placement": {"stages": [{"group": "a100", "stages": 2}, {"group": "v100", "stages": 2}],
                    "memory_headroom": 1.0}},
     "placement.memory_headroom = 1.0 is invalid (input should be less than 1)"),
])
def test_bad_placements_are_one_line_errors(tmp_path, capsys, changes, needle) -> None:
    raw = mixed(**changes)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(raw))
    code, out, err = run_cli(["run", str(path)], capsys)
    assert code == 2
    assert needle in err and "Traceback" not in err + out
    assert len(err.strip().splitlines()) == 1


def test_unknown_group_system_is_a_one_line_error(tmp_path, capsys) -> None:
    raw = mixed()
    raw["system"] = {"name": "x", "groups": [{"name": "a", "system": "abci-a101"}]}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(raw))
    code, _, err = run_cli(["run", str(path)], capsys)
    assert code == 2 and "system.groups[0].system" in err and len(err.strip().splitlines()) == 1


def test_system_of_groups_takes_its_first_groups_nodes(tmp_path, capsys) -> None:
    raw = mixed()
    raw["system"] = {**twin_system(2), "nodes": 3}
    raw["placement"] = TWIN_PLACEMENT
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(raw))
    code, _, err = run_cli(["run", str(path)], capsys)
    assert code == 2 and "differ from its first group's ('left')" in err
    assert len(err.strip().splitlines()) == 1


def test_search_of_a_placement_searches_the_placement(capsys) -> None:
    """(llmsim.search.placement_search; tests/test_placement_search.py runs it whole.)"""
    code, out, err = run_cli(["search", "abci", "--max-layouts", "3", "--workers", "1"],
                             capsys)
    assert code == 0, err
    assert "abci: " in out and "(a random sample)" in out
