"""The placement search of a heterogeneous job (llmsim.search.placement_search): its
candidates, its memory pre-check against the engine, its best against brute force, the
CLI end to end."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml
from test_cli import run_cli

from llmsim import loader
from llmsim.search.placement_search import (
    apply_placement,
    candidates,
    fits_at_all,
    search_placements,
)
from llmsim.simulation import simulate

ROOT = Path(__file__).parents[1]


def _system(a100_nodes: int, v100_nodes: int) -> dict[str, Any]:
    """ABCI's two node designs, few nodes of each (8 A100 and 4 V100 a node)."""
    a100 = loader.read_yaml(ROOT / "hardware/systems/abci-a100.yaml")
    v100 = loader.read_yaml(ROOT / "hardware/systems/abci-v100.yaml")
    return {"name": "mini-abci", "facility": a100.get("facility", {}),
            "groups": [{"name": "a100", "system": {**a100, "nodes": a100_nodes}},
                       {"name": "v100", "system": {**v100, "nodes": v100_nodes}}]}


MODEL = {**loader.read_yaml(ROOT / "workloads/models/tiny-gpt.yaml"), "layers": 8,
         "hidden": 8192, "heads": 64, "ffn_hidden": 32768}
"""8 layers of 0.8 B parameters each: a stage of two at tp 1 holds more than a V100's
16 GB in weights, gradients and optimizer state (ZeRO-1 over dp 2); at tp 4 it fits."""
RAW: dict[str, Any] = {
    "name": "mini-abci-job", "system": _system(2, 4), "model": MODEL,
    "placement": {"stages": [{"group": "a100", "stages": 2}, {"group": "v100", "stages": 2}]},
    "parallelism": {"tp": 4, "pp": 4, "dp": 2, "zero": 1},
    "training": {"global_batch": 16, "seq_len": 256, "precision": "fp16", "tokens": 1e9}}
"""The model on 2 A100 nodes + 4 V100 nodes (16 devices each), FP16, a stage placement."""


def _mini() -> Any:
    return loader.load_scenario(RAW)


def test_the_candidates_include_the_catalog_abci_placement() -> None:
    abci = loader.load_scenario("abci")
    keys = {c.key for c in candidates(abci)}
    assert "stages.tp4.pp83.dp16.z1.full.a100x15+v100x68" in keys
    assert "replicas.tp4.pp40.dp33.z2.full.a100x6+v100x27" in keys  # docs/heterogeneous.md
    for layout in candidates(abci):
        assert layout.devices <= 960 + 4_352
        assert 4 % layout.tp == 0  # a TP group within a V100 node


def test_a_candidate_the_pre_check_refuses_does_not_fit_in_the_engine() -> None:
    base, refused = _mini(), []
    for layout in candidates(base):
        try:
            scenario = apply_placement(base, layout)
        except ValueError:
            continue
        if not fits_at_all(scenario):  # at the search's 10 % headroom
            refused.append(layout.tp)
            memory = simulate(scenario).memory
            assert max(m.total_bytes / m.capacity_bytes for m in memory) > 0.9
    assert 1 in refused and 4 not in refused


def test_the_best_placement_is_the_brute_force_engine_best() -> None:
    scenario = _mini()
    rows, best, info = search_placements(scenario, objective="step_time")
    assert info.priced == len(rows) > 3 and {r["by"] for r in rows} == {"stages", "replicas"}
    brute = []
    for layout in candidates(scenario):
        try:
            sc = apply_placement(scenario, layout)
        except ValueError:
            continue
        result = simulate(sc)
        if max(m.total_bytes / m.capacity_bytes for m in result.memory) <= 0.9:  # headroom
            brute.append(result.step_time_s)
    assert len(brute) == len(rows)
    assert rows[0]["step_time_s"] == pytest.approx(min(brute), rel=1e-12)
    assert simulate(best).step_time_s == pytest.approx(min(brute), rel=1e-12)
    assert [r["step_time_s"] for r in rows] == sorted(r["step_time_s"] for r in rows)


def test_cli_search_of_a_heterogeneous_job_end_to_end(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(RAW), encoding="utf-8")
    out = tmp_path / "out"
    code, stdout, err = run_cli(["search", str(path), "--max-layouts", "12", "--out",
                                 str(out)], capsys)
    assert code == 0, err
    assert "a100×" in stdout and "re-run by the engine" in stdout
    best = loader.load_scenario(out / "best.yaml")  # runs with `llmsim run` as is
    first = pd.read_csv(out / "layouts.csv").iloc[0]
    assert best.placement is not None and best.devices == first["devices"]
    assert simulate(best).days_to_train == pytest.approx(first["days"], rel=1e-9)
