"""Time the GEMM shapes of a scenario on this machine's GPU (needs PyTorch).

Run::

    llmsim calibrate shapes my-scenario.yaml --out shapes.csv
    python benchmarks/time_gemms.py shapes.csv --out gemm.csv
    llmsim calibrate gemm gemm.csv --out profile.yaml --source "machine, software, date"

Reads a CSV with the columns ``m, n, k, dtype`` (``batch`` and ``flop_share_pct``
optional; ``#`` lines are comments), times ``C[M×N] = A[M×K]·B[K×N]`` for each row with
``torch.matmul`` (FP8 with ``torch._scaled_mm``, BF16 output, on GPUs that have it) and
writes the GEMM table ``llmsim calibrate gemm`` reads: ``m, n, k, dtype, tflops`` and
``time_us``. Each shape runs for ``--seconds`` after a warm-up, so the figure is the
sustained rate at the clocks a long training run sees, not a cold burst; the median of
the timed blocks is kept. Row-major A and B are timed: a framework's weight-gradient
GEMM reads a transposed operand, which cuBLAS may run a few percent differently.
Batched GEMMs (``batch`` > 1) are skipped: llmsim looks them up by volume.
``--device cpu`` runs the same loop on the CPU, to try the script where there is no GPU.
FP8 GEMMs accumulate in split mode by default (``use_fast_accum=False``: partial sums
promoted to FP32, Transformer Engine's setting for the input- and weight-gradient GEMMs,
``_2X_ACC_DGRAD`` and ``_2X_ACC_WGRAD``); ``--fp8-fast-accum`` times them with cuBLAS's fast
accumulation, TE's setting for the forward GEMMs (``_2X_ACC_FPROP = False``, passed to
``CUBLASLT_MATMUL_DESC_FAST_ACCUM``).
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from pathlib import Path

WARMUP_CALLS = 3
BLOCKS = 5
"""Timed blocks per shape; the median block gives the shape's time."""


def read_shapes(path: Path) -> list[dict[str, str]]:
    """The rows of a shapes CSV, ``#`` comment lines skipped."""
    lines = [line for line in path.read_text(encoding="utf-8").splitlines()
             if line.strip() and not line.lstrip().startswith("#")]
    rows = list(csv.DictReader(lines))
    missing = {"m", "n", "k", "dtype"} - set(rows[0] if rows else {})
    if missing:
        raise SystemExit(f"{path}: no column {', '.join(sorted(missing))}; "
                         "write it with `llmsim calibrate shapes`")
    return rows


def write_table(path: Path, comment: str,
                results: list[tuple[int, int, int, str, float, float]]) -> None:
    """The GEMM table ``llmsim calibrate gemm`` reads: one row per (m, n, k, dtype,
    TFLOP/s, microseconds), under a ``#`` line that says where it was measured."""
    with path.open("w", encoding="utf-8", newline="") as f:
        f.write(f"# {comment}\n")
        writer = csv.writer(f)
        writer.writerow(["m", "n", "k", "dtype", "tflops", "time_us"])
        writer.writerows([m, n, k, d, f"{tf:.5g}", f"{us:.5g}"] for m, n, k, d, tf, us in results)


def operands(torch, m: int, n: int, k: int, dtype: str, device: str,
             fp8_fast_accum: bool = False):
    """A function that runs the GEMM once, or None where this device cannot run it; FP8
    with cuBLAS's fast accumulation if ``fp8_fast_accum``."""
    torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
    if dtype == "fp8":
        if device == "cpu" or not hasattr(torch, "_scaled_mm"):
            return None
        if torch.cuda.get_device_capability() < (8, 9):
            return None
        a = torch.randn(m, k, device=device).to(torch.float8_e4m3fn)
        b = torch.randn(n, k, device=device).to(torch.float8_e4m3fn).t()  # column-major B
        one = torch.ones((), device=device)
        return lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one,
                                        out_dtype=torch.bfloat16,
                                        use_fast_accum=fp8_fast_accum)
    torch_dtype = {"fp64": torch.float64, "fp32": torch.float32, "tf32": torch.float32,
                   "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    a = torch.randn(m, k, device=device, dtype=torch_dtype)
    b = torch.randn(k, n, device=device, dtype=torch_dtype)
    return lambda: torch.matmul(a, b)


def seconds_per_call(torch, gemm, device: str, seconds: float) -> float:
    """Median time of one call over :data:`BLOCKS` blocks of about ``seconds`` in all."""
    sync = torch.cuda.synchronize if device != "cpu" else (lambda: None)
    for _ in range(WARMUP_CALLS):
        gemm()
    sync()
    start = time.perf_counter()
    gemm()
    sync()
    calls = max(1, int(seconds / BLOCKS / max(time.perf_counter() - start, 1e-6)))
    per_call = []
    for _ in range(BLOCKS):
        start = time.perf_counter()
        for _ in range(calls):
            gemm()
        sync()
        per_call.append((time.perf_counter() - start) / calls)
    return statistics.median(per_call)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("shapes", type=Path, help="CSV from `llmsim calibrate shapes`.")
    parser.add_argument("--out", type=Path, default=Path("gemm.csv"), help="GEMM table to write.")
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu.")
    parser.add_argument("--seconds", type=float, default=1.0,
                        help="Timed run per shape, seconds (default 1).")
    parser.add_argument("--max-shapes", type=int, default=None,
                        help="Only the first N rows (the largest FLOP shares come first).")
    parser.add_argument("--fp8-fast-accum", action="store_true",
                        help="FP8 with cuBLAS's fast accumulation (Transformer Engine's forward "
                             "GEMMs); default: split accumulation (its gradient GEMMs).")
    args = parser.parse_args()
    try:
        import torch
    except ImportError:
        print("PyTorch is not installed; `pip install torch` to run this benchmark")
        return 1
    if args.device != "cpu" and not torch.cuda.is_available():
        print("no CUDA device is visible; run on the GPU node, or pass --device cpu to try it")
        return 1
    where = torch.cuda.get_device_name() if args.device != "cpu" else "CPU"
    rows = read_shapes(args.shapes)[: args.max_shapes]
    results = []
    for row in rows:
        m, n, k, dtype = int(row["m"]), int(row["n"]), int(row["k"]), row["dtype"]
        if int(row.get("batch") or 1) > 1:
            print(f"{m}x{n}x{k} {dtype}: batched, skipped (llmsim looks it up by volume)")
            continue
        gemm = operands(torch, m, n, k, dtype, args.device, args.fp8_fast_accum)
        if gemm is None:
            print(f"{m}x{n}x{k} {dtype}: this device cannot run {dtype} GEMMs, skipped")
            continue
        t = seconds_per_call(torch, gemm, args.device, args.seconds)
        tflops = 2 * m * n * k / t / 1e12
        print(f"{m}x{n}x{k} {dtype}: {t * 1e6:.1f} us, {tflops:.4g} TFLOP/s")
        results.append((m, n, k, dtype, tflops, t * 1e6))
    write_table(args.out, f"{where}, PyTorch {torch.__version__}, CUDA {torch.version.cuda}; "
                f"benchmarks/time_gemms.py, {args.seconds} s per shape; FP8 "
                f"use_fast_accum={args.fp8_fast_accum}", results)
    print(f"wrote {args.out} ({len(results)} shapes); next: llmsim calibrate gemm {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
