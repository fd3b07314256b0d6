"""Host time per rank before a ZeRO-3 tensor-list all-gather (needs PyTorch).

Run: pip install torch && python benchmarks/bench_host_loop.py
On the software of 2021 (Python 3.9.2, PyTorch 1.8.1, unpacked under $TMPDIR):
     bash benchmarks/stack_2021.sh benchmarks/bench_host_loop.py

DeepSpeed ZeRO-3 of 2021 (``partition_parameters.py``, ``_allgather_param``) prepares
every parameter all-gather on the host after a ``torch.cuda.synchronize()``: for each
rank of the data-parallel group it slices the flat output buffer with ``narrow`` and
compares the loop index with ``torch.distributed.get_rank(group)``, and it hands the list
of slices to ``torch.distributed.all_gather``. The device has nothing queued meanwhile,
so the loop's time is exposed once per gather. This script times that loop (the same
calls on CPU tensors, a one-process gloo group standing in for the NCCL group; the calls'
host cost does not depend on where the tensors live) and prints microseconds per rank,
from which ``parallelism.tensor_list_host_us_per_rank`` is set. It reports the best of
:data:`REPEATS` runs (noise from other work on the machine only adds time) and the median.
It also times the per-rank part of the ``all_gather`` call itself, its checks of the list
and the list's conversion for C++, by handing the list to the one-process group, which
rejects it after both. The runs of 2021 had that year's Python and PyTorch, which run the
loop faster than today's: 1.09 + 0.12 = 1.21 µs per rank on one Intel Xeon host, where
today's software runs the loop in 1.97 µs. The default is that 1.21 µs scaled to the AMD
EPYC host on which today's software ran the loop in 3.9 µs: 2.4 µs.
"""

from __future__ import annotations

import contextlib
import os
import platform
import statistics
import sys
import time

RANKS = 2048
"""Ranks in the simulated group (the loop's cost per rank does not depend on it)."""
SLICE_ELEMENTS = 256
REPEATS = 60


def main() -> int:
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        print("PyTorch is not installed; `pip install torch` to run this benchmark")
        return 1
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("gloo", rank=0, world_size=1)
    group = dist.new_group([0])
    torch.set_num_threads(1)
    flat = torch.zeros(RANKS * SLICE_ELEMENTS, dtype=torch.float16)
    shard = torch.zeros(SLICE_ELEMENTS, dtype=torch.float16)

    def tensor_list_loop() -> list[torch.Tensor]:
        slices = []
        for i in range(RANKS):
            slices.append(flat.narrow(0, SLICE_ELEMENTS * i, SLICE_ELEMENTS))
            if i == dist.get_rank(group=group):
                slices[i].data.copy_(shard, non_blocking=True)
        return slices

    def rejected_all_gather(slices: list[torch.Tensor]) -> None:
        # The one-process group rejects a list longer than one after all_gather has
        # checked it in Python and converted it for C++, the per-rank part of the call.
        with contextlib.suppress(RuntimeError, ValueError):
            dist.all_gather(slices, shard, group=group)

    def times_s(call, *args) -> list[float]:
        call(*args)
        times = []
        for _ in range(REPEATS):
            start = time.perf_counter()
            call(*args)
            times.append(time.perf_counter() - start)
        return times

    loop_us = [t / RANKS * 1e6 for t in times_s(tensor_list_loop)]
    slices = tensor_list_loop()
    call_us = (min(times_s(rejected_all_gather, slices))
               - min(times_s(rejected_all_gather, slices[:2]))) / (RANKS - 2) * 1e6
    dist.destroy_process_group()
    print(f"host: {platform.processor() or platform.machine()}, Python "
          f"{platform.python_version()}, PyTorch {torch.__version__}")
    print(f"tensor-list loop: best {min(loop_us):.2f} us per rank, "
          f"median {statistics.median(loop_us):.2f} us per rank "
          f"({REPEATS} runs of {RANKS} ranks)")
    print(f"all_gather's list checks and conversion: {call_us:.2f} us per rank")
    print(f"host time per rank before the gather: {min(loop_us) + call_us:.2f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
