"""DualPipe's overlapped forward-backward pairs (DeepSeek-V3 report §3.2.1, Figure 4;
llmsim.engine.pairs): which actions pair, each pass of a pair against its closed form,
and the step with and without the overlap."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_cli import run_cli
from test_hetero import a100_nodes, tiny
from test_moe_search_hetero import MIXTRAL

from llmsim import loader
from llmsim.schedules import SCHEDULES, build
from llmsim.schedules.dualpipe import forward_backward_pairs
from llmsim.simulation import build_engine, simulate


@given(st.sampled_from([2, 4, 6, 8]), st.integers(1, 4))
def test_the_pairs_are_steps_4_and_5_of_dualpipe(p: int, extra: int) -> None:
    """Rank r runs 2(m/2 − p + h + 1) + p/2 − h − 1 pairs (h = min(r, p − 1 − r)), each a
    forward, then a backward of the other chunk, then that backward's W."""
    m = 2 * p + 2 * extra
    order = build("dualpipe", p, m)
    assert SCHEDULES["dualpipe"].overlapped_pairs is forward_backward_pairs
    for r, actions in enumerate(order):
        h = min(r, p - 1 - r)
        pairs = forward_backward_pairs(actions)
        assert len(pairs) == 2 * (m // 2 - p + h + 1) + p // 2 - h - 1
        for i, j in pairs:
            f, b, w = actions[i], actions[j], actions[j + 1]
            assert (f.kind, b.kind, w.kind) == ("F", "B", "W") and f.chunk != b.chunk
            assert (w.microbatch, w.chunk) == (b.microbatch, b.chunk)


def _scenario(overlap: bool, schedule: str = "dualpipe") -> loader.Scenario:
    """Mixtral 8x7B's shape with 8 layers and 16 experts over ep 16 (two A100 nodes a
    stage, the all-to-alls crossing InfiniBand), pp 4, 16 micro-batches."""
    return loader.load_scenario(tiny(
        a100_nodes(8), model={**MIXTRAL, "layers": 8, "moe": {**MIXTRAL["moe"], "experts": 16}},
        parallelism={"tp": 1, "ep": 16, "dp": 1, "pp": 4, "micro_batch": 1,
                     "schedule": schedule, "moe_a2a_overlap": overlap},
        training={"global_batch": 256, "seq_len": 1024, "precision": "bf16",
                  "tokens": 1e9}))


def test_each_pass_of_a_pair_hides_its_all_to_alls_behind_the_partner() -> None:
    """F&c keeps max(0, a_F − c_B − c_W) of its all-to-alls, B&c max(0, a_B − c_F) (c:
    a pass without its all-to-alls); the pair takes c_F + c_BW + max(0, a_F − c_BW) +
    max(0, a_B − c_F). The passes' own blocks keep their all-to-alls whole under
    DualPipe, as without the overlap."""
    engine, plain = build_engine(_scenario(True)), build_engine(_scenario(False))
    assert engine.pass_kinds and not plain.pass_kinds
    checked = 0
    for (stage, chunk, kind), block in engine.blocks.items():
        if "&" not in kind:
            assert block.a2a_s == plain.blocks[(stage, chunk, kind)].a2a_s
            continue
        # the pair's forward and backward chunks
        fc, bc = (chunk, int(kind[2:])) if kind[0] == "F" else (int(kind[2:]), chunk)
        f, b, w = (engine.blocks[(stage, c, k)] for c, k in ((fc, "F"), (bc, "B"), (bc, "W")))
        c_f, c_bw = f.duration_s - f.a2a_s, b.duration_s - b.a2a_s + w.duration_s - w.a2a_s
        want = (c_f + max(0.0, f.a2a_s - c_bw) if kind[0] == "F"
                else b.duration_s - b.a2a_s + max(0.0, b.a2a_s - c_f))
        assert f.a2a_s > 0 and block.duration_s == pytest.approx(want, rel=1e-12)
        assert block.a2a_s < engine.blocks[(stage, chunk, kind[0])].a2a_s
        checked += 1
    assert checked == 2 * 2 * 4  # F and B, two chunks, four stages


def test_the_overlap_shortens_the_step_and_the_trace_uses_the_paired_passes() -> None:
    """Same model FLOPs, a shorter step and less all-to-all on the critical stage; every
    pass record of the step runs its block's time (the trace finds the paired blocks)."""
    on, off = simulate(_scenario(True)), simulate(_scenario(False))
    assert on.model_flops_per_step == off.model_flops_per_step
    assert on.step_time_s < off.step_time_s
    assert on.breakdown_s["ep_all_to_all"] < off.breakdown_s["ep_all_to_all"]
    trace = build_engine(_scenario(True)).run()
    paired = 0
    for r in trace.records:
        block = trace.block_of(r)
        if block is not None:
            assert r.end_s - r.start_s == pytest.approx(block.duration_s * r.block_share(block))
            paired += "&" in trace.pass_kinds.get((r.stage, r.kind, r.microbatch, r.chunk), "")
    assert paired == 2 * sum(len(forward_backward_pairs(a)) for a in build("dualpipe", 4, 16))


def test_1f1b_keeps_the_per_pass_overlap() -> None:
    """A schedule without pairs prices the overlap inside each pass, as before."""
    engine = build_engine(_scenario(True, "1f1b"))
    plain = build_engine(_scenario(False, "1f1b"))
    assert not engine.pass_kinds
    assert engine.blocks[(1, 0, "F")].a2a_s < plain.blocks[(1, 0, "F")].a2a_s


def test_the_all_to_all_kernels_units_slow_only_the_paired_passes() -> None:
    """``moe_comm_units`` (DeepSeek-V3: 20 SMs) leaves a pair's computation fewer units:
    its passes compute longer, the passes outside pairs as before."""
    base = _scenario(True)
    held = base.model_copy(update={"parallelism": base.parallelism.model_copy(
        update={"moe_comm_units": 20})})
    a, b = build_engine(base), build_engine(held)
    for key, block in b.blocks.items():
        own = a.blocks[key]
        if "&" in key[2]:
            assert block.compute_s > own.compute_s
        else:
            assert block.duration_s == own.duration_s
    assert simulate(held).step_time_s > simulate(base).step_time_s


def test_comm_units_without_the_overlap_is_a_one_line_error(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["run", "deepseek-v3", "--set", "parallelism.moe_a2a_overlap=false",
                            "--set", "parallelism.moe_comm_units=20"], capsys)
    assert code == 2 and "parallelism.moe_comm_units" in err and "Traceback" not in err


def test_mtp_shares_the_other_pipelines_embedding_under_dualpipe() -> None:
    """DualPipe's last stage holds the reverse direction's embedding (report §3.2.3): the
    MTP module adds its own weights there and no copy of the embedding; 1F1B's last stage
    keeps a copy."""
    from helpers import make_scenario

    from llmsim.memory import memory_per_stage
    from llmsim.mtp import mtp_params_per_device

    def last_stage_params(schedule: str, depth: int) -> int:
        s = make_scenario(parallelism__schedule=schedule, model__mtp_depth=depth)
        mem = memory_per_stage(s.model, s.parallelism, s.training, s.dp,
                               s.system.node.accelerator)
        return mem[-1].params

    s = make_scenario(model__mtp_depth=1)
    module, _ = mtp_params_per_device(s.model, s.parallelism.tp, 1, None, False)
    copy, _ = mtp_params_per_device(s.model, s.parallelism.tp, 1, None, True)
    assert copy > module
    assert last_stage_params("dualpipe", 1) - last_stage_params("dualpipe", 0) == module
    assert last_stage_params("1f1b", 1) - last_stage_params("1f1b", 0) == copy
