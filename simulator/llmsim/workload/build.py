"""Assembling a step's :class:`~llmsim.workload.step.Workload` from the block ops:
the chunks of every stage, their extras, the step's traffic and the optimizer."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from llmsim.cp_schedules import APPLY as CP_APPLY
from llmsim.host_syncs import apply_attention_syncs, batch_ops, exchange_sync_s, loss_ops
from llmsim.mla import apply_mla
from llmsim.moe import pairs_overlap, replace_mlp
from llmsim.mtp import mtp_ops, mtp_params_per_device
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
from llmsim.schedules import SCHEDULES, placement
from llmsim.specs import Model, Parallelism, Training
from llmsim.workload.fp8 import (
    FP8_LINEARS_PER_LAYER,
    amax_bookkeeping,
    step_weight_casts,
    weight_elements,
)
from llmsim.workload.hf_eager import REPLACING, apply_hf_eager
from llmsim.workload.host_work import apply_host_work
from llmsim.workload.layer import LayerBuilder
from llmsim.workload.persistent import persistent_elements
from llmsim.workload.recompute import EXPERT_ACTIVATIONS, NORMS_AND_UP_PROJECTIONS, recomputed
from llmsim.workload.rope import apply_rope
from llmsim.workload.router_kernels import with_router_kernels
from llmsim.workload.small_calls import (
    batch_broadcasts,
    broadcast_on_every_chunk,
    loss_average,
)
from llmsim.workload.step import Chunk, Op, Workload


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
                    sum(layers_params_per_device(model, t, par.expert_ranks, first_layer,
                                                 layers, par.etp))),
                  ("head_grad_accum", head_params_per_device(model, t, par.pp) if last else 0)]
    return tuple(ComputeOp(name, "memory", "W", 0.0, float(params * per_param))
                 for name, params in parts if params)


def _embedding_grad_allreduce(model: Model, par: Parallelism,
                              training: Training) -> CommOp | None:
    """The tied word embedding's gradient, all-reduced between the first and last stage.

    Megatron-LM (``_allreduce_word_embedding_grads`` in ``finalize_model_grads``) and
    DeepSpeed's pipeline engine (``_exec_reduce_tied_grads``) do this once per step, after
    the backward and before the optimizer. A two-rank all-reduce moves each rank's
    ``S`` bytes once in each direction (a ring's 2(n−1)/n·S at n = 2), so it is priced as
    an exchange of ``S`` bytes between the two stages on the pipeline path.
    """
    hops = placement(par.schedule, par.pp, par.virtual_stages)
    shared = model.tied_embeddings or model.mtp_depth > 0  # MTP's copy: llmsim.mtp
    if not shared or par.pp < 2 or (hops and hops[0][0] == hops[-1][0]):
        return None  # one copy of the embedding (ZB-V: the first and last chunks on stage 0)
    if SCHEDULES[par.schedule].pipelines > 1:
        # Chimera: stage 0 holds the down pipeline's embedding and the up one's LM head,
        # and after the replicas' all-reduce (Workload.replica_grad_exchange) both sums.
        return None
    words = math.ceil(model.vocab / par.tp) * model.hidden
    return CommOp("embed_grad_allreduce", "send_recv", "pp", "O",
                  float(words * grad_bytes_per_param(training.precision,
                                                     par.grad_reduce_dtype)))


def chunk_params(model: Model, tp: int, layers: int, first: bool, last: bool,
                 stages: int, ep: int = 1, first_layer: int = 0,
                 etp: int | None = None) -> int:
    """Parameters of one chunk on one device, its layers ``first_layer`` on (see
    :mod:`llmsim.params`; ``ep`` the ranks that split the routed experts, ``etp`` their
    TP degree); the last chunk's include the multi-token prediction modules
    (:func:`llmsim.mtp.mtp_params_per_device`, an embedding copy when ``stages`` > 1)."""
    params = sum(layers_params_per_device(model, tp, ep, first_layer, layers, etp))
    if first:
        params += embedding_params_per_device(model, tp)
    if last:
        params += head_params_per_device(model, tp, stages)
        params += sum(mtp_params_per_device(model, tp, ep, etp, stages > 1))
    return params


Passes = tuple[tuple[Op, ...], tuple[Op, ...], tuple[Op, ...], tuple[Op, ...]]
"""One block's forward (F), recompute (R), input-gradient (B) and weight-gradient (W) ops."""


@dataclass(frozen=True)
class PassOps:
    """The op lists every chunk's passes are assembled from, for one micro-batch: a dense
    transformer block's and (MoE models) an expert block's F, R, B and W ops, and the
    embedding's and the last stage's F, B and W ops after its layers: the LM head and
    loss, then the multi-token prediction modules (:mod:`llmsim.mtp`), whose backward
    comes first, then the loss's average for logging
    (:func:`llmsim.workload.small_calls.loss_average`); and the ops before every chunk's
    forward (:attr:`batch_input`)."""

    dense: Passes
    moe: Passes | None
    embedding: tuple[tuple[Op, ...], tuple[Op, ...], tuple[Op, ...]]
    head: tuple[tuple[Op, ...], tuple[Op, ...], tuple[Op, ...]]
    batch_input: tuple[Op, ...] = ()
    """The batch's broadcast to the TP group before a chunk's forward
    (:func:`llmsim.workload.small_calls.batch_broadcasts`), and where ``get_batch`` reads
    the sizes back before every chunk, that sync and its masks
    (:func:`llmsim.host_syncs.batch_ops`)."""
    batch_input_on_every_chunk: bool = True
    """:attr:`batch_input` comes before every chunk's forward; False: before the first and
    last chunks' only."""
    batch_ends: tuple[Op, ...] = ()
    """Ops before the first and last chunks' forward only, after :attr:`batch_input`:
    ``get_batch``'s sync and masks where they are not in :attr:`batch_input`."""

    def block(self, model: Model, layer: int) -> Passes:
        """The passes of transformer layer ``layer`` (0-based)."""
        if self.moe is not None and model.moe is not None and model.moe.is_moe_layer(layer):
            return self.moe
        return self.dense


def pass_ops(model: Model, par: Parallelism, training: Training) -> PassOps:
    """The per-block and first/last-stage op lists of a layout (:class:`PassOps`)."""
    builder = LayerBuilder(model, par, training)
    layer_f, layer_r, layer_b, layer_w = builder.layer()
    if model.mla is not None:
        layer_f, layer_r, layer_b, layer_w = apply_mla(
            (layer_f, layer_r, layer_b, layer_w), builder)
    if training.pointwise_ops != "fused":
        layer_f, layer_r, layer_b, layer_w = apply_hf_eager(
            (layer_f, layer_r, layer_b, layer_w), builder.e, REPLACING[training.pointwise_ops])
    if model.position_embedding == "rope" and model.mla is None:
        layer_f, layer_r, layer_b, layer_w = apply_rope(
            (layer_f, layer_r, layer_b, layer_w),
            "unfused" if training.pointwise_ops == "hf_eager" else training.rope,
            builder.T * (model.q_dim + model.kv_dim) / par.tp, builder.e)
    layer_f, layer_r, layer_b, layer_w = CP_APPLY[par.cp_schedule](
        (layer_f, layer_r, layer_b, layer_w), builder)
    layer_f, layer_r, layer_b, layer_w = apply_attention_syncs(
        (layer_f, layer_r, layer_b, layer_w), training)
    layer_f, layer_r, layer_b, layer_w = apply_host_work(
        (layer_f, layer_r, layer_b, layer_w), model, par, training)
    if par.recompute_norms_and_up_proj:
        layer_r = [*layer_r, *recomputed(layer_f, NORMS_AND_UP_PROJECTIONS)]
    moe = None
    if model.moe is not None:
        moe_f, moe_b, moe_w = replace_mlp(layer_f, layer_b, layer_w, builder)
        moe_f, moe_b = with_router_kernels(moe_f, moe_b, builder, model, training)
        moe_r = recomputed(moe_f) if par.recompute == "full" else layer_r
        if training.fp8_activation_cache:
            moe_r = [*moe_r, *recomputed(moe_f, EXPERT_ACTIVATIONS)]
        moe = (tuple(moe_f), tuple(moe_r), tuple(moe_b), tuple(moe_w))
    emb_f, emb_b, emb_w = builder.embedding()
    head_f, head_b, head_w = builder.head()
    dense = (tuple(layer_f), tuple(layer_r), tuple(layer_b), tuple(layer_w))
    embedding = (tuple(emb_f), tuple(emb_b), tuple(emb_w))
    head = (tuple(head_f), tuple(head_b), tuple(head_w))
    blocks = [moe if moe is not None and model.mtp_is_moe(k) else dense
              for k in range(model.mtp_depth)]
    mtp_f, mtp_b, mtp_w = mtp_ops(builder, blocks, embedding, head)
    # get_batch's sync and masks go where its broadcasts go (DeepSpeed's pipeline engine
    # calls it on the first and last stages only), before every chunk where the version
    # makes them so, else before the embedding's and the head's chunks
    every = broadcast_on_every_chunk(training.small_calls)
    batch_input = batch_broadcasts(training.small_calls, par.micro_batch, training.seq_len,
                                   par.tp, par.pp)
    every_chunk_syncs = batch_ops(training, ends=False) if every else ()
    return PassOps(dense, moe, embedding,
                   (head[0] + mtp_f + loss_average(training.small_calls), mtp_b + head[1],
                    mtp_w + head[2]),
                   batch_input + every_chunk_syncs, every,
                   () if every_chunk_syncs else batch_ops(training))


def chunk_extras(model: Model, par: Parallelism, training: Training, layers: int,
                 first: bool, last: bool, first_layer: int = 0,
                 ) -> tuple[tuple[Op, ...], tuple[Op, ...], tuple[Op, ...]]:
    """A chunk's ops besides its blocks, embedding and head: the FP8 amax reductions of its
    forward and backward, and its gradient accumulation (:attr:`Chunk.accumulate`)."""
    amax_f, amax_b = amax_bookkeeping(training, layers)
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


def _activation_bytes(model: Model, par: Parallelism, training: Training) -> int:
    """Bytes of one micro-batch's activation at a stage boundary (tokens × hidden)."""
    tokens = par.micro_batch * training.seq_len // par.cp
    return tokens * model.hidden * DTYPE_BYTES[training.precision]


def _sliced(par: Parallelism) -> bool:
    """Whether each tensor-parallel rank sends 1/tp of the pipeline message: sequence
    parallelism, or a framework's scatter/gather."""
    return par.tp > 1 and (par.sequence_parallel or par.pp_scatter_gather != "none")


def pp_message_bytes(model: Model, par: Parallelism, training: Training) -> float:
    """Bytes of one pipeline send of one micro-batch (:attr:`Workload.pp_message_bytes`
    of :func:`step_traffic`, without the rest of the step's traffic)."""
    activation = _activation_bytes(model, par, training)
    return float(activation / par.tp if _sliced(par) else activation)


def step_traffic(model: Model, par: Parallelism, training: Training, dp: int) -> Workload:
    """The step's settings and traffic without its chunks: micro-batches, the pipeline
    message, the gradient and ZeRO settings (a :class:`Workload` with no chunks, whose
    :meth:`Workload.dp_grad_buckets` and :meth:`Workload.weight_gather` price any chunk)."""
    e = DTYPE_BYTES[training.precision]
    activation = _activation_bytes(model, par, training)
    sliced = _sliced(par)
    gathered = sliced and not par.sequence_parallel  # rebuilt from the slices on receipt
    # DeepSpeed 2021's ZeRO-3 gathers: zero-filled buffer, host loop, per-rank slice copies.
    tensor_list = par.tensor_list_gathers and par.zero == 3
    regather = par.persistent_regather and par.zero == 3
    modules = par.modules_per_layer or model.mlp_matrices + 2
    return Workload(
        chunks={},
        microbatches=training.global_batch // (par.micro_batch * dp * par.ep),
        pp_message_bytes=pp_message_bytes(model, par, training),
        pp_exchange_host_s=exchange_sync_s(training, par),
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
        # Per-module fetches (DeepSpeed, FSDP per nn.Linear): the attention and MLP matrices.
        bucket_matrices=modules if par.grad_buckets_whole_matrices else 0,
        gather_messages=modules if par.gather_per_module and par.zero == 3 else 1,
        gather_calls=par.gathers_per_call if par.zero == 3 else 1,
        recompute_gather_at_call=not par.prefetch_recompute_gather,
        unit_reductions=par.reduce_scatters_per_unit
        if par.zero == 3 and par.reduce_in_backward else 0,
        gather_copies=dp if tensor_list else 0,
        gather_fill_passes=1 if tensor_list else 0,
        gather_host_s=(dp * par.tensor_list_host_us_per_rank
                       + par.tensor_list_host_us_per_call) * 1e-6 if tensor_list else 0.0,
        grad_all_reduce=par.grad_all_reduce,
        parameter_server=par.dp_mode == "parameter_server",
        grad_bucket_nan_check=par.grad_bucket_nan_check,
        grad_bucket_prescale=par.grad_bucket_prescale,
        regather_for_recompute=par.regather_for_recompute and par.zero == 3
        and par.recompute in ("full", "full_keep_attention"),
        # DeepSpeed 2021's ZeRO-3 gathers its resident biases and norms back every step.
        persistent_layer_elements=persistent_elements(model, par.tp, 1, False) if regather
        else (),
        persistent_final_elements=persistent_elements(model, par.tp, 0, True) if regather
        else (),
        persistent_host_us=par.tensor_list_host_us_per_rank if regather else 0.0,
        ep=par.ep,
        cp=par.cp,
    )


def chunk_pass_ops(model: Model, training: Training, ops: PassOps, n: int, first: bool,
                   last: bool, start: int, amax: tuple[tuple[Op, ...], tuple[Op, ...]]
                   ) -> tuple[tuple[Op, ...], tuple[Op, ...], tuple[Op, ...]]:
    """The forward, backward (recompute and input gradient) and weight-gradient ops of a
    chunk of ``n`` layers from layer ``start``, in the order a device runs them
    (``first`` / ``last``: it holds the embedding / the head; ``amax``: the chunk's FP8
    amax reductions, forward and backward)."""
    (emb_f, emb_b, emb_w), (head_f, head_b, head_w) = ops.embedding, ops.head
    # get_batch's broadcasts (before every chunk in Megatron-LM's mpu), its sync and masks
    # (before every chunk in Megatron-LM 2020-21, else the embedding's and the head's)
    ends = first or last
    fwd: tuple[Op, ...] = ops.batch_input if ops.batch_input_on_every_chunk or ends else ()
    fwd += ops.batch_ends if ends else ()
    fwd += emb_f if first else ()
    bwd: tuple[Op, ...] = head_b if last else ()
    wgt: tuple[Op, ...] = head_w if last else ()
    for i in range(start, start + n):
        fwd += ops.block(model, i)[0]
    for i in reversed(range(start, start + n)):
        block = ops.block(model, i)
        bwd += block[1] + block[2]
        wgt += block[3]
    fwd += amax[0] + (head_f + loss_ops(training) if last else ())
    bwd += amax[1] + (emb_b if first else ())
    wgt += emb_w if first else ()
    return fwd, bwd, wgt


def build_workload(model: Model, par: Parallelism, training: Training, dp: int) -> Workload:
    """The workload graph of one step for a validated layout."""
    p, v = par.pp, par.virtual_stages
    ops = pass_ops(model, par, training)
    split = chunk_layers(model.layers, par)
    hops = placement(par.schedule, p, v)
    virtual = {hop: k for k, hop in enumerate(hops)} if hops else {}
    # A separate LM head copy exists only when the first and last chunks sit apart.
    head_p = 1 if hops and hops[0][0] == hops[-1][0] else p
    # With two pipelines (DualPipe) the last stage's rank holds the other pipeline's
    # embedding, which its MTP modules share (DeepSeek-V3 §3.2.3): no copy of its own.
    mtp_copy = SCHEDULES[par.schedule].pipelines == 1
    chunks: dict[tuple[int, int], Chunk] = {}
    for stage in range(p):
        for c in range(v):
            vs, n = virtual.get((stage, c), c * p + stage), split[stage][c]
            first, last = vs == 0, vs == p * v - 1
            start = chunk_first_layer(split, stage, c, hops or None)
            amax_f, amax_b, accumulate = chunk_extras(model, par, training, n, first, last,
                                                      start)
            fwd, bwd, wgt = chunk_pass_ops(model, training, ops, n, first, last, start,
                                           (amax_f, amax_b))
            _, experts = layers_params_per_device(model, par.tp, par.expert_ranks, start, n,
                                                  par.etp)
            _, mtp_experts = mtp_params_per_device(model, par.tp, par.expert_ranks, par.etp,
                                                   head_p > 1 and mtp_copy) if last else (0, 0)
            chunks[(stage, c)] = Chunk(
                stage, c, vs, n, first, last,
                chunk_params(model, par.tp, n, first, last, head_p, par.expert_ranks, start,
                             par.etp),
                fwd, bwd, wgt, accumulate, expert_params=experts + mtp_experts,
            )
    pipelines = SCHEDULES[par.schedule].pipelines
    for stage in range(p if pipelines > 1 else 0):  # Chimera's up pipeline: stage p−1−s
        for c in range(v):
            chunks[(stage, v + c)] = replace(chunks[(p - 1 - stage, c)], stage=stage,
                                             chunk=v + c)
    work = replace(step_traffic(model, par, training, dp), chunks=chunks, optimizer={},
                   hops=hops, pipelines=pipelines, overlapped_pairs=pairs_overlap(par),
                   pair_comm_units=par.moe_comm_units if pairs_overlap(par) else 0)
    for stage in range(p):
        tensors = sum(param_tensors(model, c.layers, c.first, c.last, head_p)
                      for (s, _), c in chunks.items() if s == stage)
        work.optimizer[stage] = optimizer_step(par, training, work.stage_params(stage),
                                               tensors, shard_ranks(work, stage))
        stage_chunks = [c for (s, _), c in chunks.items() if s == stage]
        casts = step_weight_casts(
            training, weight_elements(op for c in stage_chunks for op in c.forward),
            FP8_LINEARS_PER_LAYER * sum(c.layers for c in stage_chunks))
        if casts is not None:
            work.optimizer[stage] = _with_weight_casts(work.optimizer[stage], casts)
    return work


def _with_weight_casts(optimizer: ComputeOp, casts: ComputeOp) -> ComputeOp:
    """The stage's optimizer step followed by the FP8 copies of its weights for the next
    step (:func:`llmsim.workload.fp8.step_weight_casts`), as one priced op: Transformer
    Engine makes them in the next step's first forward of each chunk, llmsim at the end of
    this step on the same device (the same time per step; the few milliseconds by which
    the casts also delay the pipeline's fill are not modelled)."""
    return replace(optimizer, bytes=optimizer.bytes + casts.bytes,
                   splits=optimizer.splits + casts.splits)
