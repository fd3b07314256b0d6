"""DeepSeek-V3's FP8 GEMMs at the rate DeepSeek's own kernels ran them on an H800.

DeepGEMM's README at its first commit (deepseek-ai/DeepGEMM a6d97a1, 2025-02-25,
"Performance") times DeepSeek-V3's GEMM shapes on an H800 (NVCC 12.8) with fine-grained
FP8 scaling, and gives each shape's speedup over "our internally and carefully optimized
implementation based on CUTLASS 3.6", the kernels of the time of the V3 run. The
``h800-sxm5-80gb`` catalog entry holds those shapes at DeepGEMM's rate ÷ its speedup
(``gemm.measured_tflops``, ``gemm.grouped_tflops``). The tests check the transcription
against the README's table, that the ``deepseek-v3`` workload's forward ops are the
shapes timed (so the rates are used), and the priced time in closed form."""

from __future__ import annotations

import pytest

import llmsim
from llmsim.costs.compute import ComputeModel
from llmsim.ops import ComputeOp
from llmsim.workload.build import pass_ops

NORMAL = [  # M, N, K, DeepGEMM TFLOPS, speedup over the internal CUTLASS 3.6 kernel
    (4096, 24576, 1536, 990, 1.0),
    (4096, 32768, 512, 590, 1.0),
    (4096, 7168, 16384, 1358, 1.2),
    (4096, 4096, 7168, 1304, 1.1),
    (4096, 7168, 2048, 1025, 1.1),
]
"""DeepGEMM README a6d97a1, "Normal GEMMs for dense models", the rows with M = 4096
(one 4,096-token sequence, no TP) whose N, K llmsim's ops have (its 2,112-wide fused
MLA down-projection is two ops in llmsim, 1,536 and 576 wide, and is left out)."""

GROUPED = [  # groups, M per group, N, K, DeepGEMM TFLOPS, speedup
    (4, 8192, 4096, 7168, 1297, 1.2),
    (4, 8192, 7168, 2048, 1099, 1.2),
    (8, 4096, 4096, 7168, 1288, 1.2),
    (8, 4096, 7168, 2048, 1093, 1.1),
]
"""DeepGEMM README a6d97a1, "Grouped GEMMs for MoE models (contiguous layout)"."""


def _h800() -> llmsim.specs.Accelerator:
    return llmsim.load_scenario("deepseek-v3").system.node.accelerator


def test_catalog_holds_deepgemm_rate_over_its_speedup() -> None:
    """Each catalog rate is the README's TFLOPS ÷ its speedup, rounded to 1 TFLOP/s."""
    gemm = _h800().gemm
    normal = {(m, n, k): t for m, n, k, t in gemm.measured_tflops["fp8"]}
    grouped = {(e, m, n, k): t for e, m, n, k, t in gemm.grouped_tflops["fp8"]}
    for m, n, k, tflops, speedup in NORMAL:
        assert normal[(m, n, k)] == round(tflops / speedup)
    for e, m, n, k, tflops, speedup in GROUPED:
        assert grouped[(e, m, n, k)] == round(tflops / speedup)
    assert len(grouped) == len(GROUPED)


def test_priced_time_is_flops_over_the_rate() -> None:
    """A GEMM of a timed shape takes 2·E·M·N·K / rate (the clock model leaves a timed
    rate as measured at the catalog's power limit), with no compute units held, and
    units / (units − held) times that with 20 SMs held by DeepEP's kernels."""
    acc = _h800()
    model = ComputeModel(acc, "fp8")
    units = acc.gemm.compute_units
    for e, m, n, k, tflops, speedup in [(1, *row) for row in NORMAL] + GROUPED:
        flops = 2.0 * e * m * n * k
        rate = round(tflops / speedup) * 1e12
        op = ComputeOp("g", "gemm", "F", flops, 0.0, (m, n, k), e)
        assert model.math_s(op) == pytest.approx(flops / rate, rel=1e-9)
        held = ComputeOp("g", "gemm", "F", flops, 0.0, (m, n, k), e, reserved_units=20)
        assert model.math_s(held) == pytest.approx(flops / rate * units / (units - 20),
                                                   rel=1e-9)


def test_deepseek_v3_forward_gemms_are_the_timed_shapes() -> None:
    """The MoE block's forward holds the timed shapes: MLA's up-projections and output
    projection, the shared expert's two GEMMs, and the routed experts' grouped GEMMs of
    4 local experts of 8,192 rows (4,096 tokens × top 8 over ep 64, 256 experts)."""
    s = llmsim.load_scenario("deepseek-v3")
    ops = pass_ops(s.model, s.parallelism, s.training).moe
    assert ops is not None
    shapes = {(op.name, op.batch, op.mnk) for op in ops[0]
              if isinstance(op, ComputeOp) and op.kind == "gemm"}
    timed = {(1, (m, n, k)) for m, n, k, _, _ in NORMAL}
    timed |= {(e, (m, n, k)) for e, m, n, k, _, _ in GROUPED}
    hits = {name for name, batch, mnk in shapes if (batch, mnk) in timed}
    assert hits == {"mla_q_up", "mla_kv_up", "attn_proj", "shared_up", "shared_down",
                    "expert_up", "expert_down"}
