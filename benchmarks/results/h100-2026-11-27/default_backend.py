# ruff: noqa: B023, F821  (kept as it ran: the loop's closures run inside the loop; the names are deleted at its end)
"""Which SDPA backend PyTorch picks on its own (no sdpa_kernel context), as
shared/measurements/h100-sxm5-2026-11/bench_ops.py called it: times and kernel names."""
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_timing import seconds_per_call

sdpa = torch.nn.functional.scaled_dot_product_attention
print("torch", torch.__version__, "cudnn", torch.backends.cudnn.version())
for name in ("flash_sdp_enabled", "cudnn_sdp_enabled", "mem_efficient_sdp_enabled"):
    try:
        print(name, getattr(torch.backends.cuda, name)())
    except Exception as e:
        print(name, "?", e)
try:
    print("priority order", torch._C._get_sdp_priority_order())
except Exception as e:
    print("priority order ?", e)
for h, kv, s in ((32, 32, 2048), (32, 32, 4096), (32, 32, 8192), (64, 8, 8192), (8, 8, 8192),
                 (8, 8, 32768)):
    try:
        q = torch.randn(1, h, s, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(1, kv, s, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(1, kv, s, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        gqa = h != kv
        try:
            choice = torch._fused_sdp_choice(q, k, v, is_causal=True, enable_gqa=gqa)
        except Exception as e:
            choice = f"? {e}"
        f = lambda: sdpa(q, k, v, is_causal=True, enable_gqa=gqa)  # noqa: E731
        with torch.no_grad():
            t = seconds_per_call(torch, f, 0.1)
        g = torch.randn_like(f())

        def fb():
            f().backward(g)
            q.grad = k.grad = v.grad = None
        t2 = seconds_per_call(torch, fb, 0.1)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fb()
            torch.cuda.synchronize()
        kernels = sorted({e.key[:90] for e in prof.key_averages() if e.device_type.name == "CUDA"})
        flops = 4 * h * s * s * 128 / 2
        print(f"default h{h} kv{kv} s{s}: choice {choice}; fwd {t*1e6:.1f} us "
              f"{flops/t/1e12:.1f} TFLOP/s; fwd_bwd {t2*1e6:.1f} us "
              f"{3.5*flops/t2/1e12:.1f} TFLOP/s; kernels {kernels}", flush=True)
        del q, k, v, g
        torch.cuda.empty_cache()
    except Exception as e:
        print("FAILED", h, kv, s, e, flush=True)
