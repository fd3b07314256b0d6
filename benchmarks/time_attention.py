"""Time fused attention (torch SDPA, BF16, head dim 128, batch 1) on this machine's GPU
with the FLASH and the CUDNN_ATTENTION backends, forward and forward+backward (needs
PyTorch and a CUDA GPU).

Run::

    python benchmarks/time_attention.py --out attention.csv

Two families of shapes (:func:`attention_shapes`): causal square attention over 2k-128k
tokens, MHA and GQA, the kernels of a whole sequence on one GPU; and non-causal blocks of
q tokens x kv tokens, the off-diagonal steps of a context-parallel ring (each rank's
queries against another rank's keys and values). The CSV holds one row per shape, backend
and pass: ``pass`` is ``fwd`` or ``fwd_bwd``, ``time_us`` the median call, ``tflops`` the
rate counting 4·h·sq·skv·d FLOPs for the forward (÷2 when causal) and 3.5 times that for
forward+backward (the backward is 2.5 forwards: five GEMMs of the two's seven). A GQA
shape that a backend refuses is timed again with the KV heads repeated to the query
heads (``kv_expanded`` 1), the same FLOPs. A shape a backend cannot run is logged and
skipped.
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

HEAD_DIM = 128
BACKENDS = ("flash", "cudnn")
"""torch.nn.attention.SDPBackend members timed: FLASH_ATTENTION and CUDNN_ATTENTION."""
BWD_OVER_FWD_FLOPS = 2.5
"""The backward's FLOPs over the forward's (five tile GEMMs against two)."""
COLUMNS = ["backend", "pass", "causal", "heads", "kv_heads", "q_tokens", "kv_tokens",
           "head_dim", "kv_expanded", "time_us", "tflops"]


@dataclass(frozen=True)
class AttentionShape:
    """One attention call: query heads, KV heads, query and key/value tokens (batch 1,
    head dim :data:`HEAD_DIM`), causal (square only) or not."""

    heads: int
    kv_heads: int
    q_tokens: int
    kv_tokens: int
    causal: bool

    def forward_flops(self) -> float:
        """FLOPs of the forward: Q·Kᵀ and P·V, 2·2·h·sq·skv·d, halved when causal."""
        flops = 4.0 * self.heads * self.q_tokens * self.kv_tokens * HEAD_DIM
        return flops / 2 if self.causal else flops


CAUSAL_TOKENS = (2048, 4096, 8192, 16384, 32768, 65536, 131072)
CAUSAL_HEADS = ((4, 4), (8, 8), (16, 16), (32, 32), (32, 8), (64, 8))
"""Heads and KV heads on one GPU: Llama-2-7B's 32 MHA heads and their TP shares, 32 with
8 KV heads (Llama-3-8B-like), 64 with 8 (Llama-2/3-70B-like)."""
LONGEST_HEADS = ((32, 32), (32, 8), (64, 8))
"""Only these run at the longest sequence (each call takes up to a second)."""
BLOCK_TOKENS = ((2048, 2048), (4096, 4096), (8192, 8192), (16384, 16384),
                (4096, 8192), (8192, 4096), (8192, 16384), (16384, 8192),
                (16384, 32768), (32768, 16384))
"""q tokens x kv tokens of non-causal blocks: squares, and the halves a load-balanced
ring's off-diagonal steps run (a rank's whole queries against half a peer's keys, or
half its queries against a peer's whole keys)."""
BLOCK_HEADS = ((8, 8), (16, 16), (32, 32), (32, 8), (64, 8))


def attention_shapes() -> list[AttentionShape]:
    """The shapes timed: causal squares by length, then non-causal blocks, then the
    longest causal squares (the slowest calls last, where a time limit cuts them first)."""
    shapes = [AttentionShape(h, kv, s, s, True) for s in CAUSAL_TOKENS[:-1]
              for h, kv in CAUSAL_HEADS]
    shapes += [AttentionShape(h, kv, sq, skv, False) for sq, skv in BLOCK_TOKENS
               for h, kv in BLOCK_HEADS]
    shapes += [AttentionShape(h, kv, CAUSAL_TOKENS[-1], CAUSAL_TOKENS[-1], True)
               for h, kv in LONGEST_HEADS]
    return shapes


def time_shape(torch, shape: AttentionShape, backend: str, budget_s: float,
               out: ResultsCsv) -> None:
    """Time one shape's forward and forward+backward under one backend; write two rows."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    sdpa = torch.nn.functional.scaled_dot_product_attention
    chosen = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[backend]

    def tensor(heads: int, tokens: int):
        return torch.randn(1, heads, tokens, HEAD_DIM, device="cuda", dtype=torch.bfloat16,
                           requires_grad=True)

    q = tensor(shape.heads, shape.q_tokens)
    k = tensor(shape.kv_heads, shape.kv_tokens)
    v = tensor(shape.kv_heads, shape.kv_tokens)
    expanded = 0
    gqa = shape.kv_heads != shape.heads

    def forward(q=q, k=k, v=v, gqa=gqa):
        return sdpa(q, k, v, is_causal=shape.causal, enable_gqa=gqa)

    with sdpa_kernel([chosen]):
        try:
            with torch.no_grad():
                forward()
        except RuntimeError:
            if not gqa:
                raise
            group = shape.heads // shape.kv_heads
            k = k.detach().repeat_interleave(group, dim=1).requires_grad_()
            v = v.detach().repeat_interleave(group, dim=1).requires_grad_()
            expanded = 1

            def forward(q=q, k=k, v=v):
                return sdpa(q, k, v, is_causal=shape.causal)

        grad = torch.randn_like(forward())

        def forward_backward():
            forward().backward(grad)
            q.grad = k.grad = v.grad = None

        flops = shape.forward_flops()
        for name, fn, pass_flops in (
                ("fwd", lambda: forward(), flops),
                ("fwd_bwd", forward_backward, flops * (1 + BWD_OVER_FWD_FLOPS))):
            try:
                if name == "fwd":
                    with torch.no_grad():
                        seconds = seconds_per_call(torch, fn, budget_s)
                else:
                    seconds = seconds_per_call(torch, fn, budget_s)
            except Exception as error:  # log it, time the next
                log_failure(f"{backend} {name} {shape}", error)
                continue
            out.add(backend=backend, **{"pass": name}, causal=int(shape.causal),
                    heads=shape.heads, kv_heads=shape.kv_heads, q_tokens=shape.q_tokens,
                    kv_tokens=shape.kv_tokens, head_dim=HEAD_DIM, kv_expanded=expanded,
                    time_us=f"{seconds * 1e6:.2f}", tflops=f"{pass_flops / seconds / 1e12:.1f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("attention.csv"),
                        help="CSV to write, one row per shape, backend and pass.")
    parser.add_argument("--budget-s", type=float, default=0.08,
                        help="Timed run per measurement, seconds (default 0.08; a call "
                             "longer than a third of it is timed three times).")
    parser.add_argument("--backends", default=",".join(BACKENDS),
                        help="Comma-separated backends to time: flash, cudnn (default both).")
    parser.add_argument("--max-tokens", type=int, default=CAUSAL_TOKENS[-1],
                        help="Skip shapes with more query or key tokens than this.")
    args = parser.parse_args(argv)
    backends = parse_choices("--backends", args.backends, BACKENDS)
    if backends is None:
        return 2
    torch = import_torch()
    if torch is None:
        return 2
    out = ResultsCsv(args.out, COLUMNS, environment(torch))
    for shape in attention_shapes():
        if max(shape.q_tokens, shape.kv_tokens) > args.max_tokens:
            continue
        for backend in backends:
            try:
                time_shape(torch, shape, backend, args.budget_s, out)
            except Exception as error:  # log it, time the next
                log_failure(f"{backend} {shape}", error)
            torch.cuda.empty_cache()
    out.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
