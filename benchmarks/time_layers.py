"""Time a scenario's model on one GPU in PyTorch eager and print llmsim's prediction beside it.

Run::

    python benchmarks/time_layers.py selene-gpt3             # on the local GPU
    python benchmarks/time_layers.py my-scenario.yaml --layers 4 --set training.seq_len=4096
    python benchmarks/time_layers.py selene-gpt3 --device cpu --layers 1 --shrink 16  # a smoke run
    python benchmarks/time_layers.py MEGREADME-H100-04 --tp 8   # a validation row's rank

The scenario is cut to one device (tp = pp = dp = 1, no ZeRO, one micro-batch of the
scenario's size, the node cut to one device, no recompute, no dropout) and to as many
transformer layers as llmsim's memory model says fit the device (or ``--layers``).
PyTorch runs the same model: token embedding (and learned positions), the layers
(pre-norm attention with causal ``scaled_dot_product_attention``, grouped KV heads where
the model has them, the GELU or SwiGLU MLP), the final norm, the LM head and an FP32
cross-entropy, in the scenario's 16-bit precision (an FP8 scenario runs in BF16 on both
sides: there is no Transformer Engine here). It times the forward and the forward + backward of one
micro-batch (median of ``--repeats`` after a warm-up) and prints them beside llmsim's
forward and forward + backward compute time for the same single-device scenario (the
sum of each pass's compute kernels, llmsim's kernel launches included). PyTorch is not a
dependency of llmsim: ``pip install torch``.

``--shrink N`` divides the hidden size, heads, FFN width and vocabulary by N (for a CPU
smoke run); both sides then run the shrunken model.

``--tp N`` times one tensor-parallel rank's share instead: PyTorch runs the layers with the
heads, KV heads, FFN width and vocabulary divided by N and the hidden size whole (what
Megatron's column- and row-parallel GEMMs leave on a rank, without sequence parallelism),
and llmsim prices the scenario at tp = N on one node and sums the compute kernels of rank 0
(the tensor-parallel collectives run on their own stream and are not counted on either side).

``--ep N`` times one expert-parallel rank's share of a MoE model (tp 1): its attention
whole, and in each MoE layer the router over all experts, the permutation of its own
tokens' ``T·k`` rows, its ``experts/N`` local experts as one grouped GEMM per projection
and the combine (:mod:`time_layers_moe`: the rows a balanced dispatch hands the rank, no
all-to-all). llmsim prices the scenario at ep = N and sums rank 0's compute kernels (the
dispatch and combine all-to-alls, on their own stream, are not counted), its grouped
GEMMs one kernel each (``training.expert_host_loop`` off: no per-expert host loop of
Transformer Engine's ``GroupedLinear``), their rows the busiest rank's (1.3 % above the
mean at 16 ranks). ``--permute gather`` returns the rows to their tokens by gathers
instead of Megatron-Core's unfused atomic adds; ``--profile PATH`` writes a
``torch.profiler`` table of the forward + backward, and llmsim's time by part is printed
(:func:`time_layers_moe.predicted_parts_s`). Multi-head latent attention (DeepSeek-V3) is
not built.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from llmsim import load_scenario, simulate
from llmsim.specs import Scenario

sys.path.insert(0, str(Path(__file__).resolve().parent))
from time_layers_moe import (
    PERMUTES,
    grouped_rows_alignment,
    local_experts,
    moe_mlp,
    predicted_parts_s,
    profile_table,
)

WARMUP = 2
"""Untimed calls before timing (allocator, cuBLAS heuristics, autotuning)."""
HEADROOM = 0.85
"""Share of device memory llmsim's estimate may fill when the layers are cut to fit."""


def single_device(scenario: Scenario, layers: int, shrink: int = 1, tp: int = 1,
                  ep: int = 1) -> Scenario:
    """``scenario`` on one device: tp = pp = dp = 1, ZeRO 0, one micro-batch, ``layers``
    transformer layers, the node cut to one device; sizes divided by ``shrink``. With
    ``tp`` > 1, one node of ``tp`` devices running tensor parallelism alone; with ``ep``
    > 1, ``tp·ep`` devices, the routed experts split over ``ep`` ranks (as the scenario's
    nodes hold them: one node cut to ``tp·ep`` devices, or as many whole nodes)."""
    raw: dict[str, Any] = scenario.model_dump(mode="json", exclude_none=True)
    node = raw["system"]["node"]
    devices = tp * ep
    raw["nodes"] = 1
    if devices > node["devices_per_node"]:  # whole nodes: the all-to-all is not timed
        raw["nodes"] = -(-devices // node["devices_per_node"])
    elif devices > 1:  # the node's fabric cut to the devices used
        tiers: list[dict[str, Any]] = []
        for tier in node.get("fabric", []):
            cut = dict(tier, devices=min(tier["devices"], devices))
            if not tiers or tiers[-1]["devices"] < cut["devices"]:
                tiers.append(cut)
        node.update(devices_per_node=devices, fabric=tiers)
    else:
        node.update(devices_per_node=1, fabric=[])
    par = raw["parallelism"]
    for key in ("first_stage_layers", "last_stage_layers", "tp_overlap_gemms", "expert_tp",
                "moe_max_nodes"):
        par.pop(key, None)
    par.update(moe_dispatcher="alltoall", moe_a2a_overlap=False, moe_comm_units=0,
               moe_shared_expert_overlap=False)
    par.update(tp=tp, pp=1, dp=1, cp=1, ep=ep, zero=0, virtual_stages=1, schedule="1f1b",
               sequence_parallel=False, overlap_tp_comm=False, overlap_param_gather=False,
               recompute="none")
    training = raw["training"]
    training.update(global_batch=par["micro_batch"] * ep, fp8_amax_reduction=False,
                    hidden_dropout=0.0, attention_dropout=0.0)
    if training.get("precision") == "fp8":  # no Transformer Engine on the PyTorch side
        training.update(precision="bf16", fp8_param_gather=False)
    # one torch._grouped_mm per projection, not TE GroupedLinear's per-expert host loop
    training["expert_host_loop"] = False
    model = raw["model"]
    model["layers"] = layers
    if shrink > 1:
        heads = max(1, model["heads"] // shrink)
        kv = model.get("kv_heads")
        model.update(heads=heads, hidden=model["hidden"] // shrink,
                     ffn_hidden=model["ffn_hidden"] // shrink,
                     vocab=max(64, model["vocab"] // shrink))
        if kv:
            model["kv_heads"] = max(1, min(heads, kv // shrink))
        model.pop("head_dim", None)
        if "moe" in model:
            model["moe"]["ffn_hidden"] = max(1, model["moe"]["ffn_hidden"] // shrink)
    return load_scenario(raw)


def layers_that_fit(scenario: Scenario, shrink: int, capacity_gb: float | None,
                    tp: int = 1, ep: int = 1) -> int:
    """The most layers (at most the model's) whose weights, gradients, activations and
    reserve in llmsim's memory model fit ``capacity_gb`` (the accelerator's own memory
    when None) × :data:`HEADROOM`."""
    capacity = capacity_gb or scenario.system.node.accelerator.hbm_gb
    low, high = 1, scenario.model.layers
    while low < high:
        mid = (low + high + 1) // 2
        memory = simulate(single_device(scenario, mid, shrink, tp, ep)).memory[0]
        held = (memory.weights_bytes + memory.grads_bytes + memory.activations_bytes
                + memory.reserve_bytes)  # no optimizer state: the benchmark takes no step
        if held <= HEADROOM * capacity * 1e9:
            low = mid
        else:
            high = mid - 1
    return low


def predicted_s(scenario: Scenario) -> tuple[float, float]:
    """llmsim's forward and forward + backward compute time of the one micro-batch on
    device 0, s."""
    df = simulate(scenario).to_dataframe()
    rank0 = df[(df["stream"] == "compute") & (df["device"] == 0)]
    by_phase = rank0.groupby("kind")["duration_s"].sum()
    forward = float(by_phase.get("F", 0.0))
    backward = float(sum(by_phase.get(p, 0.0) for p in ("R", "B", "W")))
    return forward, forward + backward


def build_model(torch: Any, scenario: Scenario, device: str, dtype: Any,
                align_rows: int = 1, permute: str = "scatter") -> Any:
    """The scenario's model as a PyTorch module that returns the loss of a batch: one
    tensor-parallel rank's share of it where the scenario's tp > 1, one expert-parallel
    rank's experts in its MoE layers (:func:`time_layers_moe.moe_mlp`)."""
    nn, F = torch.nn, torch.nn.functional
    m, tp, ep = scenario.model, scenario.parallelism.tp, scenario.parallelism.ep
    h, d = m.hidden, m.head_dim
    heads, kv = m.heads // tp, max(1, m.n_kv_heads // tp)
    ffn, vocab = m.ffn_hidden // tp, -(-m.vocab // tp)
    norm = (lambda: nn.LayerNorm(h)) if m.norm == "layernorm" else (lambda: nn.RMSNorm(h))
    up_width = 2 * ffn if m.activation == "swiglu" else ffn

    class Layer(nn.Module):
        def __init__(self, index: int) -> None:
            super().__init__()
            self.ln1, self.ln2 = norm(), norm()
            self.qkv = nn.Linear(h, (heads + 2 * kv) * d, bias=m.bias)
            self.proj = nn.Linear(heads * d, h, bias=m.bias)
            self.moe = (moe_mlp(torch, m, ep, align_rows, grouped_mm=device != "cpu",
                                permute=permute)
                        if m.moe is not None and m.moe.is_moe_layer(index) else None)
            if self.moe is None:
                self.up = nn.Linear(h, up_width, bias=m.bias)
                self.down = nn.Linear(ffn, h, bias=m.bias)

        def forward(self, x: Any) -> Any:
            b, s, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).split([heads * d, kv * d, kv * d], dim=-1)
            q = q.view(b, s, heads, d).transpose(1, 2)
            k = k.view(b, s, kv, d).transpose(1, 2)
            v = v.view(b, s, kv, d).transpose(1, 2)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                               enable_gqa=kv != heads)
            x = x + self.proj(a.transpose(1, 2).reshape(b, s, heads * d))
            if self.moe is not None:
                return x + self.moe(self.ln2(x).view(b * s, h)).view(b, s, h)
            u = self.up(self.ln2(x))
            if m.activation == "swiglu":
                gate, lin = u.chunk(2, dim=-1)
                u = F.silu(gate) * lin
            else:
                u = F.gelu(u)
            return x + self.down(u)

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(vocab, h)
            self.pos = (nn.Embedding(scenario.training.seq_len, h)
                        if m.position_embedding == "learned" else None)
            self.layers = nn.ModuleList(Layer(i) for i in range(m.layers))
            self.norm = norm()
            self.head = nn.Linear(h, vocab, bias=False)

        def forward(self, tokens: Any) -> Any:
            x = self.embed(tokens % vocab)
            if self.pos is not None:
                x = x + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
            for layer in self.layers:
                x = layer(x)
            logits = self.head(self.norm(x)).float()
            return F.cross_entropy(logits.view(-1, vocab), tokens.view(-1) % vocab)

    return Model().to(device=device, dtype=dtype)


def time_model(torch: Any, scenario: Scenario, device: str, repeats: int,
               profile: str | None = None, permute: str = "scatter") -> tuple[float, float]:
    """Median forward and forward + backward time of one micro-batch in PyTorch eager, s;
    with ``profile``, a ``torch.profiler`` table of the forward + backward written there
    (:func:`time_layers_moe.profile_table`) after the timing."""
    dtype = torch.bfloat16 if scenario.training.precision in ("bf16", "fp8") else (
        torch.float16 if scenario.training.precision == "fp16" else torch.float32)
    align = (grouped_rows_alignment(torch)
             if device != "cpu" and scenario.model.moe is not None else 1)
    if align > 1:
        print(f"torch._grouped_mm needs groups of {align} rows here: each expert's rows padded")
    model = build_model(torch, scenario, device, dtype, align, permute)
    b, s = scenario.parallelism.micro_batch, scenario.training.seq_len
    tokens = torch.randint(0, scenario.model.vocab, (b, s), device=device)
    sync = torch.cuda.synchronize if device != "cpu" else (lambda: None)

    def forward() -> None:
        with torch.no_grad():
            model(tokens)

    def forward_backward() -> None:
        model(tokens).backward()
        model.zero_grad(set_to_none=True)

    times = []
    for step in (forward, forward_backward):
        for _ in range(WARMUP):
            step()
        sync()
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            step()
            sync()
            samples.append(time.perf_counter() - start)
        times.append(statistics.median(samples))
    if profile:
        profile_table(torch, forward_backward, profile, sync)
    return times[0], times[1]


def resolve(name: str, overrides: list[str]) -> Scenario:
    """A scenario file or catalog name, or a validation row's id (its scenario as
    ``llmsim validate`` builds it), with ``overrides`` applied."""
    from llmsim.validation import load_runs, scenario_for

    runs = {run.id: run for run in load_runs()}
    if name in runs:
        row = scenario_for(runs[name]).model_dump(mode="json", exclude_none=True)
        return load_scenario(row, overrides)
    return load_scenario(name, overrides)


def import_torch_for(device: str) -> Any:
    """PyTorch, able to run on ``device`` (cuda or cpu), or None after one sentence saying
    what is missing."""
    try:
        import torch
    except ImportError:
        print("PyTorch is not installed; `pip install torch` to run this benchmark")
        return None
    if device != "cpu" and not torch.cuda.is_available():
        print("no CUDA device is visible; run on a GPU node, or pass --device cpu to try it")
        return None
    return torch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scenario",
                        help="Scenario file, catalog name or validation row id.")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="Override a scenario field (repeatable).")
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu.")
    parser.add_argument("--layers", type=int, default=None,
                        help="Transformer layers to run (default: as many as fit).")
    parser.add_argument("--shrink", type=int, default=1,
                        help="Divide hidden, heads, FFN and vocabulary by N (smoke runs).")
    parser.add_argument("--repeats", type=int, default=5, help="Timed calls per pass.")
    parser.add_argument("--tp", type=int, default=1,
                        help="Time one rank of N-way tensor parallelism (default 1).")
    parser.add_argument("--ep", type=int, default=1,
                        help="Time one rank of N-way expert parallelism (default 1).")
    parser.add_argument("--permute", choices=PERMUTES, default="scatter",
                        help="MoE rows back to their tokens by atomic adds (Megatron-Core's "
                             "unfused default) or by gathers (as fused kernels do).")
    parser.add_argument("--profile", metavar="PATH", default=None,
                        help="Write a torch.profiler table of the forward+backward to PATH.")
    args = parser.parse_args(argv)
    scenario = resolve(args.scenario, args.overrides)
    try:
        local_experts(scenario.model, args.ep)
        if scenario.model.moe is not None and args.tp > 1:
            raise ValueError(f"--tp {args.tp}: a MoE model's rank is built for tp 1 only; "
                             "use --tp 1 with --ep")
    except ValueError as err:
        print(err)
        return 2
    torch = import_torch_for(args.device)
    if torch is None:
        return 1
    capacity_gb = (torch.cuda.get_device_properties(0).total_memory / 1e9
                   if args.device != "cpu" else None)
    layers = args.layers or layers_that_fit(scenario, args.shrink, capacity_gb, args.tp,
                                            args.ep)
    one = single_device(scenario, layers, args.shrink, args.tp, args.ep)
    where = torch.cuda.get_device_name() if args.device != "cpu" else "CPU"
    moe_note = f", permute {args.permute}" if one.model.moe is not None else ""
    print(f"{one.model.name}: {layers} of {scenario.model.layers} layers, micro-batch "
          f"{one.parallelism.micro_batch} x {one.training.seq_len} tokens, tp {args.tp} "
          f"ep {args.ep} (one rank's share){moe_note}, on {where} "
          f"(PyTorch {torch.__version__}); llmsim prices it on {one.system.node.accelerator.name}")
    measured = time_model(torch, one, args.device, args.repeats, args.profile, args.permute)
    predicted = predicted_s(one)
    print(f"{'pass':<18}{'PyTorch ms':>12}{'llmsim ms':>12}{'llmsim/PyTorch':>16}")
    for name, t_meas, t_pred in zip(("forward", "forward+backward"), measured, predicted,
                                    strict=True):
        print(f"{name:<18}{t_meas * 1e3:>12.3f}{t_pred * 1e3:>12.3f}{t_pred / t_meas:>16.3f}")
    if one.model.moe is not None:
        print(f"llmsim by part, ms{'forward':>16}{'fwd+bwd':>12}")
        for part, (fwd, both) in predicted_parts_s(one).items():
            print(f"  {part:<20}{fwd * 1e3:>14.3f}{both * 1e3:>12.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
