"""How much of an eager PyTorch training step the host's kernel issue leaves the GPU idle.

Run::

    python benchmarks/time_host_dispatch.py MEGREADME-H100-04 --tp 8 --layers 8
    python benchmarks/time_host_dispatch.py selene-gpt3 --shrink 64 --layers 8 --seq 512
    python benchmarks/time_host_dispatch.py selene-gpt3 --device cpu --shrink 64 --layers 1 --seq 64

The model is ``time_layers.py``'s (the scenario cut to one device or one tensor-parallel
rank's share). For one micro-batch's forward + backward it measures, median over
``--repeats`` steps after a warm-up: the step's wall time; the host thread's CPU time; and,
under ``torch.profiler``, the number of GPU kernels launched and the time the GPU spent in
them (the union of their intervals on the one stream). Then

* ``gpu_idle_share`` = 1 - kernel time / wall: the share of the step the GPU waited for
  the host (with one stream and no host sync inside the step, that is exposed issue);
* ``main_thread_us_per_kernel`` = the Python thread's CPU time / kernels: a lower bound
  on the host's cost to issue one kernel, since autograd issues the backward's kernels
  from its own device thread, which ``time.thread_time`` does not count.

A shrunk model (``--shrink``, short ``--seq``) makes every kernel short, so the step is
host-bound and ``wall_ms`` / ``kernels`` is the host's issue interval itself, forward and
backward together. Prints one CSV row per case (``--out`` appends them to a file).
PyTorch is not a dependency of llmsim.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

FIELDS = ("case", "layers", "hidden", "seq", "tp", "kernels", "wall_ms", "host_cpu_ms",
          "kernel_ms", "gpu_idle_share", "main_thread_us_per_kernel")
"""The CSV columns: times per forward + backward step of one micro-batch."""


def kernel_union_ms(events: list[tuple[float, float]]) -> float:
    """Milliseconds covered by the union of (start_us, end_us) intervals."""
    total_us, end_us = 0.0, float("-inf")
    for start, stop in sorted(events):
        if start > end_us:
            total_us += stop - start
            end_us = stop
        elif stop > end_us:
            total_us += stop - end_us
            end_us = stop
    return total_us / 1e3


def timed_steps(step: Callable[[], None], sync: Callable[[], None],
                repeats: int) -> tuple[list[float], list[float]]:
    """Wall and main-thread CPU seconds of ``repeats`` calls of ``step``, each between
    device syncs."""
    sync()
    walls, cpus = [], []
    for _ in range(repeats):
        sync()
        start, cpu0 = time.perf_counter(), time.thread_time()
        step()
        cpu1 = time.thread_time()
        sync()
        walls.append(time.perf_counter() - start)
        cpus.append(cpu1 - cpu0)
    return walls, cpus


def profiled_kernels(torch: Any, step: Callable[[], None],
                     sync: Callable[[], None]) -> tuple[int, float]:
    """GPU kernels of one call of ``step`` under ``torch.profiler``, and the milliseconds
    the GPU spent in them (:func:`kernel_union_ms`)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        sync()
    spans = [(e.time_range.start, e.time_range.end) for e in prof.events()
             if e.device_type == torch.autograd.DeviceType.CUDA]
    return len(spans), kernel_union_ms(spans)


def append_rows(path: Path, fields: tuple[str, ...], rows: list[dict[str, Any]]) -> None:
    """Append ``rows`` to the CSV at ``path``, with a header line if the file is new."""
    new = not path.exists()
    with path.open("a", newline="") as f:
        out = csv.DictWriter(f, fields)
        if new:
            out.writeheader()
        out.writerows(rows)


def measure(torch: Any, model: Any, tokens: Any, device: str, repeats: int) -> dict[str, float]:
    """Wall, host CPU, kernels and kernel time of one forward + backward step."""
    sync = torch.cuda.synchronize if device != "cpu" else (lambda: None)

    def step() -> None:
        model(tokens).backward()
        model.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    walls, cpus = timed_steps(step, sync, repeats)
    kernels, kernel_ms = profiled_kernels(torch, step, sync) if device != "cpu" else (0, 0.0)
    wall_ms, cpu_ms = statistics.median(walls) * 1e3, statistics.median(cpus) * 1e3
    return {"kernels": kernels, "wall_ms": wall_ms, "host_cpu_ms": cpu_ms,
            "kernel_ms": kernel_ms,
            "gpu_idle_share": 1 - kernel_ms / wall_ms if kernels else float("nan"),
            "main_thread_us_per_kernel": cpu_ms * 1e3 / kernels if kernels else float("nan")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scenario", help="Scenario file, catalog name or validation row id.")
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu.")
    parser.add_argument("--layers", type=int, default=4, help="Transformer layers (default 4).")
    parser.add_argument("--shrink", type=int, default=1,
                        help="Divide hidden, heads, FFN and vocabulary by N.")
    parser.add_argument("--seq", type=int, default=None,
                        help="Sequence length (default: the scenario's).")
    parser.add_argument("--tp", type=int, default=1, help="One rank of N-way tensor parallelism.")
    parser.add_argument("--repeats", type=int, default=20, help="Timed steps (default 20).")
    parser.add_argument("--out", type=Path, default=None, help="Append the row to this CSV.")
    args = parser.parse_args(argv)
    from time_layers import build_model, import_torch_for, resolve, single_device

    torch = import_torch_for(args.device)
    if torch is None:
        return 1

    overrides = [f"training.seq_len={args.seq}"] if args.seq else []
    one = single_device(resolve(args.scenario, overrides), args.layers, args.shrink, args.tp)
    dtype = torch.bfloat16 if args.device != "cpu" else torch.float32
    model = build_model(torch, one, args.device, dtype)
    tokens = torch.randint(0, one.model.vocab, (one.parallelism.micro_batch,
                                                one.training.seq_len), device=args.device)
    row: dict[str, Any] = {"case": args.scenario, "layers": args.layers,
                           "hidden": one.model.hidden, "seq": one.training.seq_len,
                           "tp": args.tp, **measure(torch, model, tokens, args.device,
                                                    args.repeats)}
    writer = csv.DictWriter(sys.stdout, FIELDS)
    writer.writeheader()
    writer.writerow(row)
    if args.out is not None:
        append_rows(args.out, FIELDS, [row])
    return 0


if __name__ == "__main__":
    sys.exit(main())
