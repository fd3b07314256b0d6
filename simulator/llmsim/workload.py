"""Workload graph: the ordered ops of one training step, per pipeline stage and chunk.

Every micro-batch of a chunk runs the same ops, so a chunk is described once by its
forward (F), input-gradient (B), weight-gradient (W) and recompute (R) op lists; the
schedule says in which order the micro-batches run them. Sizes are per device: matrices
are divided by the tensor-parallel degree ``t``. Shapes follow Megatron-LM's layer
(Shoeybi et al. 2019, Fig. 3; Narayanan et al. 2021 §3.1; Korthikanti et al. 2022 §4).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Literal

from llmsim.context import apply_context_parallel
from llmsim.memory import DROPOUT_MASK_BYTES
from llmsim.mla import apply_mla
from llmsim.moe import replace_mlp
from llmsim.ops import CommOp, ComputeOp
from llmsim.optimizer import (
    DTYPE_BYTES,
    grad_accumulation_bytes_per_param,
    grad_bytes_per_param,
    optimizer_step,
)
from llmsim.params import (
    embedding_params_per_device,
    head_params_per_device,
    layers_params_per_device,
    param_tensors,
)
from llmsim.partition import chunk_first_layer, chunk_layers
from llmsim.specs import Model, Parallelism, Training
from llmsim.specs.parallelism import TpOverlapGemm, TpOverlapGemmName

if TYPE_CHECKING:
    import pandas as pd

Op = ComputeOp | CommOp

EXTRA_OP_PREFIXES = ("embed", "final_norm", "head_", "lm_head", "loss")
"""Name prefixes of the ops outside the transformer blocks (first and last stage only)."""

_TE_DEFAULT_METHOD: dict[str, Literal["ring_exchange", "pipeline", "bulk"]] = {
    "qkv_fprop": "ring_exchange", "fc1_fprop": "ring_exchange",
    "proj_dgrad": "ring_exchange", "fc2_dgrad": "ring_exchange",
    "proj_fprop": "pipeline", "fc2_fprop": "pipeline",
    "qkv_dgrad": "bulk", "qkv_wgrad": "bulk", "fc1_dgrad": "bulk", "fc1_wgrad": "bulk",
}
"""Transformer Engine's default overlap method per GEMM (``initialize_ub``)."""


@dataclass(frozen=True)
class Chunk:
    """The layers one pipeline stage runs for one model chunk (virtual stage)."""

    stage: int
    chunk: int
    virtual_stage: int
    layers: int
    first: bool
    """Holds the embedding (first virtual stage)."""
    last: bool
    """Holds the final norm, LM head and loss (last virtual stage)."""
    params: int
    """Parameters of this chunk on one device (after the tensor-parallel split)."""
    forward: tuple[Op, ...]
    backward: tuple[Op, ...]
    """Input-gradient ops, recompute ops (phase R) first."""
    weight: tuple[Op, ...]
    accumulate: tuple[Op, ...] = ()
    """After ``weight``: the kernels that add this micro-batch's weight gradients to the
    gradient buffer (``training.grad_accumulation``), on the micro-batches from
    :attr:`Workload.accumulate_from_microbatch` on."""
    expert_params: int = 0
    """Of ``params``, the routed experts' (reduced over their own group)."""

    @property
    def ops(self) -> tuple[Op, ...]:
        """Every op of one micro-batch's passes (the gradient accumulation included)."""
        return self.forward + self.backward + self.weight + self.accumulate

    @property
    def units(self) -> int:
        """Blocks whose weights are gathered one at a time (ZeRO-3, or the overlapped
        ZeRO-1/2 gather): its layers, or one for a chunk that holds only the embedding or
        the LM head."""
        return max(self.layers, 1)


@dataclass(frozen=True)
class Workload:
    """One step: chunk op lists, pipeline message size, DP/ZeRO traffic, optimizer."""

    chunks: dict[tuple[int, int], Chunk]
    """(stage, chunk) → Chunk."""
    microbatches: int
    pp_message_bytes: float
    """Bytes of one activation (or gradient) message between pipeline stages."""
    grad_bytes_per_param: int
    param_bytes_per_param: int
    zero: int
    dp: int
    tp: int
    bucket_bytes: float
    pp_gather_bytes: float = 0.0
    """With ``parallelism.pp_scatter_gather``: bytes of the all-gather over the tensor-
    parallel group that rebuilds each received message from its slices (0: none)."""
    pp_regather_output: bool = False
    """``pp_scatter_gather: deepspeed``: a stage that sent an output keeps only its slice and
    all-gathers it back before that micro-batch's backward."""
    overlap_param_gather: bool = False
    """ZeRO-1/2: the updated weights are gathered during the next step's first forward
    (Megatron-LM ``--overlap-param-gather``), not after the optimizer."""
    grad_all_reduce: bool = False
    """Gradients reduced through a flattened, scaled copy of each bucket, copied back, with
    ZeRO-1/2/3 by a full all-reduce (``parallelism.grad_all_reduce``)."""
    grad_bucket_nan_check: bool = False
    """Each gradient bucket checked for NaN before its reduction
    (``parallelism.grad_bucket_nan_check``)."""
    grad_bucket_prescale: bool = False
    """Each gradient bucket scaled by 1/dp before its reduction
    (``parallelism.grad_bucket_prescale``)."""
    regather_for_recompute: bool = False
    """ZeRO-3 with full recompute: each backward layer is gathered for its recompute and
    again for its backward (``parallelism.regather_for_recompute``)."""
    gather_messages: int = 1
    """All-gathers per gathered layer, back to back: 1 (one per block), or one per weight
    matrix with ``parallelism.gather_per_module``."""
    gather_copies: int = 0
    """Per-rank slice copies after each ZeRO-3 all-gather (``parallelism.tensor_list_gathers``:
    one per data-parallel rank)."""
    gather_fill_passes: int = 0
    """Zero-fills of the gathered buffer before each ZeRO-3 all-gather
    (``parallelism.tensor_list_gathers``: DeepSpeed 2021 allocates it with ``torch.zeros``)."""
    gather_host_s: float = 0.0
    """Host time before each ZeRO-3 all-gather, seconds (``parallelism.tensor_list_gathers``:
    the tensor-list loop over the ranks, ``tensor_list_host_us_per_rank`` each, and the
    call's own ``tensor_list_host_us_per_call``)."""
    optimizer: dict[int, ComputeOp] = field(default_factory=dict)
    """Stage → optimizer step over the local shard."""
    accumulate_from_microbatch: int = 0
    """First micro-batch whose gradients are added to the buffer by :attr:`Chunk.accumulate`
    (1 when the first one's gradients are the buffer: PyTorch's ``param.grad``)."""
    embedding_grad_allreduce: CommOp | None = None
    """Tied embeddings with ``pp > 1``: the first and the last stage each hold a copy of
    the word embedding and all-reduce its gradient before the optimizer step."""
    ep: int = 1
    """Expert-parallel degree: the ep ranks hold different sequences (more replicas of the
    dense weights) and different routed experts."""
    cp: int = 1
    """Context-parallel degree: the cp ranks hold parts of the same sequences."""

    @property
    def grad_groups(self) -> tuple[tuple[str, int], tuple[str, int]]:
        """((axis, ranks) of the dense weights' gradient and ZeRO group, the same for the
        routed experts'): dp·ep·cp and dp·cp ranks (Megatron-Core's data-parallel group
        with context parallelism, and its expert-data-parallel group); plain ``dp`` when
        ep = cp = 1."""
        if self.ep == 1 and self.cp == 1:
            return ("dp", self.dp), ("dp", self.dp)
        return ("cp+ep+dp", self.dp * self.ep * self.cp), ("cp+dp", self.dp * self.cp)

    @property
    def grad_ranks(self) -> int:
        """Ranks of the widest gradient group (dp when ep = cp = 1): above 1, the step
        reduces gradients over the network."""
        return self.grad_groups[0][1]

    @property
    def stages(self) -> int:
        """Pipeline stages."""
        return 1 + max(s for s, _ in self.chunks)

    @property
    def chunks_per_stage(self) -> int:
        """Model chunks per stage (virtual stages)."""
        return 1 + max(c for _, c in self.chunks)

    def stage_params(self, stage: int) -> int:
        """Parameters on one device of ``stage``."""
        return sum(c.params for (s, _), c in self.chunks.items() if s == stage)

    def dp_grad_buckets(self, chunk: Chunk) -> list[tuple[int, CommOp]]:
        """The gradient reduction of one chunk as groups of equal buckets: (count, the
        first bucket) for the dense weights (over their group, :attr:`grad_groups`), then,
        with expert parallelism, the routed experts' (over theirs); the ops of
        :meth:`dp_grad_ops` differ within a group only in their names."""
        (dense_axis, dense_ranks), (expert_axis, expert_ranks) = self.grad_groups
        if dense_axis == expert_axis:
            parts = [(dense_axis, dense_ranks, chunk.params, "")]
        else:
            parts = [(dense_axis, dense_ranks, chunk.params - chunk.expert_params, ""),
                     (expert_axis, expert_ranks, chunk.expert_params, "_experts")]
        all_reduce = self.zero == 0 or self.grad_all_reduce
        kind = "all_reduce" if all_reduce else "reduce_scatter"
        # DeepSpeed's allreduce_and_copy, Megatron's local DDP without contiguous buffers:
        # flatten the bucket, scale it, copy it back.
        staging = 3 if self.grad_all_reduce else 0
        groups = []
        for axis, ranks, params, tag in parts:
            if ranks == 1 or params == 0:
                continue
            total = params * self.grad_bytes_per_param
            buckets = max(1, math.ceil(total / self.bucket_bytes))
            groups.append((buckets, CommOp(
                f"dp_{'ar' if all_reduce else 'rs'}{tag}_c{chunk.virtual_stage}_b0", kind,
                axis, "W", total / buckets, staging_passes=staging)))
        return groups

    def dp_grad_ops(self, chunk: Chunk) -> list[CommOp]:
        """The bucketed gradient reduction of one chunk, last layer's bucket first; with
        expert parallelism the dense weights' buckets, then the routed experts'."""
        ops = []
        for count, first in self.dp_grad_buckets(chunk):
            stem = first.name.removesuffix("_b0")
            ops += [replace(first, name=f"{stem}_b{i}") for i in range(count)]
        return ops

    def grad_sync_prep(self, bucket: CommOp) -> tuple[ComputeOp, ...]:
        """Kernels the compute stream runs on a gradient bucket before its reduction.

        Megatron-Core's DDP (``start_grad_sync`` of its gradient buckets, 2024) first takes
        the L2 norm of the bucket and asserts it is not NaN: the norm reads the bucket,
        ``isnan`` and the copy of the flag to the host are two more kernels, and the host
        waits for the flag before it queues anything else, so none of the three launches
        hides behind the previous kernel. It then multiplies the bucket in place by its
        ``gradient_scaling_factor``, 1/dp (reads and writes it), and only then issues the
        collective.
        """
        ops = []
        if self.grad_bucket_nan_check:
            ops.append(ComputeOp("dp_grad_nan_check", "memory", "W", 0.0, bucket.bytes,
                                 splits=3))
        if self.grad_bucket_prescale:
            ops.append(ComputeOp("dp_grad_prescale", "memory", "W", 0.0, 2 * bucket.bytes))
        return tuple(ops)

    def dp_param_gather(self, stage: int) -> CommOp | None:
        """ZeRO-1/2 (distributed optimizer): all-gather the updated weights after the step
        (None when that gather overlaps the next step's forward instead); with expert
        parallelism the dense weights' (see :meth:`dp_param_gathers`)."""
        gathers = self.dp_param_gathers(stage)
        return gathers[0] if gathers else None

    def dp_param_gathers(self, stage: int) -> list[CommOp]:
        """ZeRO-1/2's weight all-gathers after the step: one over each group whose ranks
        shard weights of this stage (:attr:`grad_groups`), the dense weights' first."""
        if self.zero not in (1, 2) or self.overlap_param_gather:
            return []
        expert = sum(c.expert_params for (s, _), c in self.chunks.items() if s == stage)
        total = self.stage_params(stage)
        (dense_axis, dense_ranks), (expert_axis, expert_ranks) = self.grad_groups
        parts = ([("dp_ag_params", dense_axis, dense_ranks, total)]
                 if dense_axis == expert_axis else
                 [("dp_ag_params", dense_axis, dense_ranks, total - expert),
                  ("dp_ag_params_experts", expert_axis, expert_ranks, expert)])
        return [CommOp(name, "all_gather", axis, "O", params * self.param_bytes_per_param)
                for name, axis, ranks, params in parts if ranks > 1 and params]

    def gathers_before(self, kind: str, microbatch: int) -> bool:
        """Whether a pass of this kind and micro-batch waits, layer by layer, for
        :meth:`weight_gathers`.

        ZeRO-3: every forward and backward (DeepSpeed ZeRO-3 and PyTorch FSDP fetch the
        weights of one block at a time, before its forward and again before its
        recompute and backward, and free them afterwards). ZeRO-1/2 with
        ``overlap_param_gather``: the first forward of each chunk, which needs the
        weights the last optimizer step updated (Megatron-LM dispatches the next bucket's
        all-gather from the forward pre-hook of the current one).
        """
        if self.dp == 1 or kind == "W":
            return False
        if self.zero == 3:
            return True
        return self.overlap_param_gather and self.zero in (1, 2) and kind == "F" \
            and microbatch == 0

    def weight_gathers(self, chunk: Chunk) -> list[CommOp]:
        """The per-layer all-gathers of a chunk's weights, in forward order.

        The chunk's weights (the embedding or LM head included on the first and last
        chunk) are split evenly over its layers; each op is one of the layer's
        :attr:`gather_messages` equal all-gathers.
        """
        first = self.weight_gather(chunk)
        if first is None:
            return []
        stem = first.name.removesuffix("_l0")
        return [replace(first, name=f"{stem}_l{i}") for i in range(chunk.units)]

    def weight_gather(self, chunk: Chunk) -> CommOp | None:
        """The first of :meth:`weight_gathers` (they differ only in their names), or None."""
        if self.dp == 1 or not (self.zero == 3 or self.overlap_param_gather):
            return None
        prefix = "z3_ag" if self.zero == 3 else "dp_ag_params"
        nbytes = chunk.params * self.param_bytes_per_param / chunk.units / self.gather_messages
        return CommOp(f"{prefix}_c{chunk.virtual_stage}_l0", "all_gather", "dp", "F",
                      nbytes, copies=self.gather_copies,
                      fill_passes=self.gather_fill_passes, host_s=self.gather_host_s)

    def model_flops(self) -> float:
        """Model FLOPs of one step over all devices (recompute excluded)."""
        return self._flops(include_recompute=False)

    def hardware_flops(self) -> float:
        """FLOPs executed in one step over all devices, recompute included."""
        return self._flops(include_recompute=True)

    def _flops(self, include_recompute: bool) -> float:
        per_replica = 0.0
        for c in self.chunks.values():
            for op in c.ops:
                if isinstance(op, ComputeOp) and (include_recompute or op.phase != "R"):
                    per_replica += op.flops * self.tp
        return per_replica * self.microbatches * self.dp * self.ep * self.cp

    def to_dataframe(self) -> pd.DataFrame:
        """Every op of one micro-batch of every chunk: stage, chunk, phase, op, kind, size."""
        import pandas as pd

        rows = []
        for (stage, chunk), c in sorted(self.chunks.items()):
            for block in (c.forward, c.backward, c.weight + c.accumulate):
                for i, op in enumerate(block):
                    compute = isinstance(op, ComputeOp)
                    rows.append({
                        "stage": stage,
                        "chunk": chunk,
                        "phase": op.phase,
                        "order": i,
                        "op": op.name,
                        "kind": op.kind if compute else op.collective,
                        "axis": None if compute else op.axis,
                        "flops": op.flops if compute else 0.0,
                        "bytes": op.bytes,
                        "mnk": op.mnk if compute else None,
                    })
        return pd.DataFrame(rows)


class _LayerBuilder:
    """Ops of one transformer block and of the first/last-stage extras, for one micro-batch."""

    def __init__(self, model: Model, par: Parallelism, training: Training) -> None:
        self.m, self.par, self.trn = model, par, training
        self.t = par.tp
        # Tokens per micro-batch on this rank (context parallelism holds 1/cp of each).
        self.T = par.micro_batch * training.seq_len // par.cp
        self.e = DTYPE_BYTES[training.precision]
        self.sp = par.sequence_parallel and par.tp > 1
        # Elements of the residual stream (norms, residual adds, dropout) on this device.
        self.stream = self.T * model.hidden / self.t if self.sp else self.T * model.hidden
        self.userbuffers = self.sp and par.overlap_tp_comm
        # Each overlapped GEMM's userbuffers setting: the scenario's, else TE's default.
        self.tp_overlap = {
            name: par.tp_overlap_gemms.get(name) or TpOverlapGemm(
                method=method, num_sm=par.tp_overlap_comm_units,
                num_splits=par.tp_overlap_rs_splits)
            for name, method in _TE_DEFAULT_METHOD.items()} if self.userbuffers else {}
        self.fp8 = training.precision == "fp8"
        # FP8 training (Transformer Engine, 2023) runs only the linear layers in FP8;
        # attention stays in BF16 (Micikevicius et al. 2022, "FP8 Formats for Deep
        # Learning" §4; TE's DotProductAttention of that time has no FP8 path).
        self.attn_dtype = "bf16" if self.fp8 else None
        self.fp8_scaling = training.fp8_scaling

    # -- helpers ---------------------------------------------------------------------
    def _gemm(self, name: str, phase: str, m: int, n: int, k: int, batch: int = 1) -> ComputeOp:
        e = self.e
        return ComputeOp(name, "gemm", phase, 2.0 * m * n * k * batch,
                         float(e * batch * (m * k + k * n + m * n)), (m, n, k), batch)

    def _gemm_grads(self, fwd: ComputeOp) -> tuple[ComputeOp, ComputeOp]:
        """dX = dY·Wᵀ (input gradient, B) and dW = Xᵀ·dY (weight gradient, W)."""
        assert fwd.mnk is not None
        m, n, k = fwd.mnk
        return (self._gemm(f"{fwd.name}_dx", "B", m, k, n, fwd.batch),
                self._gemm(f"{fwd.name}_dw", "W", k, n, m, fwd.batch))

    def _beside_tp_comm(self, gemm: ComputeOp, te_name: TpOverlapGemmName) -> ComputeOp:
        """``gemm`` as Transformer Engine's userbuffers run it beside a TP transfer;
        ``te_name`` is the GEMM's name in TE's configuration.

        TE's defaults (``initialize_ub``): the all-gathers that feed a GEMM (QKV and MLP-up
        forward, the input gradients of the attention output and MLP-down) by ring
        exchange over copy engines, the GEMM cut into ``tp`` chunks of the tokens; the
        forward reduce-scatters (attention output, MLP-down) pipelined with their GEMM in
        ``num_splits`` chunks, by kernels on ``num_sm`` SMs; the backward's transfers
        (the input re-gather for the weight gradient, the reduce-scatter of the QKV and
        MLP-up input gradients) in bulk, beside the whole gradient GEMMs, also on
        ``num_sm`` SMs. ``parallelism.tp_overlap_gemms`` replaces them per GEMM. TE launches
        the chunks of a split GEMM on three streams in turn; ``tp_overlap_concurrent_chunks``
        of them are priced as running at once.
        """
        if not self.userbuffers:
            return gemm
        cfg = self.tp_overlap[te_name]
        together = self.par.tp_overlap_concurrent_chunks
        if cfg.method == "ring_exchange":
            chunks = max(1, self.t // 2) if cfg.aggregate else self.t
            return replace(gemm, splits=chunks, concurrent_splits=together)
        if cfg.method == "pipeline":
            return replace(gemm, splits=cfg.num_splits, concurrent_splits=together,
                           reserved_units=cfg.num_sm)
        return replace(gemm, reserved_units=cfg.num_sm)

    def _mem(self, name: str, phase: str, elements: float, passes: float,
             masks: int = 0) -> ComputeOp:
        """A memory-bound kernel touching ``elements`` values ``passes`` times, and writing
        or reading ``masks`` 1-byte dropout masks of as many elements."""
        return ComputeOp(name, "memory", phase, 0.0,
                         float(elements * (passes * self.e + masks * DROPOUT_MASK_BYTES)))

    def _fp8_cast(self, gemm: ComputeOp, operand: str) -> list[ComputeOp]:
        """FP8 cast-transpose of a linear layer's input (forward) or output gradient.

        Transformer Engine quantises each GEMM operand it does not already hold in FP8:
        it reads the 16-bit tensor and writes the FP8 copy and its transpose (the
        transpose feeds the weight-gradient GEMM): 2 + 1 + 1 bytes per element. With
        ``training.fp8_scaling: current`` an amax kernel reads the tensor first (2 bytes per
        element); with delayed scaling the cast records the amax as it goes.
        """
        if not self.fp8 or gemm.mnk is None:
            return []
        m, n, k = gemm.mnk
        elements = m * (k if operand == "input" else n)
        cast = ComputeOp(f"fp8_cast_{gemm.name}", "memory", gemm.phase, 0.0, 4.0 * elements)
        if self.fp8_scaling == "current":  # the amax of this very tensor: one more read
            return [ComputeOp(f"fp8_amax_{gemm.name}", "memory", gemm.phase, 0.0,
                              2.0 * elements), cast]
        return [cast]

    def _tp_comm(self, name: str, kind: str, phase: str, nbytes: float,
                 pairs_with: Literal["next", "previous"] | None = None) -> list[CommOp]:
        return [CommOp(name, kind, "tp", phase, nbytes, pairs_with)] if self.t > 1 else []

    def _entry(self, name: str, phase: str) -> list[CommOp]:
        """Before a column-parallel GEMM: SP all-gathers the sequence-split input (the
        GEMM it feeds is the next one)."""
        return self._tp_comm(name, "all_gather", phase, self.T * self.m.hidden * self.e,
                             "next") if self.sp else []

    def _exit(self, name: str, phase: str, after_gemm: bool = True) -> list[CommOp]:
        """After a row-parallel GEMM (or the vocab-parallel embedding lookup): all-reduce,
        or reduce-scatter with SP (of the previous GEMM's output). In the backward, after a
        column-parallel layer's input-gradient GEMM, the all-reduce overlaps the layer's
        weight gradient with ``parallelism.async_tp_allreduce``."""
        if self.sp:
            return self._tp_comm(name, "reduce_scatter", phase,
                                 self.T * self.m.hidden * self.e,
                                 "previous" if after_gemm else None)
        if phase == "B" and after_gemm and self.par.async_tp_allreduce:
            # A column-parallel layer's input gradient, all-reduced beside its weight gradient.
            return [replace(op, pairs_with="previous", beside_weight_grad=True)
                    for op in self._tp_comm(name, "all_reduce", phase,
                                            self.T * self.m.hidden * self.e)]
        return self._tp_comm(name, "all_reduce", phase, self.T * self.m.hidden * self.e)

    # -- attention core ---------------------------------------------------------------
    def _attention_forward(self, phase: str) -> list[ComputeOp]:
        m, t, s, b = self.m, self.t, self.trn.seq_len, self.par.micro_batch
        heads = m.heads // t
        d = m.head_dim
        if self.trn.fused_attention:
            # Q·Kᵀ and P·V: 4·b·s²·(heads·d) model FLOPs; causal kernels skip the masked half.
            flops = 4.0 * b * s * s * heads * d
            kv_local = max(1, m.n_kv_heads // t)
            io = self.e * self.T * d * (2 * heads + 2 * kv_local)  # read Q, K, V; write O
            return [ComputeOp("attn", "attention", phase, flops, float(io),
                              executed_fraction=0.5, dtype=self.attn_dtype,
                              attention_shape=(s, d)),
                    *self._attention_layout_copies(phase)]
        # Unfused (Megatron 2020-21): scores GEMM, fused scale-mask-softmax, dropout, context.
        probs = float(b * heads * s * s)
        return [
            replace(self._gemm("attn_scores", phase, s, s, d, b * heads), dtype=self.attn_dtype),
            self._mem("attn_softmax", phase, probs, 2),     # read scores, write probs
            *([self._mem("attn_dropout", phase, probs, 2, masks=1)]  # read, write, mask
              if self.trn.attention_dropout > 0 else []),
            replace(self._gemm("attn_context", phase, s, d, s, b * heads), dtype=self.attn_dtype),
        ]

    def _attention_layout_copies(self, phase: str) -> list[ComputeOp]:
        """Megatron-LM's legacy attention with ``--use-flash-attn`` (2023–24): the kernel
        wants [b, s, heads, d] and the model keeps [s, b, h], so q, k and v are copied
        (``rearrange(x, 's b ... -> b s ...').contiguous()``), and so is the output for a
        micro-batch above one; the backward copies the output gradient and concatenates
        dq, dk, dv back into the fused QKV layout. Each copy reads and writes its tensor.
        """
        if not self.trn.attention_layout_copies:
            return []
        elements = self.T * (self.m.hidden + 2 * self.m.kv_dim) / self.t
        if self.par.micro_batch > 1:  # with b = 1 the output's transpose is a view
            elements += self.T * self.m.hidden / self.t
        name = "attn_layout" if phase in "FR" else "attn_layout_bwd"
        return [self._mem(name, phase, elements, 2)]

    def _attention_backward(self) -> list[ComputeOp]:
        m, t, s, b = self.m, self.t, self.trn.seq_len, self.par.micro_batch
        heads = m.heads // t
        d = m.head_dim
        if self.trn.fused_attention:
            fwd = self._attention_forward("B")[0]
            # Model FLOPs 2× forward; FlashAttention-2 executes 2.5× forward (it recomputes P).
            return [ComputeOp("attn_bwd", "attention", "B", 2 * fwd.flops, 2 * fwd.bytes,
                              executed_fraction=0.5 * 2.5 / 2, dtype=self.attn_dtype,
                              attention_shape=fwd.attention_shape),
                    *self._attention_layout_copies("B")]
        probs = float(b * heads * s * s)
        scores = self._gemm("attn_scores", "B", s, s, d, b * heads)
        context = self._gemm("attn_context", "B", s, d, s, b * heads)
        # Attention has no weights: both gradients of each batched GEMM are input gradients.
        ops = [*self._gemm_grads(context),
               *([self._mem("attn_dropout_bwd", "B", probs, 2, masks=1)]
                 if self.trn.attention_dropout > 0 else []),
               self._mem("attn_softmax_bwd", "B", probs, 3),
               *self._gemm_grads(scores)]
        return [replace(o, phase="B") for o in ops]

    # -- one block ----------------------------------------------------------------------
    def layer(self) -> tuple[list[Op], list[Op], list[Op], list[Op]]:
        """Forward, recompute, input-gradient and weight-gradient ops of one block."""
        m, t, T, _e = self.m, self.t, self.T, self.e
        h, f = m.hidden, m.ffn_hidden
        n_sp = self.stream
        qkv_n = (h + 2 * m.kv_dim) // t
        up_n = f * (2 if m.activation == "swiglu" else 1) // t
        qkv = self._beside_tp_comm(self._gemm("qkv", "F", T, qkv_n, h), "qkv_fprop")
        proj = self._beside_tp_comm(self._gemm("attn_proj", "F", T, h, h // t), "proj_fprop")
        up = self._beside_tp_comm(self._gemm("mlp_up", "F", T, up_n, h), "fc1_fprop")
        down = self._beside_tp_comm(self._gemm("mlp_down", "F", T, h, f // t), "fc2_fprop")
        act_passes = 3 if m.activation == "swiglu" else 2
        # Bias-dropout-add writes a 1-byte mask per element with hidden dropout; its
        # backward reads it with the gradient and writes the gradient (2 passes + mask).
        drop = int(self.trn.hidden_dropout > 0)
        separate_bias = m.bias and self.trn.bias_kernels == "separate"
        fwd: list[Op] = [
            self._mem("ln1", "F", n_sp, 2),
            *self._entry("tp_ag_attn", "F"),
            *self._fp8_cast(qkv, "input"),
            qkv,
            *([self._mem("qkv_bias", "F", T * qkv_n, 2)] if separate_bias else []),
            *self._attention_forward("F"),
            *self._fp8_cast(proj, "input"),
            proj,
            *self._exit("tp_attn", "F"),
            self._mem("residual1", "F", n_sp, 3, masks=drop),
            self._mem("ln2", "F", n_sp, 2),
            *self._entry("tp_ag_mlp", "F"),
            *self._fp8_cast(up, "input"),
            up,
            self._mem("act", "F", T * f / t, act_passes),
            *self._fp8_cast(down, "input"),
            down,
            *self._exit("tp_mlp", "F"),
            self._mem("residual2", "F", n_sp, 3, masks=drop),
        ]
        recompute: list[Op]
        if self.par.recompute == "full":
            recompute = [_as_phase(op, "R") for op in fwd]
        elif self.par.recompute == "selective":
            recompute = [_as_phase(op, "R") for op in self._attention_forward("R")]
        else:
            recompute = []
        qkv_dx, qkv_dw = self._gemm_grads(qkv)
        qkv_dx, qkv_dw = (self._beside_tp_comm(qkv_dx, "qkv_dgrad"),
                          self._beside_tp_comm(qkv_dw, "qkv_wgrad"))
        up_dx, up_dw = self._gemm_grads(up)
        up_dx, up_dw = (self._beside_tp_comm(up_dx, "fc1_dgrad"),
                        self._beside_tp_comm(up_dw, "fc1_wgrad"))
        proj_dx, proj_dw = self._gemm_grads(proj)
        down_dx, down_dw = self._gemm_grads(down)
        proj_dx = self._beside_tp_comm(proj_dx, "proj_dgrad")
        down_dx = self._beside_tp_comm(down_dx, "fc2_dgrad")
        # Backward runs the block in reverse; the conjugate collectives swap places
        # (Megatron's f/g operators): AR after the column-parallel input gradients.
        # The layer input and the attention block's output each feed a norm and a
        # residual add, so autograd sums their two gradients out of place
        # (torch/csrc/autograd/input_buffer.cpp: old_var + var; read 2, write 1):
        # residual1_bwd is that sum and the attention branch's dropout backward (3 + 2 and
        # the mask), input_grad_sum the sum at the layer input. Without hidden dropout the
        # residual adds pass their gradient on untouched: no residual2_bwd.
        bwd: list[Op] = [
            *([self._mem("residual2_bwd", "B", n_sp, 2, masks=1)] if drop else []),
            *self._entry("tp_ag_mlp_bwd", "B"),
            *_in_phase(self._fp8_cast(down, "grad"), "B"),
            down_dx,
            self._mem("act_bwd", "B", T * f / t, act_passes + 1),
            *_in_phase(self._fp8_cast(up, "grad"), "B"),
            up_dx,
            *self._exit("tp_mlp_bwd", "B"),
            self._mem("ln2_bwd", "B", n_sp, 4),
            self._mem("residual1_bwd", "B", n_sp, 3 + 2 * drop, masks=drop),
            *self._entry("tp_ag_attn_bwd", "B"),
            *_in_phase(self._fp8_cast(proj, "grad"), "B"),
            proj_dx,
            *self._attention_backward(),
            *_in_phase(self._fp8_cast(qkv, "grad"), "B"),
            qkv_dx,
            *self._exit("tp_attn_bwd", "B"),
            self._mem("ln1_bwd", "B", n_sp, 4),
            self._mem("input_grad_sum", "B", n_sp, 3),
        ]
        if separate_bias:
            # Megatron-LM's linear layers: grad_bias = grad_output.sum(dim=0) for QKV, and
            # autograd's sum over the tokens for the biases folded into bias-GeLU
            # (MLP up) and bias-dropout-add (attention output, MLP down): one read each.
            bwd.append(self._mem("bias_grads", "B", T * (qkv_n + up_n) + 2 * n_sp, 1))
        wgt: list[Op] = [down_dw, up_dw, proj_dw, qkv_dw]
        return fwd, recompute, bwd, wgt

    # -- first and last stage -------------------------------------------------------------
    def embedding(self) -> tuple[list[Op], list[Op], list[Op]]:
        """Vocab-parallel embedding lookup (+ positions): F, B, W ops."""
        h, n_sp = self.m.hidden, self.stream
        # Hidden dropout on the embedding output (after the scatter with SP): its own
        # kernel, read, write and a mask; the backward reads the mask with the gradient.
        drop = self.trn.hidden_dropout > 0
        fwd: list[Op] = [self._mem("embed", "F", self.T * h, 3),
                         *self._exit("embed_tp", "F", after_gemm=False),
                         *([self._mem("embed_dropout", "F", n_sp, 2, masks=1)] if drop else [])]
        # PyTorch's embedding_dense_backward allocates the whole gradient of each table
        # (⌈V/t⌉ × h words, max_seq_len × h learned positions) with at::zeros and writes
        # the looked-up rows into it; adding it to the buffer is :attr:`Chunk.accumulate`.
        table = embedding_params_per_device(self.m, self.t)
        wgt: list[Op] = [*([self._mem("embed_dropout", "W", n_sp, 2, masks=1)] if drop else []),
                         self._mem("embed", "W", self.T * h, 3),
                         self._mem("embed_dense_grad", "W", table, 1)]
        return fwd, [], wgt

    def head(self) -> tuple[list[Op], list[Op], list[Op]]:
        """Final norm, LM head GEMM and vocab-parallel cross-entropy: F, B, W ops."""
        m, t, T, n_sp = self.m, self.t, self.T, self.stream
        v = math.ceil(m.vocab / t)
        head = self._gemm("lm_head", "F", T, v, m.hidden)
        dx, dw = self._gemm_grads(head)
        fwd_bytes, bwd_bytes = cross_entropy_bytes_per_logit(self.e)
        loss_tp = self._tp_comm("loss_tp", "all_reduce", "F", 3 * 4 * T)
        # The output layer is the framework's own column-parallel linear, not a Transformer
        # Engine module: with SP its input all-gather blocks, TP overlap or not.
        head_ag = self._tp_comm("head_ag", "all_gather", "F", T * m.hidden * self.e) \
            if self.sp else []
        fwd: list[Op] = [self._mem("final_norm", "F", n_sp, 2), *head_ag, head,
                         ComputeOp("loss", "memory", "F", 0.0, float(T * v * fwd_bytes)),
                         *loss_tp]
        bwd: list[Op] = [ComputeOp("loss", "memory", "B", 0.0, float(T * v * bwd_bytes)), dx,
                         *self._exit("head_rs", "B"),
                         self._mem("final_norm", "B", n_sp, 4)]
        return fwd, bwd, [dw]


def _accumulation(model: Model, par: Parallelism, training: Training, layers: int,
                  first: bool, last: bool, first_layer: int = 0) -> tuple[Op, ...]:
    """:attr:`Chunk.accumulate`: the embeddings' gradients, and unless the GEMMs accumulate
    them (``fused``) those of the chunk's layers and LM head."""
    mode, t = training.grad_accumulation, par.tp
    per_param = grad_accumulation_bytes_per_param(
        mode, DTYPE_BYTES[training.precision],
        grad_bytes_per_param(training.precision, par.grad_reduce_dtype))
    parts = [("embed_grad_accum", embedding_params_per_device(model, t) if first else 0)]
    if mode != "fused":
        parts += [("grad_accum",
                    sum(layers_params_per_device(model, t, par.ep, first_layer, layers))),
                  ("head_grad_accum", head_params_per_device(model, t, par.pp) if last else 0)]
    return tuple(ComputeOp(name, "memory", "W", 0.0, float(params * per_param))
                 for name, params in parts if params)


def cross_entropy_bytes_per_logit(logit_bytes: int) -> tuple[int, int]:
    """HBM bytes per logit of Megatron-LM's vocab-parallel cross-entropy: (forward, backward).

    The loss runs in FP32 on the (16-bit) logits, one PyTorch kernel per line of
    ``megatron/core/tensor_parallel/cross_entropy.py`` (the same sequence as 2020's
    ``mpu/cross_entropy.py``): ``.float()`` reads the logits and writes an FP32 copy, then
    ``max`` reads it, ``-= max`` and ``exp(out=)`` each read and write it, ``sum`` reads
    it and ``div_`` reads and writes it, the softmax kept for the backward. The backward's
    ``mul_`` reads and writes the softmax, and the gradient of ``.float()`` casts it back
    to the logits' dtype. FP32 logits skip both casts.
    """
    fp32 = 4
    cast = logit_bytes + fp32 if logit_bytes != fp32 else 0
    forward = cast + fp32 * (1 + 2 + 2 + 1 + 2)  # max, sub, exp, sum, div
    backward = fp32 * 2 + cast                   # mul_, cast of the gradient
    return forward, backward


def _embedding_grad_allreduce(model: Model, par: Parallelism,
                              training: Training) -> CommOp | None:
    """The tied word embedding's gradient, all-reduced between the first and last stage.

    Megatron-LM (``_allreduce_word_embedding_grads`` in ``finalize_model_grads``) and
    DeepSpeed's pipeline engine (``_exec_reduce_tied_grads``) do this once per step, after
    the backward and before the optimizer. A two-rank all-reduce moves each rank's
    ``S`` bytes once in each direction (a ring's 2(n−1)/n·S at n = 2), so it is priced as
    an exchange of ``S`` bytes between the two stages on the pipeline path.
    """
    if not model.tied_embeddings or par.pp < 2:
        return None
    words = math.ceil(model.vocab / par.tp) * model.hidden
    return CommOp("embed_grad_allreduce", "send_recv", "pp", "O",
                  float(words * grad_bytes_per_param(training.precision,
                                                     par.grad_reduce_dtype)))


FP8_LINEARS_PER_LAYER = 4
"""Transformer Engine's FP8 linear layers in a transformer layer: QKV, attention output,
and the MLP's two (a gated MLP's gate and up matrices are one GEMM)."""


def _amax_reductions(training: Training, layers: int) -> tuple[list[Op], list[Op]]:
    """The FP8 amax all-reduces of a chunk's forward and backward
    (``training.fp8_amax_reduction``), or none.

    Transformer Engine all-reduces (MAX) one float per FP8 tensor over the stage's ranks:
    each linear layer's input, weight and output in the forward, its output and input
    gradients in the backward (``fp8_meta`` of TE 0.x: three and two tensors per GEMM).
    The chunk's layers run inside one ``fp8_autocast`` region (NeMo's and Megatron's
    transformer block), so each pass ends with one reduction.
    """
    if not training.fp8_amax_reduction or layers == 0:
        return [], []
    linears = FP8_LINEARS_PER_LAYER * layers
    return ([CommOp("fp8_amax_reduce", "all_reduce", "stage", "F", 4.0 * 3 * linears)],
            [CommOp("fp8_amax_reduce_bwd", "all_reduce", "stage", "B", 4.0 * 2 * linears)])


def _as_phase(op: Op, phase: str) -> Op:
    return replace(op, phase=phase)


def _in_phase(ops: list[ComputeOp], phase: str) -> list[ComputeOp]:
    return [replace(op, phase=phase, name=f"{op.name}_{phase.lower()}") for op in ops]


def chunk_params(model: Model, tp: int, layers: int, first: bool, last: bool,
                 stages: int, ep: int = 1, first_layer: int = 0) -> int:
    """Parameters of one chunk on one device, its layers ``first_layer`` on (see
    :mod:`llmsim.params`)."""
    params = sum(layers_params_per_device(model, tp, ep, first_layer, layers))
    if first:
        params += embedding_params_per_device(model, tp)
    if last:
        params += head_params_per_device(model, tp, stages)
    return params


Passes = tuple[tuple[Op, ...], tuple[Op, ...], tuple[Op, ...], tuple[Op, ...]]
"""One block's forward (F), recompute (R), input-gradient (B) and weight-gradient (W) ops."""


@dataclass(frozen=True)
class PassOps:
    """The op lists every chunk's passes are assembled from, for one micro-batch: a dense
    transformer block's and (MoE models) an expert block's F, R, B and W ops, and the
    embedding's and the LM head's F, B and W ops."""

    dense: Passes
    moe: Passes | None
    embedding: tuple[tuple[Op, ...], tuple[Op, ...], tuple[Op, ...]]
    head: tuple[tuple[Op, ...], tuple[Op, ...], tuple[Op, ...]]

    def block(self, model: Model, layer: int) -> Passes:
        """The passes of transformer layer ``layer`` (0-based)."""
        if self.moe is not None and model.moe is not None and model.moe.is_moe_layer(layer):
            return self.moe
        return self.dense


def pass_ops(model: Model, par: Parallelism, training: Training) -> PassOps:
    """The per-block and first/last-stage op lists of a layout (:class:`PassOps`)."""
    builder = _LayerBuilder(model, par, training)
    layer_f, layer_r, layer_b, layer_w = builder.layer()
    if model.mla is not None:
        layer_f, layer_r, layer_b, layer_w = apply_mla(
            (layer_f, layer_r, layer_b, layer_w), builder)
    layer_f, layer_r, layer_b, layer_w = apply_context_parallel(
        (layer_f, layer_r, layer_b, layer_w), builder)
    moe = None
    if model.moe is not None:
        moe_f, moe_b, moe_w = replace_mlp(layer_f, layer_b, layer_w, builder)
        moe_r = [_as_phase(op, "R") for op in moe_f] if par.recompute == "full" else layer_r
        moe = (tuple(moe_f), tuple(moe_r), tuple(moe_b), tuple(moe_w))
    emb_f, emb_b, emb_w = builder.embedding()
    head_f, head_b, head_w = builder.head()
    return PassOps((tuple(layer_f), tuple(layer_r), tuple(layer_b), tuple(layer_w)), moe,
                   (tuple(emb_f), tuple(emb_b), tuple(emb_w)),
                   (tuple(head_f), tuple(head_b), tuple(head_w)))


def chunk_extras(model: Model, par: Parallelism, training: Training, layers: int,
                 first: bool, last: bool, first_layer: int = 0,
                 ) -> tuple[tuple[Op, ...], tuple[Op, ...], tuple[Op, ...]]:
    """A chunk's ops besides its blocks, embedding and head: the FP8 amax reductions of its
    forward and backward, and its gradient accumulation (:attr:`Chunk.accumulate`)."""
    amax_f, amax_b = _amax_reductions(training, layers)
    return (tuple(amax_f), tuple(amax_b),
            _accumulation(model, par, training, layers, first, last, first_layer))


def shard_ranks(work: Workload, stage: int) -> float:
    """Ranks a stage's parameters are sharded over by ZeRO, on average: dp, or with
    expert or context parallelism the dense and expert groups' (:attr:`Workload.
    grad_groups`) weighted so that ``params / ranks`` is the local shard."""
    (dense_axis, dense_ranks), (expert_axis, expert_ranks) = work.grad_groups
    if dense_axis == expert_axis:
        return dense_ranks
    params = work.stage_params(stage)
    expert = sum(c.expert_params for (s, _), c in work.chunks.items() if s == stage)
    shard = (params - expert) / dense_ranks + expert / expert_ranks
    return params / shard if shard else 1.0


def step_traffic(model: Model, par: Parallelism, training: Training, dp: int) -> Workload:
    """The step's settings and traffic without its chunks: micro-batches, the pipeline
    message, the gradient and ZeRO settings (a :class:`Workload` with no chunks, whose
    :meth:`Workload.dp_grad_buckets` and :meth:`Workload.weight_gather` price any chunk)."""
    e = DTYPE_BYTES[training.precision]
    tokens = par.micro_batch * training.seq_len // par.cp
    activation = tokens * model.hidden * e
    # Sequence parallelism, or a framework's scatter/gather: each rank sends 1/tp of it.
    sliced = par.tp > 1 and (par.sequence_parallel or par.pp_scatter_gather != "none")
    message = activation / par.tp if sliced else activation
    gathered = sliced and not par.sequence_parallel  # rebuilt from the slices on receipt
    # DeepSpeed 2021's ZeRO-3 gathers: zero-filled buffer, host loop, per-rank slice copies.
    tensor_list = par.tensor_list_gathers and par.zero == 3
    return Workload(
        chunks={},
        microbatches=training.global_batch // (par.micro_batch * dp * par.ep),
        pp_message_bytes=float(message),
        pp_gather_bytes=float(activation) if gathered else 0.0,
        pp_regather_output=gathered and par.pp_scatter_gather == "deepspeed",
        grad_bytes_per_param=grad_bytes_per_param(training.precision, par.grad_reduce_dtype),
        param_bytes_per_param=1 if training.fp8_param_gather else e,
        zero=par.zero,
        dp=dp,
        tp=par.tp,
        bucket_bytes=par.dp_bucket_mb * 1e6,
        overlap_param_gather=par.overlap_param_gather,
        accumulate_from_microbatch=1 if training.grad_accumulation == "autograd" else 0,
        embedding_grad_allreduce=_embedding_grad_allreduce(model, par, training),
        # DeepSpeed fetches per module: QKV, attention output and the MLP's matrices.
        gather_messages=model.mlp_matrices + 2 if par.gather_per_module and par.zero == 3
        else 1,
        gather_copies=dp if tensor_list else 0,
        gather_fill_passes=1 if tensor_list else 0,
        gather_host_s=(dp * par.tensor_list_host_us_per_rank
                       + par.tensor_list_host_us_per_call) * 1e-6 if tensor_list else 0.0,
        grad_all_reduce=par.grad_all_reduce,
        grad_bucket_nan_check=par.grad_bucket_nan_check,
        grad_bucket_prescale=par.grad_bucket_prescale,
        regather_for_recompute=par.regather_for_recompute and par.zero == 3
        and par.recompute == "full",
        ep=par.ep,
        cp=par.cp,
    )


def build_workload(model: Model, par: Parallelism, training: Training, dp: int) -> Workload:
    """The workload graph of one step for a validated layout."""
    p, v = par.pp, par.virtual_stages
    ops = pass_ops(model, par, training)
    (emb_f, emb_b, emb_w), (head_f, head_b, head_w) = ops.embedding, ops.head
    split = chunk_layers(model.layers, par)
    chunks: dict[tuple[int, int], Chunk] = {}
    for stage in range(p):
        for c in range(v):
            vs, n = c * p + stage, split[stage][c]
            first, last = vs == 0, vs == p * v - 1
            start = chunk_first_layer(split, stage, c)
            amax_f, amax_b, accumulate = chunk_extras(model, par, training, n, first, last,
                                                      start)
            fwd: tuple[Op, ...] = emb_f if first else ()
            bwd: tuple[Op, ...] = head_b if last else ()
            wgt: tuple[Op, ...] = head_w if last else ()
            for i in range(start, start + n):
                fwd += ops.block(model, i)[0]
            for i in reversed(range(start, start + n)):
                block = ops.block(model, i)
                bwd += block[1] + block[2]
                wgt += block[3]
            fwd += amax_f + (head_f if last else ())
            bwd += amax_b + (emb_b if first else ())
            wgt += emb_w if first else ()
            _, experts = layers_params_per_device(model, par.tp, par.ep, start, n)
            chunks[(stage, c)] = Chunk(
                stage, c, vs, n, first, last,
                chunk_params(model, par.tp, n, first, last, p, par.ep, start),
                fwd, bwd, wgt, accumulate, expert_params=experts,
            )
    work = replace(step_traffic(model, par, training, dp), chunks=chunks, optimizer={})
    for stage in range(p):
        tensors = sum(param_tensors(model, c.layers, c.first, c.last, p)
                      for (s, _), c in chunks.items() if s == stage)
        work.optimizer[stage] = optimizer_step(par, training, work.stage_params(stage),
                                               tensors, shard_ranks(work, stage))
    return work
