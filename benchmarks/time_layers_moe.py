"""The mixture-of-experts MLP of ``time_layers.py``'s PyTorch model, and the per-part view
of one layer on both sides (a ``torch.profiler`` table by op, llmsim's ops by name).

One expert-parallel rank's MoE MLP, as Megatron-Core's ``MoELayer`` with the ``alltoall``
dispatcher runs it without the all-to-alls (Megatron-LM ``megatron/core/transformer/moe/``:
``router.py``, ``moe_utils.py`` ``permute``/``unpermute``, ``experts.py``
``GroupedMLP``), in eager PyTorch:

router
    a linear layer (h → experts, no bias) in the model's dtype, its logits in FP32, the
    score function (softmax, or a sigmoid with a per-expert selection bias for the
    ``sigmoid`` router), top-k, the k probabilities normalised to sum to 1.
permutation
    the rank's ``T·k`` (token, expert) assignments sorted by expert (``argsort``, stable)
    and the token rows gathered into that order (``index_select``). With ``permute``
    ``scatter`` its backward is an ``index_add_`` of the row gradients into their tokens
    (atomic adds), as Megatron-Core's unfused ``permute`` (``--moe-permute-fusion`` off,
    its default) runs; with ``gather`` each token's ``k`` row gradients are gathered
    through the inverse permutation and summed, no atomics, as Transformer Engine's fused
    ``moe_permute``/``moe_unpermute`` kernels work from a row-id map.
experts
    one grouped GEMM per projection over the rank's local experts
    (``torch._grouped_mm`` on CUDA, the kernel ``benchmarks/time_grouped_gemms.py`` timed
    for the catalog; a per-expert loop of matrix products on other devices), SwiGLU or
    GELU between them.
unpermute and combine
    ``scatter``: each row's output weighted by its probability and added into its token
    (``index_add``, atomic; Megatron-Core's unfused ``unpermute`` runs ``scatter_add_``);
    ``gather``: the rows put back in token order by the inverse permutation and each
    token's ``k`` rows summed with their weights (``bmm``).
shared experts
    a dense MLP of ``shared_experts·ffn_hidden`` width on every token.

With ``ep`` ranks the rank holds ``experts/ep`` experts and computes the ``T·k`` rows a
balanced dispatch hands it (its own tokens' assignments, each expert id taken modulo the
local experts: the rows another rank would send it in place of the ones it sends away).
Nothing is exchanged: llmsim's all-to-alls run on their own stream and are not counted
on its side either. Megatron's second sort after the dispatch (``sort_chunks_by_idxs``,
the received rows into local-expert order) is not run: the rows are sorted once.
MLA (DeepSeek-V3's attention) is not modelled here: a model with ``mla`` is refused.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path
from typing import Any

from llmsim import simulate
from llmsim.specs import Model, Scenario

PARTS = {
    "attention": ("qkv", "attn", "attn_proj", "rope"),
    "norms": ("ln1", "ln2", "final_norm"),
    "router": ("router", "router_topk", "moe_router_kernels"),
    "permute": ("moe_permute",),
    "expert_gemms": ("expert_up", "expert_down"),
    "expert_act": ("expert_act",),
    "unpermute_combine": ("moe_unpermute",),
    "shared_experts": ("shared_up", "shared_down", "shared_act", "shared_add"),
    "residuals": ("residual1", "residual2", "input_grad_sum", "moe_input_grad_sum"),
    "head_loss": ("embed", "embed_dense_grad", "embed_grad_accum", "lm_head", "loss"),
}
"""llmsim's compute ops of a layer (and the model's ends) by part: an op belongs to the
part of its name with ``_bwd``, ``_dx`` or ``_dw`` taken off."""


def part_of(op: str) -> str:
    """The :data:`PARTS` key of llmsim op ``op`` (``other`` for an op in none)."""
    base = op
    for suffix in ("_bwd", "_dx", "_dw"):
        base = base.removesuffix(suffix)
    for part, names in PARTS.items():
        if base in names:
            return part
    return "other"


def predicted_parts_s(scenario: Scenario) -> dict[str, tuple[float, float]]:
    """llmsim's compute time of device 0 by part (:data:`PARTS`): (forward, forward +
    backward), s, for the scenario's one micro-batch; the optimizer step left out."""
    df = simulate(scenario).to_dataframe()
    rank0 = df[(df["stream"] == "compute") & (df["device"] == 0) & (df["kind"] != "O")]
    parts: dict[str, list[float]] = {}
    for (kind, name), seconds in rank0.groupby(["kind", "name"])["duration_s"].sum().items():
        entry = parts.setdefault(part_of(str(name)), [0.0, 0.0])
        if kind == "F":
            entry[0] += float(seconds)
        entry[1] += float(seconds)
    return {part: (f, both) for part, (f, both) in sorted(parts.items())}


def predicted_layer_parts_us(more: Scenario, fewer: Scenario) -> dict[str, tuple[float, float]]:
    """llmsim's (forward, forward + backward) of one layer by part, µs: the difference of
    two scenarios that differ only in their layers (``more`` less ``fewer``), per layer;
    ``head_loss`` is the model's ends, per call (``fewer``'s)."""
    layers = more.model.layers - fewer.model.layers
    high, low = predicted_parts_s(more), predicted_parts_s(fewer)
    parts = {p: ((f - low.get(p, (0.0, 0.0))[0]) / layers * 1e6,
                 (b - low.get(p, (0.0, 0.0))[1]) / layers * 1e6)
             for p, (f, b) in high.items() if p != "head_loss"}
    if "head_loss" in low:
        parts["head_loss"] = (low["head_loss"][0] * 1e6, low["head_loss"][1] * 1e6)
    return parts


def local_experts(model: Model, ep: int) -> int:
    """Routed experts on one of ``ep`` ranks, refused in one sentence where ``ep`` does
    not divide them or the model is one this benchmark does not build."""
    if model.mla is not None:
        raise ValueError(f"model {model.name}: multi-head latent attention (model.mla) is "
                         "not built by time_layers.py; time a model without it")
    if model.moe is None:
        if ep > 1:
            raise ValueError(f"--ep {ep}: model {model.name} has no experts; use --ep 1")
        return 0
    if model.moe.experts % ep:
        raise ValueError(f"--ep {ep} does not divide the {model.moe.experts} experts of "
                         f"{model.name}; choose a divisor")
    return model.moe.experts // ep


PERMUTES = ("scatter", "gather")
"""How rows return to their tokens (module docstring): atomic adds, or gathers through
the inverse permutation."""


def moe_mlp(torch: Any, model: Model, ep: int, align_rows: int = 1,
            grouped_mm: bool = False, permute: str = "scatter") -> Any:
    """One expert-parallel rank's MoE MLP as a module taking ``(T, h)`` rows (module
    docstring). ``align_rows`` > 1 pads each expert's rows to a multiple of it, where the
    grouped GEMM needs aligned groups; ``grouped_mm``: the experts as
    ``torch._grouped_mm`` (CUDA), else a loop of one matrix product per expert."""
    nn, F = torch.nn, torch.nn.functional
    moe = model.moe
    assert moe is not None
    h, f, k, experts = model.hidden, moe.ffn_hidden, moe.top_k, moe.experts
    local = local_experts(model, ep)
    dispatch, reorder = _gather_functions(torch)
    swiglu = model.activation == "swiglu"
    up_n = 2 * f if swiglu else f

    def act(u: Any) -> Any:
        if swiglu:
            gate, lin = u.chunk(2, dim=-1)
            return F.silu(gate) * lin
        return F.gelu(u)

    def grouped(x: Any, w: Any, groups: Any) -> Any:
        if grouped_mm:  # w: [E, n, k] as nn.Linear stores it; the kernel takes [E, k, n]
            return torch._grouped_mm(x, w.transpose(-2, -1), offs=groups)
        return torch.cat([part @ w[e].t() for e, part in enumerate(x.split(groups))])

    class MoeMlp(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.router = nn.Linear(h, experts, bias=False)
            self.w_up = nn.Parameter(torch.randn(local, up_n, h) * h ** -0.5)
            self.w_down = nn.Parameter(torch.randn(local, h, f) * f ** -0.5)
            self.register_buffer("bias", torch.zeros(experts), persistent=False)
            width = moe.shared_experts * f
            self.shared = (nn.Sequential(nn.Linear(h, 2 * width if swiglu else width,
                                                   bias=False), _Act(act),
                                         nn.Linear(width, h, bias=False))
                           if width else None)

        def forward(self, x: Any) -> Any:
            rec = torch.profiler.record_function
            tokens = x.shape[0]
            with rec("moe.router"):
                logits = self.router(x).float()
                if moe.router == "sigmoid":
                    scores = torch.sigmoid(logits)
                    _, chosen = torch.topk(scores + self.bias, k, dim=-1)
                    probs = scores.gather(-1, chosen)
                else:
                    probs, chosen = torch.topk(torch.softmax(logits, dim=-1), k, dim=-1)
                probs = probs / probs.sum(dim=-1, keepdim=True)
            with rec("moe.permute"):
                expert = (chosen % local).flatten()
                order = torch.argsort(expert, stable=True)
                token = order // k
                counts_t = torch.bincount(expert, minlength=local)
                if permute == "gather":
                    inverse = torch.empty_like(order).scatter_(
                        0, order, torch.arange(order.numel(), device=x.device))
                    rows = dispatch.apply(x, token, inverse, k)
                else:
                    rows = x.index_select(0, token)
                where = None
                if align_rows > 1:  # each expert's rows from a multiple of align_rows
                    padded = (counts_t + align_rows - 1) // align_rows * align_rows
                    starts = torch.cumsum(padded, 0) - padded
                    first = torch.cumsum(counts_t, 0) - counts_t
                    sorted_expert = expert.index_select(0, order)
                    ranked = torch.arange(order.numel(), device=x.device) - first[sorted_expert]
                    where = starts[sorted_expert] + ranked
                    rows = x.new_zeros(int(padded.sum()), h).index_copy(0, where, rows)
                    counts_t = padded
                groups = (torch.cumsum(counts_t, 0).to(torch.int32) if grouped_mm
                          else counts_t.tolist())
            with rec("moe.experts"):
                out = grouped(act(grouped(rows, self.w_up, groups)), self.w_down, groups)
            with rec("moe.combine"):
                if where is not None:
                    out = out.index_select(0, where)
                if permute == "gather":
                    by_token = reorder.apply(out, inverse, order).view(tokens, k, h)
                    y = torch.bmm(probs.to(out.dtype).view(tokens, 1, k), by_token)
                    y = y.view(tokens, h)
                else:
                    weight = probs.flatten().index_select(0, order).unsqueeze(-1)
                    y = x.new_zeros(tokens, h).index_add(0, token, out * weight.to(out.dtype))
            if self.shared is not None:
                with rec("moe.shared"):
                    y = y + self.shared(x)
            return y

    class _Act(nn.Module):
        def __init__(self, fn: Any) -> None:
            super().__init__()
            self.fn = fn

        def forward(self, u: Any) -> Any:
            return self.fn(u)

    return MoeMlp()


def _gather_functions(torch: Any) -> tuple[Any, Any]:
    """Autograd functions of the ``gather`` permutation: the dispatch ``x[token]`` whose
    backward gathers each token's ``k`` row gradients through ``inverse`` and sums them,
    and a permutation ``rows[index]`` whose backward is the inverse permutation."""

    class Dispatch(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any, token: Any, inverse: Any, k: int) -> Any:
            ctx.save_for_backward(inverse)
            ctx.k = k
            return x.index_select(0, token)

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            (inverse,) = ctx.saved_tensors
            by_token = grad.index_select(0, inverse)
            return by_token.view(-1, ctx.k, by_token.shape[-1]).sum(1), None, None, None

    class Reorder(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, rows: Any, index: Any, inverse: Any) -> Any:
            ctx.save_for_backward(inverse)
            return rows.index_select(0, index)

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            (inverse,) = ctx.saved_tensors
            return grad.index_select(0, inverse), None, None

    return Dispatch, Reorder


def grouped_rows_alignment(torch: Any) -> int:
    """1 where ``torch._grouped_mm`` takes groups of any row count on the local GPU, else
    16 (the alignment of its earlier releases): tried once on a small case."""
    x = torch.randn(24, 64, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(2, 64, 64, device="cuda", dtype=torch.bfloat16)
    try:
        torch._grouped_mm(x, w.transpose(-2, -1),
                          offs=torch.tensor([5, 24], device="cuda", dtype=torch.int32))
        torch.cuda.synchronize()
    except RuntimeError:
        return 16
    return 1


PROFILED_CALLS = 3
"""Calls of the forward + backward a :func:`profile_table` holds."""


def profile_table(torch: Any, step: Any, path: str, sync: Any) -> None:
    """Profile :data:`PROFILED_CALLS` calls of ``step`` (after one untimed) with
    ``torch.profiler`` and write its table by op and input shape (self device time, device
    total, calls) to ``path``, and the same as CSV beside it (``path`` + ``.csv``)."""
    from torch.profiler import ProfilerActivity, profile

    step()
    sync()
    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities, record_shapes=True) as prof:
        for _ in range(PROFILED_CALLS):
            step()
        sync()
    events = prof.key_averages(group_by_input_shape=True)
    sort = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
    with open(path, "w") as out:
        out.write(events.table(sort_by=sort, row_limit=120, max_name_column_width=70))
    with open(path + ".csv", "w") as out:
        out.write("name,input_shapes,calls,self_device_us,device_total_us,cpu_total_us\n")
        for e in events:
            shapes = str(e.input_shapes).replace('"', "'")
            out.write(f'"{e.key}","{shapes}",{e.count},'
                      f"{getattr(e, 'self_device_time_total', 0.0):.1f},"
                      f"{getattr(e, 'device_time_total', 0.0):.1f},{e.cpu_time_total:.1f}\n")


HEAD_OPS = ("aten::_log_softmax", "aten::_log_softmax_backward_data", "aten::nll_loss_forward",
            "aten::nll_loss_backward", "aten::embedding_dense_backward")
"""Profiled ops of the loss and the embedding's gradient (the model's ends)."""


def profiled_part(name: str, shapes: str, scenario: Scenario) -> str:
    """The part of a MoE layer of ``scenario`` (``time_layers.single_device``'s), or of the
    model's ends (``head_loss``), that profiled op ``name`` with input ``shapes`` ran for;
    the parts of :data:`PARTS`, and ``atomic_adds``, ``row_gathers`` and ``combine`` for
    the eager permutation's kernels. Told apart by the op and its tensors' sizes."""
    m = scenario.model
    assert m.moe is not None
    t, h, e = scenario.parallelism.micro_batch * scenario.training.seq_len, m.hidden, m.moe.experts
    rows, k, f = t * m.moe.top_k, m.moe.top_k, m.moe.ffn_hidden
    if re.search(rf"\b{m.vocab}\b", shapes) or name in HEAD_OPS or shapes in (
            f"[[1, {t}], []]", f"[[{t}], []]"):
        return "head_loss"
    if name.startswith("aten::_cudnn_attention") or name.startswith("aten::_scaled_dot"):
        return "attention"
    if name == "aten::mm":  # the router's GEMMs have the experts as one dimension
        sizes = [int(x) for x in re.findall(r"\d+", shapes)]
        return "router" if sizes.count(e) == 1 else "attention"
    if "norm" in name:
        return "norms"
    if name == "aten::_grouped_mm":
        return "expert_gemms"
    if name in ("aten::silu", "aten::silu_backward", "aten::gelu", "aten::gelu_backward",
                "aten::cat") or (name == "aten::mul" and f"[{rows}, {f}]" in shapes):
        return "expert_act"
    if name in ("aten::add", "aten::add_") and f"{t}, {h}], [" in shapes:
        return "residuals"
    if name in ("aten::index_add", "aten::index_add_") and f"[{rows}, {h}]" in shapes:
        return "atomic_adds"
    if name == "aten::bmm" or (name in ("aten::mul", "aten::sum") and f"[{rows}, {h}]" in shapes):
        return "combine"
    if name == "aten::gather" and f"[{rows}, {h}]" in shapes:
        return "row_gathers"
    if re.search(rf"\[{t}, {e}\]|\[{t}, {k}\]", shapes):
        return "router"
    if name in ("aten::fill_", "aten::copy_") and (f"[{t}, {h}]" in shapes
                                                    or f"[{rows}, 1]" in shapes):
        return "combine"
    return "permute"  # argsort, bincount, cumsum, index arithmetic, the k-row sum


def profiled_parts_us(path: Path, scenario: Scenario) -> dict[str, float]:
    """Kernel time per layer by part (:func:`profiled_part`), µs, of a :func:`profile_table`
    CSV of ``scenario``'s model: each ``aten::`` op's self device time over the profile's
    :data:`PROFILED_CALLS` and the scenario's layers (the head and loss per call)."""
    parts: dict[str, float] = {}
    with path.open() as handle:
        for row in csv.DictReader(handle):
            self_us = float(row["self_device_us"])
            if not row["name"].startswith("aten::") or self_us <= 0:
                continue
            part = profiled_part(row["name"], row["input_shapes"], scenario)
            layers = 1 if part == "head_loss" else scenario.model.layers
            parts[part] = parts.get(part, 0.0) + self_us / (PROFILED_CALLS * layers)
    return parts
