"""Expert tensor parallelism at any divisor of tp (``parallelism.expert_tp``, Megatron-Core's
``--expert-tensor-parallel-size``): the groups (llmsim.plan), the ops (llmsim.moe), the
weights, and Megatron-Core's layout rule tp·cp·dp = expert_tp·ep·expert_dp."""

from __future__ import annotations

import pytest
from helpers import make_scenario
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import llmsim
from llmsim.experts import busiest_rank_factor, expert_rows
from llmsim.plan import Plan
from llmsim.workload import build_workload

MOE = {"experts": 8, "top_k": 2, "ffn_hidden": 1024}
BASE = {"nodes": 1, "model__moe": MOE, "model__bias": False, "parallelism__pp": 1,
        "parallelism__tp": 4, "parallelism__ep": 2, "parallelism__sequence_parallel": True}


def forward(scenario):
    work = build_workload(scenario.model, scenario.parallelism, scenario.training, scenario.dp)
    return work, {op.name: op for op in work.chunks[(0, 0)].forward}


def test_expert_tp_2_of_tp_4_splits_each_expert_over_adjacent_ranks():
    """tp 4, ep 2, expert_tp 2 on one 8-GPU node: the experts split over tp/2·ep = 4 ranks
    (0, 2, 4, 6 for rank 0: the TP ranks 2 apart and the ep ranks 4 apart), 2 experts
    each, each expert over 2 adjacent ranks (0, 1), whose reduce-scatter of the routed
    rows runs there."""
    s = make_scenario(**BASE, parallelism__expert_tp=2)
    plan = Plan.from_scenario(s)
    assert s.parallelism.expert_ranks == 4
    _, ops = forward(s)
    dispatch, exit_rs = ops["moe_dispatch"], ops["tp_moe"]
    assert dispatch.axis == "xtp+ep" and exit_rs.axis == "etp"
    assert plan.members("xtp+ep", 0) == [0, 2, 4, 6]
    assert plan.members("xtp+ep", 5) == [1, 3, 5, 7]
    assert plan.members("etp", 0) == [0, 1] and plan.members("etp", 6) == [6, 7]
    assert plan.placement("xtp+ep").size == 4 and plan.placement("etp").size == 2
    assert sorted(plan.group_first_ranks("xtp+ep")) == [0, 1]
    assert sorted(plan.group_first_ranks("etp")) == [0, 2, 4, 6]
    # Each rank holds T/tp = 128 tokens; an expert-TP group routes T·2/4 = 256, so the
    # busiest of 4 ranks gets 256·k·λ rows, of which the all-to-all carries this rank's half.
    T, k, h, e = 512, 2, 512, 2
    lam = busiest_rank_factor(4 * T * 2 / 4 * k, 4)
    assert dispatch.bytes == pytest.approx(T / 4 * k * lam * h * e, rel=1e-12)
    assert exit_rs.bytes == pytest.approx(T / 2 * k * lam * h * e, rel=1e-12)
    local, rows = expert_rows(s.model, s.parallelism, s.training)
    assert local == 2 and rows == pytest.approx(T / 2 * k * lam / 2, rel=1e-12)
    up = ops["expert_up"]
    assert (up.mnk[1], up.mnk[2], up.batch) == (1024 // 2, h, 2)


@pytest.mark.parametrize("etp", [1, 2, 4])
def test_every_expert_tp_holds_the_same_expert_weights_and_flops(etp):
    """Without biases, experts/(tp·ep/e) experts split e ways hold experts·h·f·2/(tp·ep)
    weights on every device whatever e, and the model FLOPs do not move."""
    ref = make_scenario(**BASE)
    s = make_scenario(**BASE, parallelism__expert_tp=etp)
    work_ref, _ = forward(ref)
    work, _ = forward(s)
    h, f = s.model.hidden, MOE["ffn_hidden"]
    per_layer = MOE["experts"] * 2 * h * f // (4 * 2)
    assert work.chunks[(0, 0)].expert_params == s.model.layers * per_layer
    assert work.model_flops() == pytest.approx(work_ref.model_flops(), rel=1e-12)
    result = llmsim.simulate(s)
    assert sum(result.breakdown_s.values()) == pytest.approx(result.step_time_s, rel=1e-9)


@given(tp=st.sampled_from([1, 2, 4, 8]), etp_i=st.integers(0, 3),
       ep=st.sampled_from([1, 2, 4]), cp=st.sampled_from([1, 2]))
@settings(max_examples=25, deadline=None)
def test_megatron_layout_rule_holds_for_every_divisor(tp, etp_i, ep, cp):
    """Megatron-Core counts dp_M = ep·dp dense replicas and ep_M = tp·ep/e expert ranks
    (``initialize_model_parallel``): tp·cp·dp_M = e·ep_M·edp with edp = cp·dp, the
    experts' gradient group; the plan's expert-parallel group has ep_M ranks and meets
    the expert-TP group in one rank."""
    assume(16 % (tp * cp * ep) == 0)
    divisors = [d for d in (1, 2, 4, 8) if tp % d == 0]
    etp = divisors[etp_i % len(divisors)]
    dp = 16 // (tp * cp * ep)
    s = make_scenario(nodes=2, model__moe={"experts": 64, "top_k": 2, "ffn_hidden": 1024},
                      model__bias=False, parallelism__tp=tp, parallelism__pp=1,
                      parallelism__ep=ep, parallelism__cp=cp, parallelism__expert_tp=etp,
                      parallelism__sequence_parallel=tp > 1,
                      training__global_batch=8 * ep * dp)
    par, plan = s.parallelism, Plan.from_scenario(s)
    work, ops = forward(s)
    ep_m, edp = par.expert_ranks, work.grad_groups[1][1]
    assert tp * cp * (ep * dp) == etp * ep_m * edp
    assert edp == cp * dp
    if ep_m > 1:
        axis = ops["moe_dispatch"].axis
        assert plan.placement(axis).size == ep_m
        group = set(plan.members(axis, 0))
        expert_tp = set(plan.members("etp", 0)) if 1 < etp < tp else \
            set(plan.members("tp", 0)) if etp == tp else {0}
        # the expert-TP group and the expert-parallel group meet in one rank
        assert group & expert_tp == {0}
