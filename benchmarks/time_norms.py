"""Times PyTorch's LayerNorm and RMSNorm kernels, forward and backward alone, on the local
GPU (BF16, T x h tensors), for the catalog's ``memory_fraction_by_kind``.

The backward is timed with ``torch.autograd.grad`` (no accumulation into ``x.grad``), and
its bytes are counted as llmsim counts a norm's backward: 4 passes of T x h. Writes one CSV
row per kernel and shape to stdout::

    python benchmarks/time_norms.py > norms.csv
    python benchmarks/time_norms.py --impl te > te_norms.csv   # Transformer Engine's kernels

``--impl te`` times Transformer Engine's ``LayerNorm`` and ``RMSNorm`` modules instead (the
kernels Megatron-Core and NeMo runs use, apex's ``fast_layer_norm`` code; rows named
``te_layernorm_fwd`` ...): the H100 measurement docs/validation.md section 5 lacks.
"""

from __future__ import annotations

import statistics
import sys
import time

SHAPES = ((4096, 4096), (8192, 8192), (2048, 12288), (8192, 16384), (512, 12288))


def timed_s(fn, seconds: float = 0.3, blocks: int = 5) -> float:
    """Median over ``blocks`` of the mean time of back-to-back calls of ``fn``, s."""
    import torch

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    calls = max(1, int(seconds / blocks / max(time.perf_counter() - start, 1e-6)))
    per = []
    for _ in range(blocks):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        per.append((time.perf_counter() - start) / calls)
    return statistics.median(per)


IMPLS = ("torch", "te")
"""Whose norm kernels to time: PyTorch's own, or Transformer Engine's modules."""


def time_shape(tokens: int, hidden: int, impl: str = "torch") -> list[str]:
    """CSV rows of both norms, forward and backward, over one BF16 tokens × hidden tensor."""
    import torch
    import torch.nn.functional as F

    x = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.ones(hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    b = torch.zeros(hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn_like(x)
    nbytes = tokens * hidden * 2
    norms = {"layernorm": (lambda: F.layer_norm(x, (hidden,), w, b), (x, w, b)),
             "rmsnorm": (lambda: F.rms_norm(x, (hidden,), w), (x, w))}
    if impl == "te":
        import transformer_engine.pytorch as te

        ln = te.LayerNorm(hidden, params_dtype=torch.bfloat16)
        rms = te.RMSNorm(hidden, params_dtype=torch.bfloat16)
        norms = {"te_layernorm": (lambda: ln(x), (x, *ln.parameters())),
                 "te_rmsnorm": (lambda: rms(x), (x, *rms.parameters()))}
    rows = []
    for name, (norm, inputs) in norms.items():
        with torch.no_grad():
            t = timed_s(norm)
        rows.append(f"{name}_fwd,{tokens},{hidden},{t * 1e6:.2f},2,{2 * nbytes / t / 1e12:.3f}")
        y = norm()
        t = timed_s(lambda y=y, inputs=inputs: torch.autograd.grad(y, inputs, dy,
                                                                   retain_graph=True))
        rows.append(f"{name}_bwd,{tokens},{hidden},{t * 1e6:.2f},4,{4 * nbytes / t / 1e12:.3f}")
    return rows


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impl", default="torch",
                        help="whose norm kernels to time: torch (default) or te")
    args = parser.parse_args(argv)
    if args.impl not in IMPLS:
        print(f"--impl {args.impl} is not known; use one of {', '.join(IMPLS)}", file=sys.stderr)
        return 2
    if args.impl == "te":
        try:
            import transformer_engine.pytorch  # noqa: F401
        except ImportError:
            print("--impl te needs Transformer Engine, which is not installed; install "
                  "transformer_engine[pytorch] on the GPU machine or use --impl torch",
                  file=sys.stderr)
            return 2
    try:
        import torch
    except ImportError:
        print("time_norms.py needs PyTorch, which is not installed; install torch on the GPU "
              "machine", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("time_norms.py times GPU kernels and no CUDA device is visible; run it on a "
              "machine with a GPU", file=sys.stderr)
        return 2
    print(f"# {torch.cuda.get_device_name()}, PyTorch {torch.__version__}, "
          f"CUDA {torch.version.cuda}, norms of {args.impl}")
    print("kind,tokens,hidden,time_us,passes,tbps")
    for tokens, hidden in SHAPES:
        print("\n".join(time_shape(tokens, hidden, args.impl)))
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
