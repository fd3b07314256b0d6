"""Host time of the per-rank copy-out after a tensor-list all-gather (needs PyTorch and a
C++ compiler).

Run: pip install torch && python benchmarks/bench_copy_out.py
On the software of 2021 (Python 3.9.2, PyTorch 1.8.1, unpacked under $TMPDIR):
     bash benchmarks/stack_2021.sh benchmarks/bench_copy_out.py

PyTorch's ``ProcessGroupNCCL::allgather`` of 2021 (v1.8) gathers a tensor list into one
flat buffer and then, in C++, copies every rank's slice out with its own call:
``outputTensors[i][j].copy_(outputFlattened[i][j], true)`` — a ``select`` to make the
source view and a ``copy_`` through the dispatcher and TensorIterator before the CUDA
memcpy itself. DeepSpeed's ZeRO-3 of the time (``_allgather_param``) paid it once per rank
and gather. This script builds that loop as a C++ extension and times it on CPU tensors:
the dispatcher and TensorIterator work is the same, the CUDA driver call at its end is not
included (llmsim prices that as the accelerator's ``kernel_launch_us``). It prints the
best of :data:`REPEATS` passes over :data:`RANKS` ranks, three times, in microseconds per
rank, for the copy-out and for the ``select`` alone. On one Intel Xeon host PyTorch 1.8.1
and 2.13 take the same, 0.59–0.63 µs per rank.
"""

from __future__ import annotations

import platform
import sys

RANKS = 1536
"""Ranks of the gather (NAR21 Table 2's largest 175B run)."""
SLICE_ELEMENTS = 256
REPEATS = 50

_SOURCE = r"""
#include <torch/extension.h>
#include <chrono>

double copy_out_us_per_rank(std::vector<at::Tensor> outputs, at::Tensor flat, int64_t repeats) {
  double best = 1e30;
  for (int64_t r = 0; r < repeats; ++r) {
    auto start = std::chrono::steady_clock::now();
    for (size_t j = 0; j < outputs.size(); ++j) {
      outputs[j].copy_(flat[j], /*non_blocking=*/true);
    }
    auto stop = std::chrono::steady_clock::now();
    double us = std::chrono::duration<double, std::micro>(stop - start).count();
    best = std::min(best, us / outputs.size());
  }
  return best;
}

double select_us_per_rank(at::Tensor flat, int64_t repeats) {
  double best = 1e30;
  for (int64_t r = 0; r < repeats; ++r) {
    auto start = std::chrono::steady_clock::now();
    for (int64_t j = 0; j < flat.size(0); ++j) {
      auto view = flat[j];
    }
    auto stop = std::chrono::steady_clock::now();
    double us = std::chrono::duration<double, std::micro>(stop - start).count();
    best = std::min(best, us / flat.size(0));
  }
  return best;
}
"""


def main() -> int:
    try:
        import torch
        from torch.utils.cpp_extension import load_inline
    except ImportError:
        print("PyTorch is not installed; `pip install torch` to run this benchmark")
        return 1
    ext = load_inline("llmsim_copy_out", cpp_sources=_SOURCE,
                      functions=["copy_out_us_per_rank", "select_us_per_rank"],
                      extra_cflags=["-O2"])
    torch.set_num_threads(1)
    flat = torch.zeros(RANKS, SLICE_ELEMENTS, dtype=torch.float16)
    gathered = torch.zeros(RANKS * SLICE_ELEMENTS, dtype=torch.float16)
    outputs = [gathered.narrow(0, SLICE_ELEMENTS * j, SLICE_ELEMENTS) for j in range(RANKS)]
    copy_us = [ext.copy_out_us_per_rank(outputs, flat, REPEATS) for _ in range(3)]
    select_us = [ext.select_us_per_rank(flat, REPEATS) for _ in range(3)]
    print(f"host: {platform.processor() or platform.machine()}, Python "
          f"{platform.python_version()}, PyTorch {torch.__version__}")
    print("copy-out (select + copy_): " + ", ".join(f"{us:.2f}" for us in copy_us)
          + f" us per rank (best of {REPEATS} passes over {RANKS} ranks, three times)")
    print("select alone:              " + ", ".join(f"{us:.2f}" for us in select_us)
          + " us per rank")
    return 0


if __name__ == "__main__":
    sys.exit(main())
