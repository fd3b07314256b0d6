"""What one tensor-parallel collective of FUGAKU-DEV-14 costs a call, on the node it ran on.

FUGAKU-DEV-14 ran a 124M GPT with TP 4 over the four CMGs of one A64FX node, one process of
12 threads per CMG, PyTorch 1.10; how its collectives ran (PyTorch's MPI backend over Fujitsu
MPI, or gloo over TCP loopback) is not stated, and no per-call timing of either on A64FX was
found (docs/validation.md, section 8, "The TP rows on the CMGs"). This times the calls one
micro-batch of that row makes, as that row makes them, under the backend named::

    # Fujitsu MPI (one process per CMG; the launcher binds each to its CMG)
    OMP_NUM_THREADS=12 mpiexec -n 4 python benchmarks/time_cmg_allreduce.py --backend mpi
    # gloo, through the loopback interface
    OMP_NUM_THREADS=12 python -m torch.distributed.run --nproc_per_node 4 \\
        benchmarks/time_cmg_allreduce.py --backend gloo

Cases (DeepSpeedFugaku 8e0eabb, micro-batch 1, sequence 1,024, hidden 768, FP32):
``tp_all_reduce`` the 48 all-reduces of the layers, the embedding's and the head's
(1 × 1,024 × 768, 3 MiB); ``loss_all_reduce`` the vocab-parallel cross-entropy's three
(1 × 1,024, 4 KiB); ``batch_broadcast`` ``get_batch``'s token broadcast (1 × 1,025 int64).
Each is timed alone (``idle``) and right after a 12-thread ``torch.mm`` of the row's QKV shard
(1,024 × 768 by 768 × 576), so that the OpenMP workers spin at their barrier as in a step
(``after_gemm``; only the collective is timed). Besides the median, mean and 90th percentile
of a call (µs, after ``--warmup`` calls), each row gives the process's voluntary and
involuntary context switches per call (``/proc/self/status``) and the node's idle-state
entries per call (the ``usage`` counters of ``/sys/devices/system/cpu/cpu*/cpuidle/state*``,
blank where unreadable): a sleeping wait or a core's retention shows there. Rank 0 prints one
CSV row per case and mode. PyTorch is not a dependency of llmsim.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

FIELDS = ("backend", "case", "mode", "bytes", "calls", "median_us", "mean_us", "p90_us",
          "voluntary_switches_per_call", "involuntary_switches_per_call",
          "idle_entries_per_call")

RANK_VARIABLES = ("RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK")
"""Where a launcher leaves a process's rank: ``torch.distributed.run``, Open MPI, Fujitsu
MPI (PMIx), MPICH and Intel MPI (the list DeepSpeedFugaku's ``get_rank`` reads)."""

SIZE_VARIABLES = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "PMI_SIZE")
"""Where they leave the number of processes."""

TOKENS = 1024
"""Sequence length × micro-batch of FUGAKU-DEV-14."""

HIDDEN = 768
"""Hidden size of the 124M model."""

QKV_SHARD = (TOKENS, HIDDEN, 3 * HIDDEN // 4)
"""(M, K, N) of one TP-4 rank's QKV projection: the GEMM timed before ``after_gemm`` calls."""

CASES: dict[str, tuple[tuple[int, ...], str, str]] = {
    "tp_all_reduce": ((1, TOKENS, HIDDEN), "float32", "all_reduce"),
    "loss_all_reduce": ((1, TOKENS), "float32", "all_reduce"),
    "batch_broadcast": ((1, TOKENS + 1), "int64", "broadcast"),
}
"""Each case's tensor shape, dtype and call."""

ELEMENT_BYTES = {"float32": 4, "int64": 8}


def case_bytes(case: str) -> int:
    """The bytes of ``case``'s tensor."""
    shape, dtype, _ = CASES[case]
    count = 1
    for extent in shape:
        count *= extent
    return count * ELEMENT_BYTES[dtype]


def env_int(names: tuple[str, ...], environ: dict[str, str]) -> int | None:
    """The first of ``names`` set in ``environ``, as an integer; None if none is."""
    for name in names:
        if name in environ:
            return int(environ[name])
    return None


def switches() -> tuple[int, int]:
    """(voluntary, involuntary) context switches of this process so far."""
    counts = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"):
            counts[key] = int(value)
    return counts.get("voluntary_ctxt_switches", 0), counts.get("nonvoluntary_ctxt_switches", 0)


def idle_entries() -> int | None:
    """Idle-state entries summed over the node's cores and states; None if unreadable."""
    files = list(Path("/sys/devices/system/cpu").glob("cpu[0-9]*/cpuidle/state*/usage"))
    if not files:
        return None
    try:
        return sum(int(f.read_text()) for f in files)
    except OSError:
        return None


def percentile(values: list[float], share: float) -> float:
    """The ``share`` quantile of ``values`` (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(share * len(ordered)) - 1))]


def time_case(torch: Any, dist: Any, case: str, mode: str, calls: int,
              warmup: int) -> dict[str, Any]:
    """Time ``calls`` of ``case``'s collective in ``mode`` (``idle`` or ``after_gemm``)."""
    shape, dtype, call = CASES[case]
    tensor = torch.ones(shape, dtype=getattr(torch, dtype))
    m, k, n = QKV_SHARD
    a, b = torch.randn(m, k), torch.randn(k, n)

    def one() -> float:
        if mode == "after_gemm":
            torch.mm(a, b)
        start = time.perf_counter()
        if call == "all_reduce":
            dist.all_reduce(tensor)
        else:
            dist.broadcast(tensor, src=0)
        return time.perf_counter() - start

    for _ in range(warmup):
        one()
    dist.barrier()
    s0, i0 = switches(), idle_entries()
    seconds = [one() for _ in range(calls)]
    s1, i1 = switches(), idle_entries()
    idle = "" if i0 is None or i1 is None else f"{(i1 - i0) / calls:.3f}"
    return {"case": case, "mode": mode, "bytes": case_bytes(case), "calls": calls,
            "median_us": f"{1e6 * statistics.median(seconds):.1f}",
            "mean_us": f"{1e6 * statistics.fmean(seconds):.1f}",
            "p90_us": f"{1e6 * percentile(seconds, 0.9):.1f}",
            "voluntary_switches_per_call": f"{(s1[0] - s0[0]) / calls:.3f}",
            "involuntary_switches_per_call": f"{(s1[1] - s0[1]) / calls:.3f}",
            "idle_entries_per_call": idle}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="mpi",
                        help="torch.distributed backend: mpi (default) or gloo.")
    parser.add_argument("--calls", type=int, default=200, help="Timed calls a case (200).")
    parser.add_argument("--warmup", type=int, default=20, help="Untimed calls first (20).")
    args = parser.parse_args(argv)
    if args.backend not in ("mpi", "gloo"):
        print(f"error: --backend {args.backend!r} is not one of mpi, gloo; pass --backend mpi "
              "under mpiexec or --backend gloo under torch.distributed.run", file=sys.stderr)
        return 2
    if args.calls < 1 or args.warmup < 0:
        print(f"error: --calls {args.calls} / --warmup {args.warmup} must be >= 1 / >= 0; "
              "pass positive counts", file=sys.stderr)
        return 2
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        print("PyTorch is not installed; `pip install torch` to run this benchmark")
        return 1
    environ = dict(os.environ)
    if args.backend == "mpi":
        dist.init_process_group("mpi")
    else:
        rank, size = env_int(RANK_VARIABLES, environ), env_int(SIZE_VARIABLES, environ)
        if rank is None or size is None:
            print("error: no rank or world size in the environment; start the processes with "
                  "torch.distributed.run or mpiexec", file=sys.stderr)
            return 2
        os.environ.setdefault("MASTER_ADDR", "localhost")
        os.environ.setdefault("MASTER_PORT", "29500")
        dist.init_process_group("gloo", rank=rank, world_size=size)
    rows = [time_case(torch, dist, case, mode, args.calls, args.warmup)
            for case in CASES for mode in ("idle", "after_gemm")]
    if dist.get_rank() == 0:
        writer = csv.DictWriter(sys.stdout, FIELDS)
        writer.writeheader()
        for row in rows:
            writer.writerow({"backend": args.backend, **row})
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
