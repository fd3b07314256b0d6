"""Validation row DSV3-01 decomposed against DeepSeek-V3's report (docs/moe.md, "What
DSV3-01's missing 24 % is not"): where a middle stage's step goes, the FP8 GEMM rates of
DeepSeek's own kernels against llmsim's model at the same shapes, the batch ramp-up's cost,
and DualPipe's per-component order inside a forward-backward pair.

Run: python benchmarks/deepseek_v3_decompose.py   (about 15 s on 2 cores)
"""

from __future__ import annotations

import math
from dataclasses import replace

import llmsim
from llmsim import validation
from llmsim.costs import HardwareCosts
from llmsim.costs.compute import ComputeModel
from llmsim.ops import ComputeOp
from llmsim.plan import Plan
from llmsim.workload.build import pass_ops

MEASURED_S = 19.907
"""The step the report's 180 K GPU hours per trillion tokens give (runs.csv, DSV3-01)."""
RAMP_TOKENS, RUN_TOKENS = 469e9, 14.8e12
"""§4.2: the batch grows from 3,072 to 15,360 sequences over the first 469 B of 14.8 T."""
MIDDLE_STAGE = 5
"""A stage of 4 MoE layers, away from the embedding and the head."""
DEEPGEMM = [  # groups, M, N, K, DeepGEMM TFLOPS, speedup (README a6d97a1); groups 1: plain
    (1, 4096, 24576, 1536, 990, 1.0), (1, 4096, 32768, 512, 590, 1.0),
    (1, 4096, 7168, 16384, 1358, 1.2), (1, 4096, 4096, 7168, 1304, 1.1),
    (1, 4096, 7168, 2048, 1025, 1.1), (4, 8192, 4096, 7168, 1297, 1.2),
    (4, 8192, 7168, 2048, 1099, 1.2)]


def category(name: str) -> str:
    """The part of the step an op of the MoE block belongs to."""
    if name.startswith("expert_up") or name.startswith("expert_down"):
        return "routed expert GEMMs"
    if name.startswith("attn_proj") or (name.startswith("mla_") and "norm" not in name):
        return "MLA and output projections"
    if name.startswith("attn"):
        return "attention core"
    if name.startswith("shared_up") or name.startswith("shared_down"):
        return "shared expert GEMMs"
    if name.startswith("router") and not name.startswith("router_topk"):
        return "router GEMMs"
    return "memory-bound kernels"


def main() -> None:
    run = next(r for r in validation.load_runs() if r.id == "DSV3-01")
    scenario = validation.scenario_for(run)
    result = llmsim.simulate(scenario)
    print(f"step {result.step_time_s:.3f} s ({100 * (result.step_time_s / MEASURED_S - 1):+.1f} %)")
    frame = result.to_dataframe()
    middle = frame[(frame.stage == MIDDLE_STAGE) & (frame.stream == "compute")]
    for part, seconds in (middle.assign(part=middle.name.map(category))
                          .groupby("part").duration_s.sum().sort_values(ascending=False)
                          .items()):
        print(f"  {part}: {seconds:.2f} s")

    model = ComputeModel(without_deepseek_rates(scenario.system.node.accelerator), "fp8")
    print("FP8 GEMMs, llmsim's model / DeepSeek's internal kernels (DeepGEMM ÷ speedup):")
    for groups, m, n, k, tflops, speedup in DEEPGEMM:
        op = ComputeOp("g", "gemm", "F", 2.0 * groups * m * n * k, 0.0, (m, n, k), groups)
        rate = op.flops / model.math_s(op) / 1e12
        print(f"  {groups} x {m} x {n} x {k}: {rate:.0f} / {tflops / speedup:.0f} TFLOP/s")

    per_seq = {}
    for batch in (4096, 15360):
        raw = scenario.model_dump()
        raw["training"] = {**raw["training"], "global_batch": batch}
        per_seq[batch] = llmsim.simulate(type(scenario).model_validate(raw)).step_time_s / batch
    b = (per_seq[4096] - per_seq[15360]) / (1 / 4096 - 1 / 15360)
    a = per_seq[15360] - b / 15360
    ramp = (a + b * math.log(5) / 12288) / per_seq[15360]  # linear in tokens, 3,072 -> 15,360
    print(f"ramp-up: {100 * (ramp - 1):.1f} % more per token over it, "
          f"{100 * (ramp - 1) * RAMP_TOKENS / RUN_TOKENS:.2f} % on the run")

    costs = HardwareCosts.from_scenario(scenario, Plan.from_scenario(scenario))
    f, _, bwd, w = pass_ops(scenario.model, scenario.parallelism, scenario.training).moe

    def seconds(ops: tuple, names: set[str] | None = None) -> float:
        units = scenario.parallelism.moe_comm_units
        return sum(costs.compute_s(replace(op, reserved_units=units))
                   for op in ops if isinstance(op, ComputeOp)
                   and (names is None or op.name in names))

    def comm(ops: tuple, name: str) -> float:
        return sum(costs.comm_s(op) for op in ops if op.name == name)

    names_f = [op.name for op in f]
    split = names_f.index("moe_dispatch")
    attn_f = seconds(f, set(names_f[:split]))
    mlp_f = seconds(f, set(names_f[split:names_f.index("moe_combine")]) | {
        "shared_up", "shared_act", "shared_down"})
    names_b = [op.name for op in bwd]
    mlp_b = seconds(bwd, set(names_b[names_b.index("moe_combine_bwd"):
                                     names_b.index("moe_dispatch_bwd")]))
    mlp_b += seconds(w, {"expert_down_dw", "expert_up_dw", "shared_down_dw", "shared_up_dw"})
    attn_b = seconds(bwd, set(names_b[names_b.index("moe_dispatch_bwd"):]))
    attn_b += seconds(w, {"attn_proj_dw", "mla_kv_up_dw", "mla_kv_down_dw", "mla_q_up_dw",
                          "mla_q_down_dw", "router_dw"})
    print("DualPipe pair, one MoE layer (Figure 4's order), ms: computation | all-to-all")
    for part, c, a2a in (("ATTN(F) | COMBINE(B)", attn_f, comm(bwd, "moe_combine_bwd")),
                         ("MLP(B)+W | DISPATCH(F)", mlp_b, comm(f, "moe_dispatch")),
                         ("MLP(F) | DISPATCH(B)", mlp_f, comm(bwd, "moe_dispatch_bwd")),
                         ("ATTN(B)+W | COMBINE(F)", attn_b, comm(f, "moe_combine"))):
        print(f"  {part}: {1e3 * c:.2f} | {1e3 * a2a:.2f}  (slack {1e3 * (c - a2a):+.2f})")


def without_deepseek_rates(acc: llmsim.specs.Accelerator) -> llmsim.specs.Accelerator:
    """``acc`` without the catalog's DeepSeek-V3 shapes: the model's own rate there."""
    timed = {(m, n, k) for groups, m, n, k, _, _ in DEEPGEMM if groups == 1}
    fp8 = [row for row in acc.gemm.measured_tflops.get("fp8", []) if tuple(row[:3]) not in timed]
    gemm = acc.gemm.model_copy(update={"grouped_tflops": {},
                                       "measured_tflops": {**acc.gemm.measured_tflops, "fp8": fp8}})
    return acc.model_copy(update={"gemm": gemm})


if __name__ == "__main__":
    main()
