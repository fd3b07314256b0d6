"""The simulated devices, and full fidelity's folding of identical tensor-parallel ranks.

Folded (one device per TP group) and unfolded (every device) full fidelity must record
the same step: the same step time, and for every simulated device the records of each
device it stands for.
"""

from __future__ import annotations

import pytest
from helpers import make_scenario

from llmsim.engine.devices import Device, devices_for, fold_identical_tp_ranks
from llmsim.simulation import build_engine

GRID = [
    {},
    {"parallelism__pp": 2, "training__global_batch": 16},
    {"parallelism__overlap_dp_comm": False},
    {"parallelism__zero": 3, "parallelism__pp": 1, "parallelism__tp": 4},
    {"parallelism__schedule": "interleaved-1f1b", "parallelism__virtual_stages": 2,
     "parallelism__overlap_pp_comm": True, "model__layers": 16},
    {"model__tied_embeddings": True},
    {"parallelism__tp": 4, "parallelism__pp": 2, "training__global_batch": 16},
]


def _key(r):
    return (r.stream, r.name, r.kind, r.microbatch, r.chunk, r.start_s)


@pytest.mark.parametrize("overrides", GRID, ids=str)
def test_folded_full_fidelity_records_what_every_device_does(overrides):
    scenario = make_scenario(nodes=2, fidelity="full", **overrides)
    folded_engine = build_engine(scenario)
    every_engine = build_engine(scenario, fold_identical=False)
    tp = scenario.parallelism.tp
    assert len(folded_engine.devices) * tp == len(every_engine.devices) == scenario.devices
    folded, every = folded_engine.run(), every_engine.run()
    assert folded.step_end_s == pytest.approx(every.step_end_s, rel=1e-12)
    assert folded.devices() == every.devices() == list(range(scenario.devices))
    by_device: dict[int, list] = {}
    for r in every.records:
        by_device.setdefault(r.device, []).append(r)
    own: dict[int, list] = {}
    for r in folded.records:
        own.setdefault(r.device, []).append(r)
    for rep, ids in folded.replicas.items():
        assert ids[0] == rep and len(ids) == tp
        for d in ids:
            mine = sorted(by_device[d], key=_key)
            theirs = sorted(own[rep], key=_key)
            assert len(mine) == len(theirs)
            for a, b in zip(mine, theirs, strict=True):
                assert _key(a)[:5] == _key(b)[:5]
                assert a.start_s == pytest.approx(b.start_s, rel=1e-12, abs=1e-15)
                assert a.end_s == pytest.approx(b.end_s, rel=1e-12, abs=1e-15)


def test_pipelines_placed_differently_are_not_folded():
    devices = devices_for("full", stages=2, tp=2, dp=1)

    def node_of(dev: Device, stage: int) -> int:  # TP rank 1's stages share a node
        return stage if dev.pipe == (0, 0) else 0

    kept, replicas = fold_identical_tp_ranks(devices, 2, node_of)
    assert kept == devices
    assert replicas == {d.id: (d.id,) for d in devices}


def test_reduced_fidelity_has_no_replicas():
    engine = build_engine(make_scenario(nodes=2))
    assert engine.replicas == {}
    assert engine.run().devices() == [d.id for d in engine.devices]
