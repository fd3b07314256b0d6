"""The layout search's estimator prices the cost mechanisms of 2026-11-27 as the engine
does: Fugaku's core retention (``system.retention_state``, :mod:`llmsim.costs.retention`),
Transformer Engine's per-expert host launches (``training.expert_host_loop``,
:mod:`llmsim.moe_host`), ALiBi's bias copy (``model.position_embedding: alibi``,
:func:`llmsim.workload.softmax.alibi_scores`) and the hosts' ring step floor
(``network.ring_post_us``). Each case is a validation row's scenario at a layout
where the mechanism moves the step; the test checks it does move it (so the agreement is
not that of two paths that both ignore it) and that the estimate stays within 1 % of the
engine, with the mechanism on and off."""

from __future__ import annotations

import pytest

import llmsim
from llmsim.search.chunk_queue import chunk_queue_s
from llmsim.search.estimate import Estimator
from llmsim.simulation import simulate
from llmsim.validation import load_runs
from llmsim.validation.scenarios import scenario_mapping

CASES = [  # row, layout overrides, the mechanism off, least relative move of the step
    ("FUGAKU-DEV-2", ["parallelism.tp=1", "parallelism.dp=64"],
     "system.retention_state=false", 2e-5),  # one 3 ms wake-up on a 95 s step (local
    # DDP's one gradient bucket, choices.yaml dp_bucket_mb: 3.2e-5 of the step)
    ("MBRIDGE-2604-MOE-02", ["parallelism.ep=2", "parallelism.dp=8"],
     "training.expert_host_loop=false", 0.2),  # 64 local experts: host-bound
    ("BLOOM-01", [], "model.position_embedding=rope", 0.005),
    ("LUMI23-01", [], "model.position_embedding=rope", 0.005),
    ("NAR21-T2-05", [], "system.network.ring_post_us=null", 0.01),
]


def _scenario(row: str, overrides: list[str]) -> llmsim.specs.Scenario:
    run = next(r for r in load_runs() if r.id == row)
    return llmsim.load_scenario(scenario_mapping(run), overrides)


@pytest.mark.parametrize("row, layout, off, least", CASES, ids=[c[0] for c in CASES])
def test_the_estimator_prices_the_mechanism_as_the_engine_does(row, layout, off, least):
    steps = {}
    for name, overrides in (("on", layout), ("off", [*layout, off])):
        scenario = _scenario(row, overrides)
        engine = simulate(scenario).step_time_s
        assert Estimator().estimate(scenario).step_time_s == pytest.approx(engine, rel=0.01)
        steps[name] = engine
    assert abs(steps["on"] - steps["off"]) > least * steps["off"], steps


@pytest.mark.parametrize("seq", [256, 512, 1024, 4096])
@pytest.mark.parametrize("extra", [[], ["training.expert_host_loop=false"],
                                   ["parallelism.ep=2", "parallelism.dp=auto"]],
                         ids=["loop", "no-loop", "ep2"])
def test_a_host_bound_pass_is_priced_as_the_engine_does(seq, extra):
    """MOE-02 (``host_path: modules``) at short sequences, where the host's issue binds:
    the engine's whole-pass queue carries the host's backlog from layer to layer, and the
    estimator prices such a chunk's passes as one queue each (:mod:`llmsim.search.
    chunk_queue`). Before that, est/engine was 0.73 / 0.78 / 0.85 at sequence 256 / 512 /
    1,024 (0.69 / 0.79 / 0.94 without the host loop; 0.93 / 0.93 / 0.94 at ep 2)."""
    scenario = _scenario("MBRIDGE-2604-MOE-02", [f"training.seq_len={seq}",
                                                 f"model.max_seq_len={seq}", *extra])
    assert Estimator().estimate(scenario).step_time_s == pytest.approx(
        simulate(scenario).step_time_s, rel=0.005)


def test_a_chunk_is_one_queue_only_where_the_host_binds():
    """The one-queue pricing is kept for layer shapes where some op is shorter than its
    host time: MOE-02 at sequence 512 takes it; with CUDA graphs (no host issue), or
    GPT-3 175B on Selene (eager, every op longer than its dispatch), the layers' blocks
    add up as before."""
    est = Estimator()
    host_bound = _scenario("MBRIDGE-2604-MOE-02", ["training.seq_len=512",
                                                   "model.max_seq_len=512"])
    graphs = _scenario("MBRIDGE-2604-MOE-02", ["training.seq_len=512", "model.max_seq_len=512",
                                               "training.cuda_graphs=true"])
    long = llmsim.load_scenario("selene-gpt3", [])
    for scenario, queued in ((host_bound, True), (graphs, False), (long, False)):
        plan, costs = est.plan_costs(scenario)
        assert (est._layer_parts(scenario, plan, costs).queued is not None) is queued


def test_a_queued_chunk_of_one_layer_is_its_block_and_longer_chunks_carry_the_backlog():
    """:func:`chunk_queue_s` of one middle layer with no extras is that layer's blocks
    (the same :meth:`Block.of` over the same ops); eight layers as one queue take at
    least eight layers' blocks (the host enters each later layer no further ahead than
    a block assumes), and more where the host binds (MOE-02 at sequence 512)."""
    scenario = _scenario("MBRIDGE-2604-MOE-02", ["training.seq_len=512",
                                                 "model.max_seq_len=512"])
    est = Estimator()
    plan, costs = est.plan_costs(scenario)
    parts = est._layer_parts(scenario, plan, costs)
    assert parts.queued is not None
    moe = scenario.model.moe
    assert all(moe.is_moe_layer(i) for i in range(1, 9))
    otp = scenario.parallelism.overlap_tp_comm
    f1, b1, w1 = chunk_queue_s(scenario.model, scenario.training, parts.queued, ((), ()),
                               costs, otp, 1, False, False, 1)
    mf, mr, mb, mw = parts.moe
    assert (f1, b1, w1) == pytest.approx((mf, mr + mb, mw), rel=1e-12)
    f8, b8, w8 = chunk_queue_s(scenario.model, scenario.training, parts.queued, ((), ()),
                               costs, otp, 8, False, False, 1)
    assert f8 > 8 * mf * 1.05 and b8 >= 8 * (mr + mb) * (1 - 1e-12) and w8 >= 8 * mw * (1 - 1e-12)
