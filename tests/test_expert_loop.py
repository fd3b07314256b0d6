"""llmsim.expert_loop: DeepSpeed's ``Experts`` loop over uneven token batches as X-MoE runs
it (X-MoE 33c69c95, ``deepspeed/moe/experts.py`` and ``moe_v2.py``): one GEMM per local
expert, the copies of the routed rows, and nothing at all for grouped experts."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmsim.costs.compute import gemm_math_s
from llmsim.expert_loop import BACKWARD_COPIES, FORWARD_COPIES, one_per_expert
from llmsim.loader import load_spec
from llmsim.ops import ComputeOp
from llmsim.simulation import simulate
from llmsim.validation import load_runs, scenario_for

ROW = next(r for r in load_runs("XMOE25") if r.id == "XMOE25-01")
COPY_OPS = ("moe_expert_gather", "moe_expert_concat", "moe_interleave_bwd",
            "moe_expert_gather_bwd")


def _scenario(loop: str):
    scenario = scenario_for(ROW)
    return scenario.model_copy(update={
        "training": scenario.training.model_copy(update={"expert_loop": loop})})


def _ops(loop: str) -> list[ComputeOp]:
    workload = simulate(_scenario(loop)).workload
    chunk = next(iter(workload.chunks.values()))
    return [op for op in chunk.ops if isinstance(op, ComputeOp)]


def test_grouped_experts_have_no_loop_and_no_copies() -> None:
    """The default prices every expert GEMM as one grouped kernel, as before."""
    ops = _ops("grouped")
    assert not any(op.name in COPY_OPS for op in ops)
    assert all(op.batch == 8 and op.splits == 1 for op in ops
               if op.name.startswith("expert_") and op.kind == "gemm")


def test_the_loop_runs_one_gemm_per_local_expert_with_the_same_work() -> None:
    """Each grouped expert GEMM of 8 local experts becomes 8 GEMMs of its mean rows in
    order: the same FLOPs and bytes, 8 launches, a shape of 8·M rows in 8 splits."""
    grouped = {(op.name, op.phase): op for op in _ops("grouped")}
    looped = {(op.name, op.phase): op for op in _ops("deepspeed_uneven")}
    gemms = [key for key, op in grouped.items()
             if op.kind == "gemm" and key[0].startswith("expert_")]
    assert len(gemms) == 6
    for key in gemms:
        g, loop = grouped[key], looped[key]
        assert (loop.flops, loop.bytes) == (g.flops, g.bytes)
        assert loop.batch == 1 and loop.splits == 8
        assert loop.mnk == (8 * g.mnk[0], g.mnk[1], g.mnk[2])
    assert looped[("expert_act", "F")].splits == 8


def test_the_copies_are_four_forward_and_two_backward_of_the_routed_rows() -> None:
    """Each copy reads and writes the rank's routed rows once: R·h values of 2 bytes (FP16),
    R = 4 × 2,048 tokens × top-6 (the busiest rank's rows: at least the mean)."""
    ops = [op for op in _ops("deepspeed_uneven") if op.name in COPY_OPS]
    layers = 28
    assert len(ops) == 4 * layers
    per_layer_f = sum(op.bytes for op in ops if op.phase == "F") / layers
    per_layer_b = sum(op.bytes for op in ops if op.phase == "B") / layers
    one_copy = 2 * 4 * 2048 * 6 * 2048 * 2
    assert per_layer_f / FORWARD_COPIES == pytest.approx(per_layer_b / BACKWARD_COPIES)
    assert per_layer_f >= FORWARD_COPIES * one_copy * 0.999
    assert per_layer_f < FORWARD_COPIES * one_copy * 1.5
    assert sum(op.splits for op in ops) == layers * (FORWARD_COPIES + BACKWARD_COPIES)


def test_the_loop_only_slows_the_x_moe_step() -> None:
    """Copies and per-expert launches are added and the expert GEMMs lose the grouped
    kernel's shared waves: the step is longer, and still shorter than measured."""
    grouped = simulate(_scenario("grouped")).step_time_s
    looped = simulate(_scenario("deepspeed_uneven")).step_time_s
    assert grouped < looped < ROW.measured


def test_other_ops_and_single_experts_are_left_as_they_are() -> None:
    op = ComputeOp("qkv", "gemm", "F", 1.0, 1.0, (64, 64, 64), 4)
    expert = ComputeOp("expert_up", "gemm", "F", 1.0, 1.0, (64, 64, 64), 4)
    assert one_per_expert(op, 4) is op and one_per_expert(expert, 1) is expert


@given(m=st.integers(256, 8192), n=st.sampled_from([1408, 2048, 4096, 14336]),
       k=st.sampled_from([1408, 2048, 4096]), experts=st.integers(2, 16))
def test_one_gemm_per_expert_costs_the_experts_gemms_one_after_another(
        m: int, n: int, k: int, experts: int) -> None:
    """A grouped GEMM of ``E`` matrices run as ``E`` splits of ``E·M`` rows costs exactly
    ``E`` times one expert's GEMM (each with its own waves)."""
    gcd = load_spec("accelerators", "mi250x-gcd")
    peak, rate = gcd.peak_flops("fp16"), gcd.sustained_memory_bytes_per_s
    looped = gemm_math_s(experts * m, n, k, 1, gcd.gemm, peak, "fp16", splits=experts,
                         memory_bytes_per_s=rate)
    one = gemm_math_s(m, n, k, 1, gcd.gemm, peak, "fp16", memory_bytes_per_s=rate)
    assert looped == pytest.approx(experts * one, rel=1e-12)
