"""Host time of one Transformer Engine ``GroupedLinear`` call by number of local experts
(needs a GPU, PyTorch and Transformer Engine; prepared 2026-11-27, not yet run).

llmsim prices the kernels ``GroupedLinear`` launches from its C++ loops, one quantisation
and one cuBLAS GEMM per local expert, at the H100's bare eager dispatch, 9.1 µs a launch
(``llmsim.moe_host``, ``training.expert_host_loop``): no C++ launch was timed alone. This
script times the host side of one forward and one backward of ``GroupedLinear`` (FP8
current scaling by default, Qwen3-30B-A3B's fc1 shape: hidden 2,048 to 2 × 768, 4,096
rows an expert) for 1, 2, 4, 8 and 16 experts while the device is kept busy by a long
``torch.cuda._sleep`` queued first, so the host never waits for it (a call that does wait,
a host sync, shows as a time near the sleep and is flagged). The slope of host time over
experts, divided by the loop launches an expert adds (5 forward, 6 backward under current
scaling; 1 and 2 in BF16: :func:`launches_per_expert`), is the host time of one loop
launch to set ``HostIssue.loop_interval_s`` from.

    python benchmarks/time_grouped_linear_host.py --out grouped_linear_host.csv
"""

from __future__ import annotations

import argparse
import csv
import statistics
import time
from collections.abc import Sequence

SLEEP_CYCLES = 200_000_000
"""Cycles of the busy kernel queued before each timed call (about 0.1 s at 1.98 GHz):
longer than any call's host time, so the host never waits for the device."""


def launches_per_expert(fp8: bool) -> tuple[int, int]:
    """Loop launches one more expert adds to a ``GroupedLinear`` (forward, backward):
    under FP8 current scaling 4 quantisation kernels and 1 GEMM forward, 4 and 2 GEMMs
    backward (``llmsim.moe_host.grouped_linear_launches``); in BF16 the GEMMs alone."""
    return (5, 6) if fp8 else (1, 2)


def slope_us(experts: Sequence[int], host_us: Sequence[float]) -> float:
    """Least-squares slope of host time (µs) over the number of experts, µs an expert."""
    n = len(experts)
    if n < 2:
        raise ValueError("need two or more expert counts for a slope")
    mx, my = sum(experts) / n, sum(host_us) / n
    var = sum((x - mx) ** 2 for x in experts)
    return sum((x - mx) * (y - my) for x, y in zip(experts, host_us, strict=True)) / var


def _time_call(torch, layer, x, splits, grad, repeats: int, autocast) -> tuple[float, float]:
    """Median host µs of the forward and of the backward, the device kept busy."""
    fwd, bwd = [], []
    for _ in range(repeats):
        torch.cuda.synchronize()
        torch.cuda._sleep(SLEEP_CYCLES)
        t0 = time.perf_counter()
        with autocast():
            out = layer(x, splits)
        t1 = time.perf_counter()
        out.backward(grad)
        t2 = time.perf_counter()
        fwd.append((t1 - t0) * 1e6)
        bwd.append((t2 - t1) * 1e6)
    torch.cuda.synchronize()
    return statistics.median(fwd), statistics.median(bwd)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--experts", default="1,2,4,8,16")
    ap.add_argument("--rows", type=int, default=4096, help="rows an expert")
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--ffn", type=int, default=1536, help="output features (2 x 768)")
    ap.add_argument("--bf16", action="store_true", help="no FP8 (BF16 GEMMs only)")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--out", default="grouped_linear_host.csv")
    args = ap.parse_args(argv)
    import contextlib

    import torch
    import transformer_engine.pytorch as te
    from transformer_engine.common import recipe

    fp8 = not args.bf16
    if fp8:
        enter = getattr(te, "autocast", None) or te.fp8_autocast
        kw = ({"recipe": recipe.Float8CurrentScaling()} if enter is getattr(te, "autocast", None)
              else {"enabled": True, "fp8_recipe": recipe.Float8CurrentScaling()})

        def autocast():
            return enter(**kw)
    else:
        autocast = contextlib.nullcontext
    rows: list[dict[str, object]] = []
    for e in (int(v) for v in args.experts.split(",")):
        layer = te.GroupedLinear(e, args.hidden, args.ffn, bias=False,
                                 params_dtype=torch.bfloat16, device="cuda")
        x = torch.randn(e * args.rows, args.hidden, device="cuda", dtype=torch.bfloat16,
                        requires_grad=True)
        grad = torch.randn(e * args.rows, args.ffn, device="cuda", dtype=torch.bfloat16)
        _time_call(torch, layer, x, [args.rows] * e, grad, 3, autocast)  # warm-up
        f, b = _time_call(torch, layer, x, [args.rows] * e, grad, args.repeats, autocast)
        synced = max(f, b) > 0.5 * SLEEP_CYCLES / 1.98e3  # near the sleep: the host waited
        rows.append({"experts": e, "fp8": fp8, "forward_host_us": round(f, 1),
                     "backward_host_us": round(b, 1), "waited_for_device": synced})
        print(rows[-1])
    es = [int(r["experts"]) for r in rows]
    per_f, per_b = launches_per_expert(fp8)
    sf = slope_us(es, [float(r["forward_host_us"]) for r in rows])
    sb = slope_us(es, [float(r["backward_host_us"]) for r in rows])
    print(f"forward {sf:.1f} us an expert = {sf / per_f:.2f} us a loop launch; "
          f"backward {sb:.1f} us an expert = {sb / per_b:.2f} us a loop launch")
    with open(args.out, "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
