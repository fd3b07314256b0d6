"""Expert tensor parallelism different from tp (``parallelism.expert_tp``) and the
all-to-all/computation overlap (``parallelism.moe_a2a_overlap``): llmsim.moe,
llmsim.experts, llmsim.params."""

from __future__ import annotations

import json

import pytest
from helpers import make_scenario
from hypothesis import given, settings
from hypothesis import strategies as st

import llmsim
from llmsim.blocks import Block, exposed_overlap_s
from llmsim.costs import HardwareCosts
from llmsim.errors import UserError
from llmsim.experts import busiest_rank_factor, expert_rows
from llmsim.plan import Plan
from llmsim.workload import build_workload

MOE = {"experts": 8, "top_k": 2, "ffn_hidden": 1024}
BASE = {"nodes": 1, "model__moe": MOE, "model__bias": False, "parallelism__pp": 1,
        "parallelism__tp": 2, "parallelism__ep": 2, "parallelism__sequence_parallel": True}


def workload(**extra):
    s = make_scenario(**(BASE | extra))
    return s, build_workload(s.model, s.parallelism, s.training, s.dp)


def forward(work):
    return {op.name: op for op in work.chunks[(0, 0)].forward}


# -- expert_tp ----------------------------------------------------------------------------


def test_expert_tp_equal_to_tp_is_the_default_exactly():
    a, b = make_scenario(**BASE), make_scenario(**BASE, parallelism__expert_tp=2)
    assert b.parallelism.etp == 2 and b.parallelism.expert_ranks == 2
    ra, rb = llmsim.simulate(a), llmsim.simulate(b)
    assert rb.step_time_s == ra.step_time_s
    assert [m.total_bytes for m in rb.memory] == [m.total_bytes for m in ra.memory]


def test_whole_experts_join_the_tp_ranks_to_the_expert_group():
    """expert_tp 1, tp 2, ep 2: the 8 experts split over tp·ep = 4 ranks, 2 whole ones
    each; no TP collective of the routed rows; the all-to-alls over the tp+ep group."""
    s, work = workload(parallelism__expert_tp=1)
    assert s.parallelism.expert_ranks == 4
    ops = forward(work)
    assert "tp_ag_moe" not in ops and "tp_moe" not in ops
    dispatch = ops["moe_dispatch"]
    assert dispatch.axis == "tp+ep"
    assert Plan.from_scenario(s).placement("tp+ep").size == 4
    # Each rank routes its own T/t = 256 tokens, k = 2 copies each: T/t·k·λ(4)·h·e bytes.
    T, t, k, h, e = 512, 2, 2, 512, 2
    lam = busiest_rank_factor(4 * T / t * k, 4)
    assert dispatch.bytes == pytest.approx(T / t * k * lam * h * e, rel=1e-12)
    local, rows = expert_rows(s.model, s.parallelism, s.training)
    assert local == 2 and rows == pytest.approx(T / t * k * lam / 2, rel=1e-12)
    # Full-width expert GEMMs (SwiGLU off: up n = f, down k = f), 2 experts batched.
    up, down = ops["expert_up"], ops["expert_down"]
    assert (up.mnk[1], up.mnk[2], up.batch) == (1024, h, 2)
    assert (down.mnk[1], down.mnk[2]) == (h, 1024)


def test_expert_tp_1_moves_no_flops_and_no_weights():
    """The same expert FLOPs and (without biases) the same expert parameters per device:
    experts/(tp·ep) whole experts hold as many weights as experts/ep split over tp."""
    s1, split = workload()
    s2, whole = workload(parallelism__expert_tp=1)
    assert whole.model_flops() == pytest.approx(split.model_flops(), rel=1e-12)
    a, b = split.chunks[(0, 0)], whole.chunks[(0, 0)]
    assert b.expert_params == a.expert_params > 0
    assert b.params == a.params
    r1, r2 = llmsim.simulate(s1), llmsim.simulate(s2)
    assert r2.model_flops_per_step == pytest.approx(r1.model_flops_per_step, rel=1e-12)
    assert sum(r2.breakdown_s.values()) == pytest.approx(r2.step_time_s, rel=1e-9)
    assert r2.breakdown_s["ep_all_to_all"] > 0


def test_expert_tp_1_at_ep_1_still_exchanges_tokens_over_tp():
    s, work = workload(parallelism__ep=1, parallelism__expert_tp=1)
    assert s.parallelism.expert_ranks == 2
    assert forward(work)["moe_dispatch"].axis == "tp+ep"


@pytest.mark.parametrize("overrides, message", [
    ({"parallelism__tp": 4, "parallelism__expert_tp": 3},
     r"parallelism\.expert_tp: 3 does not divide tp 4"),
    ({"parallelism__tp": 8, "parallelism__ep": 1, "parallelism__expert_tp": 1,
      "model__moe": MOE | {"experts": 4}},
     r"parallelism\.expert_tp: 1 splits the experts over tp·ep/expert_tp"),
    ({"model__moe": None, "parallelism__ep": 1, "parallelism__expert_tp": 1},
     r"parallelism\.expert_tp: 1 needs a mixture-of-experts model"),
    ({"parallelism__moe_a2a_overlap": True, "model__moe": None, "parallelism__ep": 1},
     r"parallelism\.moe_a2a_overlap: True needs a mixture-of-experts model"),
])
def test_impossible_expert_layouts_are_one_sentence_errors(overrides, message):
    with pytest.raises(UserError, match=message):
        make_scenario(**(BASE | overrides))


# -- the all-to-all overlap -----------------------------------------------------------------


def test_a2a_overlap_prices_each_all_to_all_beside_its_expert_gemm():
    """Each all-to-all costs max(c, g) − g beside the expert GEMM it is paired with: the
    dispatch the first after it, the combine the last before it (forward and backward)."""
    s, work = workload(parallelism__moe_a2a_overlap=True, nodes=2, parallelism__ep=8)
    costs = HardwareCosts.from_scenario(s, Plan.from_scenario(s))
    chunk = work.chunks[(0, 0)]
    for ops, pairs in ((chunk.forward, {"moe_dispatch": "expert_up",
                                        "moe_combine": "expert_down"}),
                       (chunk.backward, {"moe_combine_bwd": "expert_down_dx",
                                         "moe_dispatch_bwd": "expert_up_dx"})):
        block = Block.of(ops, costs)
        names = [op.name for op in ops]
        for comm, gemm in pairs.items():
            i, j = names.index(comm), names.index(gemm)
            assert abs(i - j) == 1
            c, g = costs.comm_s(ops[i]), costs.compute_s(ops[j])
            assert block.spans[i].duration_s == pytest.approx(exposed_overlap_s(c, g, 1),
                                                              rel=1e-12)


@given(ep=st.sampled_from([2, 4, 8]), etp=st.sampled_from([None, 1]),
       zero=st.integers(0, 2))
@settings(max_examples=8, deadline=None)
def test_a2a_overlap_never_slows_the_step_nor_changes_the_work(ep, etp, zero):
    extra = {"nodes": 2, "parallelism__ep": ep, "parallelism__expert_tp": etp,
             "parallelism__zero": zero, "model__moe": MOE | {"experts": 16}}
    plain = llmsim.simulate(make_scenario(**(BASE | extra)))
    hidden = llmsim.simulate(make_scenario(**(BASE | extra),
                                           parallelism__moe_a2a_overlap=True))
    assert hidden.breakdown_s["ep_all_to_all"] <= plain.breakdown_s["ep_all_to_all"]
    assert hidden.step_time_s <= plain.step_time_s * (1 + 1e-12)
    assert hidden.model_flops_per_step == plain.model_flops_per_step
    assert sum(hidden.breakdown_s.values()) == pytest.approx(hidden.step_time_s, rel=1e-9)


def test_a2a_overlap_needs_an_all_to_all():
    with pytest.raises(UserError, match=r"moe_a2a_overlap: true without expert parallelism"):
        make_scenario(**(BASE | {"parallelism__ep": 1, "parallelism__moe_a2a_overlap": True}))


# -- ZeRO-3 and the overlapped parameter gather with expert parallelism -------------------


@pytest.mark.parametrize("extra", [{"parallelism__zero": 3},
                                   {"parallelism__zero": 1,
                                    "parallelism__overlap_param_gather": True}])
def test_weight_gathers_split_into_the_dense_and_the_expert_groups(extra):
    """Each layer's gather: its dense weights' share over the dp·ep·cp ranks that shard
    them, then its routed experts' share over the dp·cp ranks of their own group."""
    s, work = workload(nodes=2, **extra)
    assert s.dp == 4
    chunk = work.chunks[(0, 0)]
    op = work.weight_gathers(chunk)[0]
    assert (op.axis, work.gather_group) == ("cp+ep+dp", ("cp+ep+dp", 8))
    dense, experts = work.gather_parts(chunk, op)
    assert (dense.axis, experts.axis) == ("cp+ep+dp", "cp+dp")
    whole = chunk.params * work.param_bytes_per_param / chunk.units / work.gather_messages
    assert dense.bytes == pytest.approx(whole * (1 - chunk.expert_params / chunk.params),
                                        rel=1e-12)
    assert experts.bytes == pytest.approx(whole * chunk.expert_params / chunk.params,
                                          rel=1e-12)
    result = llmsim.simulate(s)
    assert sum(result.breakdown_s.values()) == pytest.approx(result.step_time_s, rel=1e-9)
    assert {"moe_dispatch", op.name, experts.name} <= set(result.to_dataframe()["name"])


def test_experts_held_whole_by_their_group_need_no_gather():
    """dp·cp = 1: every rank of the expert-parallel group holds its experts whole."""
    s, work = workload(nodes=1, parallelism__ep=4, parallelism__zero=3,
                       model__moe=MOE | {"experts": 8})
    assert s.dp == 1
    chunk = work.chunks[(0, 0)]
    (dense,) = work.gather_parts(chunk, work.weight_gathers(chunk)[0])
    assert dense.axis == "cp+ep+dp"


# -- the command line ---------------------------------------------------------------------


@pytest.mark.parametrize("override, message", [
    ("parallelism.expert_tp=3", "parallelism.expert_tp: 3 does not divide tp 8"),
    ("parallelism.expert_tp=4", "parallelism.expert_tp: 4 splits the experts over "
     "tp·ep/expert_tp = 8·16/4 = 32 ranks"),
    ("parallelism.expert_tp=1", "parallelism.expert_tp: 1 splits the experts over tp·ep"),
])
def test_cli_rejects_impossible_expert_layouts_in_one_line(override, message, capsys):
    """gpt4-proxy-moe has 16 experts: tp 8 · ep 16 / expert_tp ranks (4 or 1) cannot
    split them, and expert_tp must divide tp."""
    from test_cli import run_cli

    code, _, err = run_cli(["run", "openai-a100-moe", "--set", override], capsys)
    assert code == 2 and message in err and "Traceback" not in err


def test_cli_runs_the_all_to_all_overlap(capsys):
    from test_cli import run_cli

    args = ["run", "openai-a100-moe", "--json"]
    code, out, err = run_cli(args, capsys)
    assert code == 0, err
    plain = json.loads(out)
    code, out, err = run_cli([*args, "--set", "parallelism.moe_a2a_overlap=true"], capsys)
    assert code == 0, err
    hidden = json.loads(out)
    assert (hidden["layout"]["moe_a2a_overlap"], hidden["layout"]["expert_tp"]) == (True, 8)
    assert hidden["breakdown_s"]["ep_all_to_all"] < plain["breakdown_s"]["ep_all_to_all"]
    assert hidden["step_time_s"] <= plain["step_time_s"]


def test_cli_reports_whole_experts_over_tp_ep_ranks(capsys):
    from test_cli import run_cli

    code, out, err = run_cli(["run", "openai-a100-moe", "--set", "parallelism.expert_tp=1",
                              "--set", "parallelism.ep=2", "--set", "parallelism.dp=104"], capsys)
    assert code == 0, err
    assert "· expert tp 1 ·" in out
    assert "routed experts: 1 of 16 per device and MoE layer (whole, over tp·ep = 16 ranks)" in out


@given(tp=st.sampled_from([1, 2]), ep=st.sampled_from([1, 2]), cp=st.sampled_from([1, 2]),
       etp=st.sampled_from([None, 1]), pp=st.sampled_from([1, 2]))
@settings(max_examples=20, deadline=None)
def test_model_flops_do_not_depend_on_the_layout(tp, ep, cp, etp, pp):
    """The step's model FLOPs are the model's: the same whatever splits the tokens, the
    experts or their matrices (16 GPUs, 16 sequences of 1,024 tokens)."""
    base = {"nodes": 2, "model__moe": MOE | {"experts": 16}, "model__bias": False,
            "training__seq_len": 1024, "parallelism__sequence_parallel": True}

    def flops(**layout):
        s = make_scenario(**base, **layout)
        return build_workload(s.model, s.parallelism, s.training, s.dp).model_flops()

    reference = flops(parallelism__tp=1, parallelism__pp=1)
    assert flops(parallelism__tp=tp, parallelism__pp=pp, parallelism__ep=ep,
                 parallelism__cp=cp, parallelism__expert_tp=etp) == pytest.approx(
        reference, rel=1e-12)


# -- the layout search ---------------------------------------------------------------------


def _layout(tp: int, ep: int, a2a: bool = False):
    from llmsim.search.space import Layout

    return Layout(nodes=2, tp=tp, pp=1, dp=16 // (tp * ep), virtual_stages=1, schedule="1f1b",
                  micro_batch=1, zero=1, sequence_parallel=tp > 1, recompute="none",
                  overlap_dp_comm=True, overlap_tp_comm=False, overlap_pp_comm=False,
                  overlap_param_gather=False, global_batch=16, ep=ep, moe_a2a_overlap=a2a)


def test_the_search_keeps_whole_experts_only_where_tp_ep_divides_them():
    """A scenario's expert_tp 1 holds in every layout the search tries: layouts whose
    tp·ep does not divide the experts are ruled out (ValueError), and the layout's
    all-to-all overlap is dropped where no all-to-all is left (and off where the layout
    has it off, whatever the scenario's); an expert_tp equal to the scenario's tp follows
    the layout's tp."""
    from llmsim.search.space import parallelism_of

    s = make_scenario(**(BASE | {"nodes": 2, "parallelism__expert_tp": 1,
                                 "parallelism__moe_a2a_overlap": True}))
    par, _ = parallelism_of(s, _layout(tp=2, ep=4, a2a=True))
    assert (par.expert_tp, par.expert_ranks, par.moe_a2a_overlap) == (1, 8, True)
    par, _ = parallelism_of(s, _layout(tp=2, ep=4))
    assert par.moe_a2a_overlap is False
    with pytest.raises(ValueError, match="tp·ep = 16 does not divide the 8 experts"):
        parallelism_of(s, _layout(tp=2, ep=8, a2a=True))
    par, _ = parallelism_of(s, _layout(tp=1, ep=1, a2a=True))
    assert (par.expert_ranks, par.moe_a2a_overlap) == (1, False)
    follows, _ = parallelism_of(make_scenario(**BASE, parallelism__expert_tp=2),
                                _layout(tp=4, ep=2))
    assert follows.etp == 4
