"""Time mixture-of-experts expert GEMMs on this machine's GPU, forward only (needs
PyTorch and a CUDA GPU).

Run::

    python benchmarks/time_grouped_gemms.py --out grouped_gemms.csv

For each model's expert shape (:data:`MODELS`), number of local experts E and tokens per
expert T (:func:`grouped_gemm_shapes`), the up/gate GEMM (h -> 2·ffn) and the down GEMM
(ffn -> h) of all E experts, timed several ways (``method``):

- ``grouped``: ``torch._grouped_mm`` over the E·T routed rows (one kernel; skipped where
  this PyTorch has none);
- ``grouped_fp8``: ``torch._scaled_grouped_mm`` in float8_e4m3fn with row-wise scales
  (skipped where absent or refused);
- ``loop``: a Python loop of ``torch.mm``, one per expert (what a framework without
  grouped GEMMs runs);
- ``bmm``: ``torch.bmm`` over E equal splits.

``tflops`` counts 2·E·T·k·n FLOPs. Equal splits everywhere (every expert gets T rows).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_timing import (
    ResultsCsv,
    environment,
    import_torch,
    log_failure,
    parse_choices,
    seconds_per_call,
)

METHODS = ("grouped", "grouped_fp8", "loop", "bmm")
MODELS = {
    # name: (hidden, expert ffn, routed experts)
    "mixtral-8x7b": (4096, 14336, 8),
    "deepseek-v3": (7168, 2048, 256),
    "qwen3-30b-a3b": (2048, 768, 128),
}
"""Hidden size, one expert's FFN width and the routed experts of each model (Mixtral 8x7B:
Jiang et al. 2024, arXiv:2401.04088 Table 1; DeepSeek-V3: arXiv:2412.19437 Sec. 4.2,
moe_intermediate_size 2048; Qwen3-30B-A3B: its config.json, hidden_size 2048,
moe_intermediate_size 768, num_experts 128)."""
LOCAL_EXPERTS = (1, 2, 4, 8, 16, 32)
TOKENS_PER_EXPERT = (128, 256, 512, 1024, 2048, 4096, 8192, 16384)
MAX_ROWS = 131072
"""Largest E·T timed (Mixtral's up GEMM output at this size is 7.5 GB of BF16)."""
MAX_FAILURES = 3
"""A method that fails this many shapes in a row is not tried again (an API this PyTorch
refuses)."""
COLUMNS = ["model", "gemm", "method", "experts", "tokens_per_expert", "m", "n", "k",
           "time_us", "tflops"]


@dataclass(frozen=True)
class GroupedShape:
    """E experts' GEMMs of T rows each: [T × k] · [k × n] per expert."""

    model: str
    gemm: str
    """``up`` (h -> 2·ffn, gate and up fused) or ``down`` (ffn -> h)."""
    experts: int
    tokens_per_expert: int
    n: int
    k: int

    def flops(self) -> float:
        return 2.0 * self.experts * self.tokens_per_expert * self.n * self.k


def grouped_gemm_shapes() -> list[GroupedShape]:
    """The shapes timed: each model's up and down GEMMs over local experts (up to its
    routed experts) and tokens per expert, E·T up to :data:`MAX_ROWS`."""
    shapes = []
    for model, (hidden, ffn, routed) in MODELS.items():
        for experts in LOCAL_EXPERTS:
            if experts > routed:
                continue
            for tokens in TOKENS_PER_EXPERT:
                if experts * tokens > MAX_ROWS:
                    continue
                shapes.append(GroupedShape(model, "up", experts, tokens, 2 * ffn, hidden))
                shapes.append(GroupedShape(model, "down", experts, tokens, hidden, ffn))
    return shapes


def runners(torch, shape: GroupedShape) -> dict[str, object]:
    """A function per method that runs the shape's GEMMs once; absent where this PyTorch
    lacks the method. Operands are random (never zeros)."""
    e, t, n, k = shape.experts, shape.tokens_per_expert, shape.n, shape.k
    bf16 = torch.bfloat16
    a = torch.randn(e * t, k, device="cuda", dtype=bf16)
    w = torch.randn(e, n, k, device="cuda", dtype=bf16)  # [out, in] per expert, as nn.Linear
    w_t = w.transpose(-2, -1)  # [E, k, n], column-major per expert
    offs = torch.arange(t, e * t + 1, t, device="cuda", dtype=torch.int32)
    found: dict[str, object] = {}
    if hasattr(torch, "_grouped_mm"):
        found["grouped"] = lambda: torch._grouped_mm(a, w_t, offs=offs, out_dtype=bf16)
    if hasattr(torch, "_scaled_grouped_mm"):
        a8 = a.to(torch.float8_e4m3fn)
        w8 = w.to(torch.float8_e4m3fn)
        scale_a = torch.rand(e * t, device="cuda", dtype=torch.float32) + 0.5
        scale_w = torch.rand(e, n, device="cuda", dtype=torch.float32) + 0.5
        found["grouped_fp8"] = lambda: torch._scaled_grouped_mm(
            a8, w8.transpose(-2, -1), scale_a, scale_w, offs=offs, out_dtype=bf16)
    chunks = a.split(t)
    found["loop"] = lambda: [torch.mm(chunks[i], w_t[i]) for i in range(e)]
    a3 = a.view(e, t, k)
    found["bmm"] = lambda: torch.bmm(a3, w_t)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("grouped_gemms.csv"),
                        help="CSV to write, one row per shape and method.")
    parser.add_argument("--budget-s", type=float, default=0.03,
                        help="Timed run per measurement, seconds (default 0.03).")
    parser.add_argument("--methods", default=",".join(METHODS),
                        help=f"Comma-separated methods (default {','.join(METHODS)}).")
    args = parser.parse_args(argv)
    methods = parse_choices("--methods", args.methods, METHODS)
    if methods is None:
        return 2
    torch = import_torch()
    if torch is None:
        return 2
    print(f"torch._grouped_mm: {hasattr(torch, '_grouped_mm')}, torch._scaled_grouped_mm: "
          f"{hasattr(torch, '_scaled_grouped_mm')}", flush=True)
    out = ResultsCsv(args.out, COLUMNS, environment(torch))
    failures = dict.fromkeys(methods, 0)
    for shape in grouped_gemm_shapes():
        try:
            found = runners(torch, shape)
        except Exception as error:  # log it, time the next
            log_failure(f"operands {shape}", error)
            torch.cuda.empty_cache()
            continue
        for method in methods:
            if method not in found or failures[method] >= MAX_FAILURES:
                continue
            try:
                seconds = seconds_per_call(torch, found[method], args.budget_s)
            except Exception as error:  # log it, time the next
                log_failure(f"{method} {shape}", error)
                failures[method] += 1
                continue
            failures[method] = 0
            out.add(model=shape.model, gemm=shape.gemm, method=method, experts=shape.experts,
                    tokens_per_expert=shape.tokens_per_expert,
                    m=shape.experts * shape.tokens_per_expert, n=shape.n, k=shape.k,
                    time_us=f"{seconds * 1e6:.2f}", tflops=f"{shape.flops() / seconds / 1e12:.1f}")
        del found
        torch.cuda.empty_cache()
    out.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
