"""Multi-token prediction (DeepSeek-V3 report §2.2): the ops, weights and activations
the ``model.mtp_depth`` modules add to the last pipeline stage.

Module ``k`` (1 … D) takes the main model's last hidden state (the previous module's for
``k > 1``) and the embedding of the tokens ``k`` places ahead, normalises each (RMSNorm),
concatenates them and projects ``2h → h`` (``M_k``, eq. 21), runs one transformer block
(eq. 22) and predicts with the main model's output head and a cross-entropy of its own
(eqs. 23–24). The embedding and the head are the main model's (shared, §2.2.1); the
module's own weights are the block, the projection and three norms
(:attr:`llmsim.specs.Model.mtp_params`). Megatron-Core (``--mtp-num-layers``) and
DeepSeek's framework put the modules on the last pipeline stage with the head; when the
first stage (the embedding) sits elsewhere the last keeps a copy of the word embedding,
whose gradient joins the first stage's once a step as a tied embedding's does (the
report's §3.2.3: DualPipe puts both ends on one rank so that the two share it
physically; 1F1B and interleaved 1F1B do not).

Per micro-batch and TP rank (``T`` tokens, ``t`` = tp): forward, the embedding lookup,
the two norms (with sequence parallelism on ``T/t`` rows), the all-gather of the
concatenated input (sequence parallelism), the projection GEMM ``T × h/t × 2h`` and the
all-gather of its column-parallel output, the block's forward (a MoE block when the
model's layer ``layers + k − 1`` would be one, :meth:`Model.mtp_is_moe`), the head's
forward and loss; backward, the same in reverse; weight gradients of the projection,
the block and the head, and the embedding's gradient rows.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from llmsim.params import (
    embedding_params_per_device,
    layer_params_per_device,
    moe_layer_params_per_device,
)

if TYPE_CHECKING:
    from llmsim.specs import Model, Parallelism, Training
    from llmsim.workload import LayerBuilder, Op

Passes = tuple[tuple["Op", ...], tuple["Op", ...], tuple["Op", ...], tuple["Op", ...]]
PassLists = tuple[tuple["Op", ...], tuple["Op", ...], tuple["Op", ...]]


def _renamed(ops: tuple[Op, ...] | list[Op], k: int) -> tuple[Op, ...]:
    """The ops with ``mtp{k}_`` before their names (the timeline and the breakdown tell
    them from the main model's)."""
    return tuple(replace(op, name=f"mtp{k}_{op.name}") for op in ops)


def mtp_ops(builder: LayerBuilder, blocks: list[Passes], embedding: PassLists,
            head: PassLists) -> PassLists:
    """Forward, backward (recompute and input gradients) and weight-gradient ops of the
    ``len(blocks)`` multi-token prediction modules of one micro-batch, in the order the
    last stage runs them after its main model's head (module docstring); ``blocks[k]``
    is module ``k``'s transformer block (F, R, B, W), ``embedding`` and ``head`` the
    main model's (F, B, W)."""
    b, h = builder, builder.m.hidden
    fwd: tuple[Op, ...] = ()
    bwd: tuple[Op, ...] = ()
    wgt: tuple[Op, ...] = ()
    emb_f, _, emb_w = embedding
    head_f, head_b, head_w = head
    for k, (blk_f, blk_r, blk_b, blk_w) in enumerate(blocks, start=1):
        proj = b._gemm("eh_proj", "F", b.T, h // b.t, 2 * h)
        proj_dx, proj_dw = b._gemm_grads(proj)
        gather = b._tp_comm("eh_proj_ag", "all_gather", "F", b.T * h * b.e) if b.t > 1 else []
        entry_f = b._tp_comm("eh_in_ag", "all_gather", "F", 2 * b.T * h * b.e) if b.sp else []
        exit_b = b._tp_comm("eh_in_rs", "reduce_scatter", "B", 2 * b.T * h * b.e) \
            if b.sp else b._tp_comm("eh_in_ar", "all_reduce", "B", 2 * b.T * h * b.e) \
            if b.t > 1 else []
        norms_f: list[Op] = [b._mem("hnorm", "F", b.stream, 2), b._mem("enorm", "F", b.stream, 2)]
        norms_b: list[Op] = [b._mem("hnorm", "B", b.stream, 4), b._mem("enorm", "B", b.stream, 4)]
        fwd += _renamed([*emb_f, *norms_f, *entry_f, proj, *gather, *blk_f, *head_f], k)
        # the backward runs the deepest module first
        bwd = _renamed([*head_b, *blk_r, *blk_b, proj_dx, *exit_b, *norms_b], k) + bwd
        wgt = _renamed([*head_w, *blk_w, proj_dw, *emb_w], k) + wgt
    return fwd, bwd, wgt


def mtp_params_per_device(model: Model, tp: int, ep: int, etp: int | None,
                          embedding_copy: bool) -> tuple[int, int]:
    """(dense, routed-expert) weights of the multi-token prediction modules on one device
    of the last stage: each module's block (split as the model's blocks are: ``ep`` the
    ranks that split the routed experts, ``etp`` their TP degree), its projection
    (column-parallel, ``2h·h/tp``) and norms, and with ``embedding_copy`` the stage's
    copy of the word embedding (module docstring)."""
    if not model.mtp_depth:
        return 0, 0
    t, h = tp, model.hidden
    norms = model.mtp_module_extra_params - 2 * h * h
    dense = expert = 0
    for k in range(model.mtp_depth):
        if model.mtp_is_moe(k):
            d, e = moe_layer_params_per_device(model, t, ep, etp)
        else:
            d, e = layer_params_per_device(model, t), 0
        dense, expert = dense + d + 2 * h * h // t + norms, expert + e
    if embedding_copy and not model.tied_embeddings:  # a tied head is that copy already
        dense += embedding_params_per_device(model, t)
    return dense, expert


def mtp_activation_bytes(model: Model, par: Parallelism, training: Training,
                         layer_bytes: float, output_bytes: float, element_bytes: int) -> float:
    """What the multi-token prediction modules store for their backward, bytes per
    micro-batch on one device for the whole sequence (the caller divides by cp, as for
    the main model's layers): each module's block as a dense layer of the main model
    stores (``layer_bytes``; a MoE block's extra is the caller's, per rank), its head's
    inputs and logits (``output_bytes``) and the concatenated normalised input of its
    projection, ``e·sb·2h`` (÷t with sequence parallelism)."""
    if not model.mtp_depth:
        return 0.0
    sb = par.micro_batch * training.seq_len
    concat = element_bytes * sb * 2 * model.hidden / (par.tp if par.sequence_parallel else 1)
    return model.mtp_depth * (layer_bytes + output_bytes + concat)
