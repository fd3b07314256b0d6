"""The ops of one transformer block, and of the embedding and LM head, for one
micro-batch (:class:`LayerBuilder`).

Sizes are per device: matrices are divided by the tensor-parallel degree ``t``. Shapes
follow Megatron-LM's layer (Shoeybi et al. 2019, Fig. 3; Narayanan et al. 2021 §3.1;
Korthikanti et al. 2022 §4).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Literal

from llmsim.memory import DROPOUT_MASK_BYTES
from llmsim.ops import CommOp, ComputeOp
from llmsim.optimizer import (
    DTYPE_BYTES,
)
from llmsim.params import (
    embedding_params_per_device,
)
from llmsim.specs import MemoryKind, Model, Parallelism, Training
from llmsim.specs.tp_overlap import TpOverlapGemm, TpOverlapGemmName
from llmsim.workload.fp8 import AMAX_BYTES, operand_casts
from llmsim.workload.loss import cross_entropy_bytes_per_logit
from llmsim.workload.small_calls import cross_entropy_calls
from llmsim.workload.softmax import alibi_scores, softmax_backward, softmax_forward
from llmsim.workload.step import Op

_TE_DEFAULT_METHOD: dict[str, Literal["ring_exchange", "pipeline", "bulk"]] = {
    "qkv_fprop": "ring_exchange", "fc1_fprop": "ring_exchange",
    "proj_dgrad": "ring_exchange", "fc2_dgrad": "ring_exchange",
    "proj_fprop": "pipeline", "fc2_fprop": "pipeline",
    "qkv_dgrad": "bulk", "qkv_wgrad": "bulk", "fc1_dgrad": "bulk", "fc1_wgrad": "bulk",
}
"""Transformer Engine's default overlap method per GEMM (``initialize_ub``)."""



class LayerBuilder:
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
                         float(e * batch * (m * k + k * n + m * n)), (m, n, k), batch,
                         output_bytes=float(e * batch * m * n))

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
             masks: int = 0, kind: MemoryKind = "stream",
             out_elements: float | None = None) -> ComputeOp:
        """A memory-bound kernel of ``kind`` touching ``elements`` values ``passes`` times,
        and writing or reading ``masks`` 1-byte dropout masks of as many elements; its new
        output holds ``out_elements`` values (None: ``elements``)."""
        out = elements if out_elements is None else out_elements
        return ComputeOp(name, "memory", phase, 0.0,
                         float(elements * (passes * self.e + masks * DROPOUT_MASK_BYTES)),
                         memory_kind=kind, output_bytes=float(out * self.e))

    def _fp8_cast(self, gemm: ComputeOp, operand: str) -> list[ComputeOp]:
        """FP8 casts of a linear layer's input (forward) or output gradient
        (:func:`llmsim.workload.fp8.operand_casts`); none outside FP8."""
        return operand_casts(gemm, operand, self.trn) if self.fp8 else []

    def _tp_comm(self, name: str, kind: str, phase: str, nbytes: float,
                 pairs_with: Literal["next", "previous"] | None = None) -> list[CommOp]:
        return [CommOp(name, kind, "tp", phase, nbytes, pairs_with)] if self.t > 1 else []

    def _tp_amax(self, gemm: ComputeOp, phase: str) -> list[CommOp]:
        """Under ``training.fp8_scaling: current`` with sequence parallelism: the one-value
        MAX all-reduce over the TP group of the amax of ``gemm``'s sequence-split operand
        (a column-parallel input, a row-parallel output gradient), which Transformer Engine
        quantises before the all-gather and whose scale and cast wait for it
        (:data:`llmsim.workload.fp8.TP_AMAX_REDUCTIONS`). It comes before the all-gather,
        as in TE, so the gather still pairs with its GEMM (:mod:`llmsim.blocks`)."""
        if not (self.fp8 and self.sp and self.fp8_scaling == "current"):
            return []
        return self._tp_comm(f"tp_amax_{gemm.name}", "all_reduce", phase, float(AMAX_BYTES))

    def _tp_sync(self, name: str, phase: str, tensors: int) -> list[CommOp]:
        """With ``parallelism.sync_tp_duplicated_parameters``: the AVG all-reduce over the
        TP group of each of ``tensors`` duplicated hidden-size parameters (a norm's weight
        and bias, a row-parallel bias), one blocking call each, before the kernel that
        reads them (Megatron-DeepSpeed ``MixedFusedLayerNorm.forward``,
        ``RowParallelLinear.forward``, TurkuNLP fork at 6732bc9)."""
        if not self.par.sync_tp_duplicated_parameters:
            return []
        return [op for i in range(tensors)
                for op in self._tp_comm(f"{name}_{i}", "all_reduce", phase,
                                        float(self.m.hidden * self.e))]

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
                              attention_shape=(s, d),
                              attention_heads=(b * heads, b * kv_local)),
                    *self._attention_layout_copies(phase)]
        # Unfused (Megatron 2020-21): scores GEMM, fused scale-mask-softmax, dropout, context.
        probs = float(b * heads * s * s)
        scores = replace(self._gemm("attn_scores", phase, s, s, d, b * heads),
                         dtype=self.attn_dtype)
        return [
            *alibi_scores(m.position_embedding, self._mem, scores, probs),
            *softmax_forward(self.trn.attention_softmax, self._mem, phase, probs,
                             self.trn.attention_dropout > 0),
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
        elements = self.T * (self.m.q_dim + 2 * self.m.kv_dim) / self.t
        if self.par.micro_batch > 1:  # with b = 1 the output's transpose is a view
            elements += self.T * self.m.q_dim / self.t
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
                              attention_shape=fwd.attention_shape,
                              attention_heads=fwd.attention_heads),
                    *self._attention_layout_copies("B")]
        probs = float(b * heads * s * s)
        scores = self._gemm("attn_scores", "B", s, s, d, b * heads)
        context = self._gemm("attn_context", "B", s, d, s, b * heads)
        # Attention has no weights: both gradients of each batched GEMM are input gradients.
        middle = softmax_backward(self.trn.attention_softmax, self._mem, probs,
                                  self.trn.attention_dropout > 0)
        ops = [*self._gemm_grads(context), *middle, *self._gemm_grads(scores)]
        return [replace(o, phase="B") for o in ops]

    # -- one block ----------------------------------------------------------------------
    def layer(self) -> tuple[list[Op], list[Op], list[Op], list[Op]]:
        """Forward, recompute, input-gradient and weight-gradient ops of one block."""
        m, t, T, _e = self.m, self.t, self.T, self.e
        h, f = m.hidden, m.ffn_hidden
        n_sp = self.stream
        qkv_n = (m.q_dim + 2 * m.kv_dim) // t
        up_n = f * (2 if m.activation == "swiglu" else 1) // t
        qkv = self._beside_tp_comm(self._gemm("qkv", "F", T, qkv_n, h), "qkv_fprop")
        proj = self._beside_tp_comm(self._gemm("attn_proj", "F", T, h, m.q_dim // t),
                                    "proj_fprop")
        up = self._beside_tp_comm(self._gemm("mlp_up", "F", T, up_n, h), "fc1_fprop")
        down = self._beside_tp_comm(self._gemm("mlp_down", "F", T, h, f // t), "fc2_fprop")
        act_passes = 3 if m.activation == "swiglu" else 2
        # Bias-dropout-add writes a 1-byte mask per element with hidden dropout; its
        # backward reads it with the gradient and writes the gradient (2 passes + mask).
        drop = int(self.trn.hidden_dropout > 0)
        separate_bias = m.bias and self.trn.bias_kernels == "separate"
        norm_tensors = 2 if m.norm == "layernorm" else 1
        bias_tensors = int(m.bias)
        fwd: list[Op] = [
            *self._tp_sync("tp_sync_ln1", "F", norm_tensors),
            self._mem("ln1", "F", n_sp, 2, kind=self.m.norm),
            *self._tp_amax(qkv, "F"),
            *self._entry("tp_ag_attn", "F"),
            *self._fp8_cast(qkv, "input"),
            qkv,
            *([self._mem("qkv_bias", "F", T * qkv_n, 2)] if separate_bias else []),
            *self._attention_forward("F"),
            *self._fp8_cast(proj, "input"),
            proj,
            *self._exit("tp_attn", "F"),
            *self._tp_sync("tp_sync_proj_bias", "F", bias_tensors),
            self._mem("residual1", "F", n_sp, 3, masks=drop),
            *self._tp_sync("tp_sync_ln2", "F", norm_tensors),
            self._mem("ln2", "F", n_sp, 2, kind=self.m.norm),
            *self._tp_amax(up, "F"),
            *self._entry("tp_ag_mlp", "F"),
            *self._fp8_cast(up, "input"),
            up,
            self._mem("act", "F", T * f / t, act_passes),
            *self._fp8_cast(down, "input"),
            down,
            *self._exit("tp_mlp", "F"),
            *self._tp_sync("tp_sync_down_bias", "F", bias_tensors),
            self._mem("residual2", "F", n_sp, 3, masks=drop),
        ]
        recompute: list[Op]
        if self.par.recompute == "full":
            recompute = [_as_phase(op, "R") for op in fwd]
        elif self.par.recompute == "full_keep_attention":  # all but the attention kernel
            recompute = [_as_phase(op, "R") for op in fwd
                         if not (isinstance(op, ComputeOp) and op.kind == "attention")]
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
            *self._tp_amax(down, "B"),
            *self._entry("tp_ag_mlp_bwd", "B"),
            *_in_phase(self._fp8_cast(down, "grad"), "B"),
            down_dx,
            self._mem("act_bwd", "B", T * f / t, act_passes + 1),
            *_in_phase(self._fp8_cast(up, "grad"), "B"),
            up_dx,
            *self._exit("tp_mlp_bwd", "B"),
            self._mem("ln2_bwd", "B", n_sp, 4, kind="norm_backward"),
            self._mem("residual1_bwd", "B", n_sp, 3 + 2 * drop, masks=drop),
            *self._tp_amax(proj, "B"),
            *self._entry("tp_ag_attn_bwd", "B"),
            *_in_phase(self._fp8_cast(proj, "grad"), "B"),
            proj_dx,
            *self._attention_backward(),
            *_in_phase(self._fp8_cast(qkv, "grad"), "B"),
            qkv_dx,
            *self._exit("tp_attn_bwd", "B"),
            self._mem("ln1_bwd", "B", n_sp, 4, kind="norm_backward"),
            self._mem("input_grad_sum", "B", n_sp, 3),
        ]
        if separate_bias:
            # Megatron-LM's linear layers: grad_bias = grad_output.sum(dim=0) for QKV, and
            # autograd's sum over the tokens for the biases folded into bias-GeLU
            # (MLP up) and bias-dropout-add (attention output, MLP down): one read each.
            bwd.append(self._mem("bias_grads", "B", T * (qkv_n + up_n) + 2 * n_sp, 1,
                                 out_elements=0))  # reductions to bias-sized vectors
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
        loss_tp = cross_entropy_calls(self.trn.small_calls, T, t)
        # The output layer is the framework's own column-parallel linear, not a Transformer
        # Engine module: with SP its input all-gather blocks, TP overlap or not.
        head_ag = self._tp_comm("head_ag", "all_gather", "F", T * m.hidden * self.e) \
            if self.sp else []
        sync = self._tp_sync("tp_sync_final_norm", "F", 2 if m.norm == "layernorm" else 1)
        fwd: list[Op] = [*sync, self._mem("final_norm", "F", n_sp, 2, kind=self.m.norm),
                         *head_ag,
                         head,
                         ComputeOp("loss", "memory", "F", 0.0, float(T * v * fwd_bytes)),
                         *loss_tp]
        bwd: list[Op] = [ComputeOp("loss", "memory", "B", 0.0, float(T * v * bwd_bytes)), dx,
                         *self._exit("head_rs", "B"),
                         self._mem("final_norm", "B", n_sp, 4, kind="norm_backward")]
        return fwd, bwd, [dw]


def _as_phase(op: Op, phase: str) -> Op:
    return replace(op, phase=phase)


def _in_phase(ops: list[ComputeOp], phase: str) -> list[ComputeOp]:
    return [replace(op, phase=phase, name=f"{op.name}_{phase.lower()}") for op in ops]
