"""Host time of a Hugging Face Llama training step in eager PyTorch, on one GPU.

Run::

    python benchmarks/time_hf_llama_host.py --layers 32 --seq 16 1024 2048 4096 --out hf.csv
    python benchmarks/time_hf_llama_host.py --device cpu --layers 1 --hidden 64 --seq 16  # smoke

What DistFlashAttn's one-box runs (DFA24, docs/validation.md section 10) execute on each GPU,
less the other seven GPUs: transformers' ``LlamaForCausalLM`` (LLaMA-7B's shapes by default:
hidden 4,096, 32 heads, FFN 11,008, vocabulary 32,000) in FP16, one sequence of ``--seq``
tokens, forward and backward, no optimizer step. Attention is PyTorch's SDPA (the rows run
their own Triton forward and flash-attn 2's backward; SDPA stands in for their time, not
their launch count). Each case runs under one of four modes:

* ``plain``: autograd, nothing recomputed;
* ``hf_ckpt``: Hugging Face's gradient checkpointing (each decoder layer recomputed in the
  backward, ``gradient_checkpointing_enable``);
* ``hf_ckpt_sync``: the same with ``torch.cuda.synchronize()`` before and after each layer's
  attention, in the forward, the recompute and the backward (the backward's at the gradient
  of ``o_proj``'s output and of ``q_proj``'s input): six a layer. DistFlashAttn synchronizes
  the device at every time step of its schedule, so the host cannot run ahead of the GPU;
* ``fsdp_hf_ckpt`` / ``fsdp_hf_ckpt_sync``: as above with each decoder layer its own FSDP
  ``FULL_SHARD`` unit on a one-rank process group (FSDP's Python hooks, flattening and
  stream waits without the other ranks' traffic).

For each case it measures, median over ``--repeats`` steps after warm-up: the step's wall
time; the main thread's CPU time (``time.thread_time``: autograd's backward thread not
counted); and under ``torch.profiler`` one step's GPU kernels and the time the GPU spent in
them (the union of their intervals). ``wall_ms - kernel_ms`` is the time the GPU waited.
At ``--seq 16`` every kernel is short and the wall is the host's own time for the step.
PyTorch and transformers are not dependencies of llmsim.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from time_host_dispatch import append_rows, profiled_kernels, timed_steps

FIELDS = ("mode", "layers", "hidden", "seq", "kernels", "wall_ms", "host_cpu_ms",
          "kernel_ms", "gpu_wait_ms", "syncs", "error")
"""The CSV columns: one forward + backward step of one sequence."""

MODES = ("plain", "hf_ckpt", "hf_ckpt_sync", "fsdp_hf_ckpt", "fsdp_hf_ckpt_sync")


def build(torch: Any, args: argparse.Namespace, mode: str) -> tuple[Any, list[int]]:
    """The model for one mode, and a one-element counter of the syncs it makes."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=args.hidden, intermediate_size=args.ffn,
                         num_attention_heads=args.heads, num_key_value_heads=args.heads,
                         num_hidden_layers=args.layers, vocab_size=args.vocab,
                         max_position_embeddings=max(args.seq), attn_implementation="sdpa")
    dtype = torch.float16 if args.device != "cpu" else torch.float32
    torch.manual_seed(0)
    with torch.device(args.device):
        model = LlamaForCausalLM(config).to(dtype)
    model.config.use_cache = False
    syncs = [0]
    if mode.endswith("_sync"):
        def sync(*_: Any) -> None:
            syncs[0] += 1
            if args.device != "cpu":
                torch.cuda.synchronize()

        for layer in model.model.layers:
            layer.self_attn.register_forward_pre_hook(sync)
            layer.self_attn.register_forward_hook(sync)
            layer.self_attn.o_proj.register_full_backward_pre_hook(sync)
            layer.self_attn.q_proj.register_full_backward_hook(sync)
    if "ckpt" in mode:
        model.gradient_checkpointing_enable()
    if mode.startswith("fsdp"):
        import functools

        from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy
        from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer

        policy = functools.partial(transformer_auto_wrap_policy,
                                   transformer_layer_cls={LlamaDecoderLayer})
        model = FullyShardedDataParallel(model, auto_wrap_policy=policy,
                                         sharding_strategy=ShardingStrategy.FULL_SHARD,
                                         device_id=torch.cuda.current_device())
    model.train()
    return model, syncs


def measure(torch: Any, model: Any, seq: int, args: argparse.Namespace,
            syncs: list[int]) -> dict[str, Any]:
    """Wall, host CPU, kernels and kernel time of one forward + backward step."""
    cuda = args.device != "cpu"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    tokens = torch.randint(0, args.vocab, (1, seq), device=args.device)

    def step() -> None:
        model(input_ids=tokens, labels=tokens).loss.backward()
        model.zero_grad(set_to_none=True)

    for _ in range(2):
        step()
    sync()
    syncs[0] = 0
    walls, cpus = timed_steps(step, sync, args.repeats)
    per_step_syncs = syncs[0] // args.repeats
    kernels, kernel_ms = profiled_kernels(torch, step, sync) if cuda else (0, float("nan"))
    if args.cpu_profile is not None:
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with profile(activities=activities) as prof:
            step()
            sync()
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=60)
        args.cpu_profile.mkdir(parents=True, exist_ok=True)
        name = f"cpu_{args.current_mode}_{args.layers}x{seq}.txt"
        (args.cpu_profile / name).write_text(table)
    wall_ms = statistics.median(walls) * 1e3
    return {"kernels": kernels, "wall_ms": round(wall_ms, 3),
            "host_cpu_ms": round(statistics.median(cpus) * 1e3, 3),
            "kernel_ms": round(kernel_ms, 3), "gpu_wait_ms": round(wall_ms - kernel_ms, 3),
            "syncs": per_step_syncs, "error": ""}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu.")
    parser.add_argument("--layers", type=int, default=32, help="Decoder layers (default 32).")
    parser.add_argument("--hidden", type=int, default=4096, help="Hidden size (default 4,096).")
    parser.add_argument("--heads", type=int, default=32, help="Attention heads (default 32).")
    parser.add_argument("--ffn", type=int, default=11008, help="FFN size (default 11,008).")
    parser.add_argument("--vocab", type=int, default=32000, help="Vocabulary (default 32,000).")
    parser.add_argument("--seq", type=int, nargs="+", default=[16, 1024, 2048, 4096],
                        help="Sequence lengths (default 16 1024 2048 4096).")
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES,
                        help="Modes to run (default all).")
    parser.add_argument("--repeats", type=int, default=10, help="Timed steps (default 10).")
    parser.add_argument("--out", type=Path, default=None, help="Append rows to this CSV.")
    parser.add_argument("--cpu-profile", type=Path, default=None,
                        help="Also write each case's torch.profiler table, ops by self CPU "
                             "time, into this folder (cpu_MODE_LAYERSxSEQ.txt).")
    args = parser.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("time_hf_llama_host.py needs PyTorch and transformers.", file=sys.stderr)
        return 1
    if args.device == "cpu":
        args.modes = [m for m in args.modes if not m.startswith("fsdp")]
    elif any(m.startswith("fsdp") for m in args.modes):
        import torch.distributed as dist

        dist.init_process_group("nccl", init_method="tcp://127.0.0.1:29517", rank=0,
                                world_size=1)
    writer = csv.DictWriter(sys.stdout, FIELDS)
    writer.writeheader()
    rows = []
    for mode in args.modes:
        args.current_mode = mode
        try:
            model, syncs = build(torch, args, mode)
        except Exception as exc:  # a mode this torch cannot build is a row, not a stop
            row = {"mode": mode, "layers": args.layers, "hidden": args.hidden, "seq": "",
                   "error": f"{type(exc).__name__}: {exc}"[:300]}
            writer.writerow(row)
            rows.append(row)
            continue
        for seq in args.seq:
            row = {"mode": mode, "layers": args.layers, "hidden": args.hidden, "seq": seq}
            try:
                row |= measure(torch, model, seq, args, syncs)
            except Exception as exc:
                row["error"] = f"{type(exc).__name__}: {exc}"[:300]
            writer.writerow(row)
            sys.stdout.flush()
            rows.append(row)
        del model
        if args.device != "cpu":
            torch.cuda.empty_cache()
    if args.out is not None:
        append_rows(args.out, FIELDS, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
