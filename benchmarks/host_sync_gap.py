"""Time the GPU idle that one host synchronisation in a stream of kernels causes.

A dropless MoE dispatcher learns its token counts on the host once per MoE layer's
forward: HybridEP's ``metadata_preprocessing`` calls ``cudaStreamSynchronize`` before
its dispatch kernel (DeepEP ``hybrid-ep`` branch, ``csrc/hybrid_ep/executor/executor.cu``),
DeepEP's normal dispatch spins on a host-mapped counter (``csrc/deep_ep.cpp``,
``moe_recv_counter``), Megatron-Core's ``alltoall`` dispatcher waits on the event of its
device-to-host copy of the splits (``_maybe_dtoh_and_synchronize``). While the host
waits, the GPU drains what was queued and then idles until the host has read the counts,
allocated the outputs and launched the next kernel: this script times that idle.

Each trial queues four 8192³ BF16 GEMMs (the host runs far ahead), copies eight counts
to pinned memory as the dispatchers do, and then, with ``--sync``, synchronises, reads
the counts, allocates the receive buffer from them and launches the next kernel (an
elementwise pass over a 4,096 × 2,048 BF16 tensor, one MoE layer's token rows of
Qwen3-30B-A3B); without, it allocates a fixed buffer and launches the same kernel. CUDA
events before the copy and after the kernel time the GPU side; the difference of the
two medians is the idle one sync adds. Pure PyTorch eager: the host work of a real
dispatcher (Megatron's Python between the sync and the kernel) is more, so this is a
lower bound of the price.

    python benchmarks/host_sync_gap.py --trials 200 --out results.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics


def trial(torch, big, rows, counts, pinned, sync: bool) -> float:
    """One trial: the GPU time from the counts' copy to the end of the next kernel, µs."""
    for _ in range(4):
        torch.mm(big, big)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    pinned.copy_(counts, non_blocking=True)
    if sync:
        torch.cuda.current_stream().synchronize()
        n = int(pinned.sum())
    else:
        n = rows.shape[0] * 8
    buf = torch.empty((n, rows.shape[1]), device="cuda", dtype=rows.dtype)
    rows.mul_(1.0)
    end.record()
    torch.cuda.synchronize()
    del buf
    return start.elapsed_time(end) * 1e3


def main() -> None:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    big = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    rows = torch.randn(4096, 2048, device="cuda", dtype=torch.bfloat16)
    counts = torch.randint(0, 4096, (8,), device="cuda", dtype=torch.int64)
    pinned = torch.empty(8, dtype=torch.int64, pin_memory=True)
    for _ in range(20):
        trial(torch, big, rows, counts, pinned, True)
        trial(torch, big, rows, counts, pinned, False)
    synced, free = [], []
    for _ in range(args.trials):  # interleaved, so clocks and load drift alike
        synced.append(trial(torch, big, rows, counts, pinned, True))
        free.append(trial(torch, big, rows, counts, pinned, False))
    result = {
        "device": torch.cuda.get_device_name(), "torch": torch.__version__,
        "python": platform.python_version(), "trials": args.trials,
        "with_sync_us": {"median": statistics.median(synced),
                         "p10": sorted(synced)[len(synced) // 10],
                         "p90": sorted(synced)[9 * len(synced) // 10]},
        "without_sync_us": {"median": statistics.median(free),
                            "p10": sorted(free)[len(free) // 10],
                            "p90": sorted(free)[9 * len(free) // 10]},
        "gap_us": statistics.median(synced) - statistics.median(free),
    }
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
