"""The MoE settings outside the engine's own path: the search's fast memory check counts
the multi-token prediction modules, and a heterogeneous job prices its all-to-alls with
the scenario's DeepEP dispatch (llmsim.search.fit, llmsim.hetero)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_hetero import TWIN_PLACEMENT, a100_nodes, tiny, twin_system

from llmsim import hetero, loader
from llmsim.costs.alltoall import TokenDispatch
from llmsim.memory import memory_per_stage
from llmsim.search.fit import PeakMemory
from llmsim.simulation import simulate


@pytest.mark.parametrize("depth", [0, 1, 2])
def test_peak_memory_counts_the_mtp_modules(depth: int) -> None:
    """A dense model with MTP modules on its one stage (pp 1, so that the stage with the
    modules is the peak): the search's peak equals the memory model's, which holds the
    modules (more bytes with every module)."""
    scenario = loader.load_scenario(tiny(a100_nodes(4), model={"mtp_depth": depth},
                                         parallelism={"pp": 1, "dp": 8}))
    par, training = scenario.parallelism, scenario.training
    accelerator = scenario.system.node.accelerator
    want = max(s.total_bytes for s in memory_per_stage(scenario.model, par, training,
                                                        scenario.dp, accelerator))
    assert PeakMemory(scenario).peak_bytes(par, training, scenario.dp) == want
    if depth:
        less = scenario.model.model_copy(update={"mtp_depth": depth - 1})
        assert want > max(s.total_bytes for s in memory_per_stage(
            less, par, training, scenario.dp, accelerator))


MIXTRAL = loader.read_yaml(Path(__file__).parents[1] / "workloads/models/mixtral-8x7b.yaml")


def _moe_job(system: object, **parallelism: object) -> dict:
    """Mixtral 8x7B's shape with 8 layers and 16 experts, on 4 stages, its experts over ep
    16 (tp 1, dp 1: two A100 nodes a stage), DeepEP dispatch."""
    return tiny(system, model={**MIXTRAL, "layers": 8,
                               "moe": {**MIXTRAL["moe"], "experts": 16}},
                parallelism={"tp": 1, "ep": 16, "dp": 1, "pp": 4, "micro_batch": 1,
                             "moe_dispatcher": "deepep",
                             "layers_per_stage": [2, 2, 2, 2], **parallelism},
                training={"global_batch": 32, "seq_len": 256, "precision": "bf16",
                          "tokens": 1e9})


def test_a_heterogeneous_job_prices_the_deepep_dispatch() -> None:
    """Each node group's cost model carries the scenario's token dispatch, and two
    identical groups give the homogeneous run's step, DeepEP or not."""
    twin = loader.load_scenario(_moe_job(twin_system(4), moe_max_nodes=None) | {
        "placement": {**TWIN_PLACEMENT, "balance": "given"}})
    want = TokenDispatch.of(twin.model, twin.parallelism)
    assert want is not None
    assert all(c.all_to_all.dispatch == want for c in hetero.group_costs(twin).values())
    homo = loader.load_scenario(_moe_job(a100_nodes(8), moe_max_nodes=None))
    assert simulate(twin).step_time_s == simulate(homo).step_time_s
    plain = loader.load_scenario(_moe_job(a100_nodes(8), moe_max_nodes=None,
                                          moe_dispatcher="alltoall"))
    assert simulate(plain).step_time_s != simulate(homo).step_time_s
