"""Time the kernels around an FP8 GEMM as PyTorch runs them in eager mode, and the cost
of a kernel launch eager and replayed from a CUDA graph (needs PyTorch and a CUDA GPU).

Run::

    python benchmarks/time_fp8_casts.py --out fp8_casts.csv

On BF16 tensors of T × w (:func:`cast_shapes`: GPT-3 175B's and Llama-2/3-70B's hidden
and FFN widths and their tensor-parallel shares), each op of :data:`OPS`: the amax a
current-scaling recipe takes, the scale and cast to float8_e4m3fn, the transposes an FP8
GEMM's other operand needs. ``named_bytes`` counts what a fused kernel must read and
write (e.g. a cast-transpose reads the BF16 tensor once and writes the FP8 copy and its
transpose: 4 bytes per element), ``kernels`` how many kernels eager PyTorch launches for
it; ``gbps`` is named bytes over the time. Then the launch rows: a chain of N in-place
adds on a 4 KiB tensor, eager and as a captured CUDA graph replayed, ``time_us`` per kernel.
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
    seconds_per_call,
)

TOKENS = (2048, 4096, 8192)
WIDTHS = {
    "gpt3-175b": (12288, 3072, 1536, 49152, 12288, 6144),
    "llama-70b": (8192, 2048, 1024, 28672, 7168, 3584),
}
"""Widths of T × w activations: hidden size, its TP-4 and TP-8 shares, the FFN width and
its TP-4 and TP-8 shares (GPT-3 175B: h 12,288, FFN 4h, Brown et al. 2020 Table 2.1;
Llama 2 70B: h 8,192, FFN 28,672, Touvron et al. 2023)."""


@dataclass(frozen=True)
class CastOp:
    """One eager op: its name, the bytes per element a fused kernel reads and writes for
    it, and the kernels eager PyTorch launches."""

    name: str
    bytes_per_element: int
    kernels: int


OPS = (
    CastOp("amax_abs", 2, 2),          # x.abs().amax(): abs writes a BF16 copy, then reduces
    CastOp("amax_vector_norm", 2, 1),  # torch.linalg.vector_norm(x, inf): one reduction
    CastOp("cast", 3, 1),              # x.to(float8_e4m3fn)
    CastOp("scale_cast", 3, 2),        # (x * scale).to(float8_e4m3fn)
    CastOp("transpose_fp8", 2, 1),     # x8.t().contiguous()
    CastOp("cast_transpose", 4, 2),    # x.to(fp8) and .t().contiguous() of it: both kept
    CastOp("transpose_bf16", 4, 1),    # x.t().contiguous()
)
LAUNCH_CHAINS = (100, 1000)
"""Kernels per chain in the launch rows."""
LAUNCH_ELEMENTS = 1024
"""FP32 elements of the tensor the launch chains add to (4 KiB)."""
COLUMNS = ["op", "tokens", "width", "named_bytes", "kernels", "time_us", "gbps"]


def cast_shapes() -> list[tuple[int, int]]:
    """(T, w) pairs timed: every token count with every distinct width."""
    widths = sorted({w for ws in WIDTHS.values() for w in ws})
    return [(t, w) for t in TOKENS for w in widths]


def op_runner(torch, name: str, x):
    """A function that runs the named op once on ``x`` (BF16, T × w)."""
    e4m3 = torch.float8_e4m3fn
    scale = torch.tensor(0.5, device="cuda", dtype=torch.float32)
    x8 = x.to(e4m3)
    return {
        "amax_abs": lambda: x.abs().amax(),
        "amax_vector_norm": lambda: torch.linalg.vector_norm(x, ord=float("inf")),
        "cast": lambda: x.to(e4m3),
        "scale_cast": lambda: (x * scale).to(e4m3),
        "transpose_fp8": lambda: x8.t().contiguous(),
        "cast_transpose": lambda: (lambda q: (q, q.t().contiguous()))(x.to(e4m3)),
        "transpose_bf16": lambda: x.t().contiguous(),
    }[name]


def time_launches(torch, budget_s: float, out: ResultsCsv) -> None:
    """Per-kernel time of chains of in-place adds on a 4 KiB tensor, eager and replayed
    from a CUDA graph."""
    buf = torch.randn(LAUNCH_ELEMENTS, device="cuda", dtype=torch.float32)
    for kernels in LAUNCH_CHAINS:
        def chain(kernels=kernels):
            for _ in range(kernels):
                buf.add_(1e-3)
        try:
            seconds = seconds_per_call(torch, chain, budget_s)
            out.add(op="launch_eager", tokens=kernels, width=LAUNCH_ELEMENTS, named_bytes="",
                    kernels=kernels, time_us=f"{seconds / kernels * 1e6:.3f}", gbps="")
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                chain()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                chain()
            seconds = seconds_per_call(torch, graph.replay, budget_s)
            out.add(op="launch_graph", tokens=kernels, width=LAUNCH_ELEMENTS, named_bytes="",
                    kernels=kernels, time_us=f"{seconds / kernels * 1e6:.3f}", gbps="")
        except Exception as error:  # log it, go on
            log_failure(f"launch chain of {kernels}", error)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("fp8_casts.csv"),
                        help="CSV to write, one row per op and shape, then the launch rows.")
    parser.add_argument("--budget-s", type=float, default=0.03,
                        help="Timed run per measurement, seconds (default 0.03).")
    args = parser.parse_args(argv)
    torch = import_torch()
    if torch is None:
        return 2
    out = ResultsCsv(args.out, COLUMNS, environment(torch))
    time_launches(torch, max(args.budget_s, 0.1), out)
    for tokens, width in cast_shapes():
        x = torch.randn(tokens, width, device="cuda", dtype=torch.bfloat16)
        for op in OPS:
            try:
                seconds = seconds_per_call(torch, op_runner(torch, op.name, x), args.budget_s)
            except Exception as error:  # log it, time the next
                log_failure(f"{op.name} {tokens}x{width}", error)
                continue
            named = op.bytes_per_element * tokens * width
            out.add(op=op.name, tokens=tokens, width=width, named_bytes=named,
                    kernels=op.kernels, time_us=f"{seconds * 1e6:.2f}",
                    gbps=f"{named / seconds / 1e9:.1f}")
        del x
        torch.cuda.empty_cache()
    out.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
