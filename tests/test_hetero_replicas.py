"""Data-parallel replicas on node groups (llmsim.hetero_replicas): two identical groups give
exactly the homogeneous run, the micro-batch rule's closed forms, the slower group gets
fewer micro-batches, the gradient reduction across groups at the slowest path, the step
waits for the slowest replica, ``llmsim run`` shows the groups, and bad placements are
one-line errors (exit code 2)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from test_cli import run_cli
from test_hetero import a100_nodes, tiny, twin_system

from llmsim import hetero, hetero_replicas, loader
from llmsim.calendar.energy import step_energy
from llmsim.simulation import simulate


def twins(left: int, right: int, **changes: Any) -> dict[str, Any]:
    """tiny-gpt (tp 4) with ``left`` replicas on one group and ``right`` on its twin."""
    placement = {"replicas": [{"group": "left", "replicas": left},
                              {"group": "right", "replicas": right}],
                 **changes.pop("placement", {})}
    return tiny(twin_system(64), placement=placement, **changes)


@settings(max_examples=10, deadline=None)
@given(st.sampled_from([(1, 1), (1, 3), (2, 2), (3, 1)]), st.sampled_from([2, 4]),
       st.sampled_from([0, 1, 2, 3]), st.sampled_from(["1f1b", "gpipe", "zb-h1"]))
def test_identical_groups_equal_the_homogeneous_run(split, pp, zero, schedule) -> None:
    """Any split of the replicas between two identical groups, any pp, ZeRO stage and
    schedule: the same step, stage breakdown, memory, FLOPs and MFU as on one group (a
    replica of tp 4 · pp ≥ 2 fills whole eight-GPU nodes)."""
    left, right = split
    dp = left + right
    par = {"pp": pp, "dp": dp, "zero": zero, "schedule": schedule}
    homo = simulate(loader.load_scenario(tiny(a100_nodes(pp * 4 * dp // 8), parallelism=par)))
    twin = simulate(loader.load_scenario(twins(left, right, parallelism=par)))
    assert isinstance(twin, hetero_replicas.ReplicasResult)
    assert twin.split == [16 // dp] * dp  # the global batch of 16 split evenly
    assert twin.step_time_s == homo.step_time_s
    assert twin.stages == homo.stages
    assert [m.total_bytes for m in twin.memory] == [m.total_bytes for m in homo.memory]
    assert twin.model_flops_per_step == pytest.approx(homo.model_flops_per_step, rel=1e-12)
    assert twin.mfu == pytest.approx(homo.mfu, rel=1e-12)
    assert twin.scenario.devices == homo.scenario.devices
    twin_j, homo_j = step_energy(twin), step_energy(homo)
    assert twin_j is not None and homo_j is not None
    assert twin_j.total_j == pytest.approx(homo_j.total_j, rel=1e-12)


def test_balance_closed_forms() -> None:
    rule = hetero_replicas.balance_micro_batches
    assert rule(12, [1.0, 2.0], [0.0, 0.0]) == [8, 4]  # ∝ throughput: 8·1 = 4·2
    assert rule(14, [1.0, 2.0, 4.0], [0.0] * 3) == [8, 4, 2]
    assert rule(16, [1.0, 1.0, 1.0, 1.0], [0.0] * 4) == [4, 4, 4, 4]
    assert rule(10, [1.0, 1.0], [3.0, 1.0]) == [4, 6]  # fill and drain: 3 + 4 = 1 + 6
    assert rule(12, [1.0, 2.0], [0.0, 0.0], most=[5, 12]) == [5, 7]  # memory cap binds


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.1, 10.0), min_size=1, max_size=4), st.integers(0, 40))
def test_balance_is_within_one_micro_batch_of_the_proportional_split(
        seconds: list[float], more: int) -> None:
    """Without fill and drain the replicas finish no later than the continuous
    proportional split, ``M / Σ_r (1/t_r)``, plus the slowest replica's one micro-batch,
    and the micro-batches add up to M, each replica at least one."""
    total = len(seconds) + more
    split = hetero_replicas.balance_micro_batches(total, seconds, [0.0] * len(seconds))
    assert sum(split) == total and min(split) >= 1
    finish = max(m * t for m, t in zip(split, seconds, strict=True))
    assert finish <= total / sum(1 / t for t in seconds) + max(seconds) + 1e-9


def mixed(hidden: int = 2048, **changes: Any) -> dict[str, Any]:
    """A 2,048-wide, 2,048-token tiny-gpt on the catalog's abci: two replicas on A100
    nodes, two on V100 nodes (pp 2 · tp 4 each)."""
    placement = {"replicas": [{"group": "a100", "replicas": 2},
                              {"group": "v100", "replicas": 2}],
                 **changes.pop("placement", {})}
    raw = tiny("abci", placement=placement, **{
        "parallelism": {"pp": 2, "dp": 4, **changes.pop("parallelism", {})},
        "training": {"global_batch": 64, "seq_len": 2048, **changes.pop("training", {})},
        **changes})
    raw["model"] = {**raw["model"], "hidden": hidden, "ffn_hidden": 4 * hidden,
                    "heads": 16, "max_seq_len": 2048}
    return raw


def test_the_slower_group_gets_fewer_micro_batches_and_the_step_waits_for_it() -> None:
    scenario = loader.load_scenario(mixed())
    costs = hetero.group_costs(scenario)
    t_a100, _ = hetero_replicas.replica_seconds(scenario, costs["a100"])
    t_v100, _ = hetero_replicas.replica_seconds(scenario, costs["v100"])
    assert t_v100 > t_a100  # 2,048-wide GEMMs: the V100 is the slower group
    result = simulate(scenario)
    assert isinstance(result, hetero_replicas.ReplicasResult)
    a100, v100 = result.split[:2], result.split[2:]
    assert sum(result.split) == 64 and a100[0] == a100[1] > v100[0] == v100[1]
    assert result.step_time_s == max(run.step_time_s for run in result.runs.values())
    even = simulate(loader.load_scenario(mixed(placement={
        "balance": "given", "replicas": [{"group": "a100", "replicas": 2, "micro_batches": 16},
                                         {"group": "v100", "replicas": 2,
                                          "micro_batches": 16}]})))
    assert even.step_time_s > result.step_time_s  # the balance beats the even split
    assert even.split == [16] * 4
    assert result.model_flops_per_step == pytest.approx(even.model_flops_per_step, rel=1e-12)


def test_the_gradient_reduction_takes_the_slowest_groups_path() -> None:
    """In both groups' runs a gradient bucket's reduction costs the slower side's price
    (the V nodes' EDR behind their tapered leaves), the pipeline sends their own group's."""
    result = simulate(loader.load_scenario(mixed()))
    assert isinstance(result, hetero_replicas.ReplicasResult)
    bucket = hetero_replicas.gradient_bucket(result)
    assert bucket is not None
    per_group = bucket["per_group_s"]
    assert bucket["across_s"] == per_group["v100"] > per_group["a100"]
    for run in result.runs.values():
        bucket_name = next(r.name for r in run.trace.records
                                  if r.stream == "dp" and r.name.startswith("dp_"))
        assert bucket_name.endswith("_b0")
        spans = [r.end_s - r.start_s for r in run.trace.records
                 if r.name == bucket_name and r.stage == 0 and r.stream == "dp"]
        assert spans and max(spans) == pytest.approx(bucket["across_s"], rel=1e-9)


def test_cli_shows_the_groups_and_writes_them(tmp_path, capsys) -> None:
    path = tmp_path / "replicas.yaml"
    path.write_text(yaml.safe_dump(mixed()))
    code, out, err = run_cli(["run", str(path), "--json", "--out", str(tmp_path / "out")],
                             capsys)
    assert code == 0, err
    data = json.loads((tmp_path / "out" / "result.json").read_text())
    groups = data["placement"]["replicas"]
    assert [(g["group"], g["replicas"]) for g in groups] == [("a100", 2), ("v100", 2)]
    assert data["placement"]["micro_batches_per_replica"][0] > \
        data["placement"]["micro_batches_per_replica"][-1]
    code, out, err = run_cli(["run", str(path)], capsys)
    assert code == 0, err
    assert "data-parallel replicas, micro-batches balanced by throughput" in out
    assert "the slowest group's path" in out and "Placement on group v100" in out
    assert step_energy(simulate(loader.load_scenario(mixed()))) is not None


def _given(*per_group: int) -> dict[str, Any]:
    return {"balance": "given", "replicas": [
        {"group": g, "replicas": 2, "micro_batches": m}
        for g, m in zip(("a100", "v100"), per_group, strict=False)]}


@pytest.mark.parametrize(("changes", "needle"), [
    ({"parallelism": {"dp": 5}},
     "placement.replicas: the groups hold 4 replicas but parallelism.dp is 5"),
    ({"placement": {"replicas": [{"group": "a100", "replicas": 1},
                                 {"group": "v100", "replicas": 3}]},
      "parallelism": {"pp": 1}},
     "placement.replicas: 1 replicas × tp·pp·cp·ep = 4 devices do not fill whole nodes of "
     "group 'a100' (8 devices each)"),
    ({"placement": {"replicas": [{"group": "a100", "replicas": 2},
                                 {"group": "v100", "replicas": 2}]},
      "parallelism": {"pp": 8, "layers_per_stage": [1] * 8}},
     None),
    ({"placement": {"replicas": [{"group": "a100", "replicas": 200},
                                 {"group": "v100", "replicas": 2}]},
      "parallelism": {"dp": 202}, "training": {"global_batch": 202}},
     "placement.replicas: 200 replicas × 8 devices = 1600 on group 'a100', which has 960; "
     "use at most 120 replicas there"),
    ({"placement": {"replicas": [{"group": "a100", "replicas": 2},
                                 {"group": "h100", "replicas": 2}]}},
     "placement.replicas[1].group: no node group 'h100' in system 'abci'"),
    ({"placement": {"stages": [{"group": "a100", "stages": 2}]}},
     "placement: give either stages"),
    ({"training": {"global_batch": 2}},
     "training.global_batch: 2 is not 4 replicas × at least one micro-batch"),
    ({"placement": {"balance": "given"}}, "placement.balance: given needs micro_batches"),
    ({"placement": _given(10, 10)},
     "placement.replicas: replicas × micro_batches add up to 40 micro-batches but "
     "training.global_batch holds 64"),
    ({"placement": {"replicas": [{"group": "a100", "replicas": 2, "micro_batches": 8},
                                 {"group": "v100", "replicas": 2}]}},
     "placement.balance: throughput computes each replica's micro_batches"),
    ({"parallelism": {"schedule": "interleaved-1f1b", "virtual_stages": 2}},
     "parallelism.schedule: interleaved-1f1b with placement.replicas is not modelled"),
    ({"parallelism": {"dp": "auto"}}, "parallelism.dp: auto with a placement"),
])
def test_bad_replica_placements_are_one_line_errors(tmp_path, capsys, changes, needle) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(mixed(**changes)))
    code, out, err = run_cli(["run", str(path)], capsys)
    if needle is None:  # a valid one beside them: layers given per stage, 8 stages
        assert code == 0, err
        return
    assert code == 2, out
    assert needle in err and "Traceback" not in err + out
    assert len(err.strip().splitlines()) == 1
