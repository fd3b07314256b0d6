"""The small collectives a micro-batch makes outside the transformer layers: the
vocab-parallel cross-entropy's all-reduces, the batch's broadcast to the tensor-parallel
group and the loss's average for logging, as ``training.small_calls`` says a framework
makes them (:data:`llmsim.specs.training.SmallCalls`).

Each is a blocking call on the device's stream (``torch.distributed`` without
``async_op``): the kernels after it wait for it, so it is priced on the critical path
at its own size, one event per call. All carry kilobytes, so each costs about one
collective's latency on its group.

Read from the code (sources by repository, commit and file):

* ``lumped`` (frameworks whose code was not read for this): the cross-entropy's
  reductions as one all-reduce of three FP32 values a token, nothing else.
* ``megatron_mpu``: Megatron-LM of 2021 (NVIDIA/Megatron-LM de7dc40, the SC21 scripts'
  commit) and DeepSpeedFugaku (Fugaku-LLM/DeepSpeedFugaku 8e0eabb), the same code.
  ``megatron/mpu/cross_entropy.py`` ``_VocabParallelCrossEntropy.forward`` makes three
  all-reduces over the TP group, each of one FP32 value a token (the logits' ``max``, the
  predicted logit's ``SUM``, the sum of exponentials' ``SUM``; ``gpt_model.py`` passes
  ``output.float()``). ``pretrain_gpt.py`` ``forward_step`` calls ``get_batch`` on every
  pipeline stage and model chunk, and its ``mpu.broadcast_data`` (``megatron/mpu/data.py``)
  makes two broadcasts from the TP group's first rank: the sizes (``_MAX_DATA_DIM`` 5
  int64 per key, one key ``text``) and the data (b·(s + 1) int64 tokens). The last stage's
  ``loss_func`` all-reduces the loss (one FP32 value) over the data-parallel group
  (``megatron/utils.py`` ``average_losses_across_data_parallel_group``).
* ``megatron_2020``: Megatron-LM of September 2020 (NVIDIA/Megatron-LM c63906a, tensor
  parallelism only): the same three cross-entropy all-reduces and two broadcasts
  (``_MAX_DATA_DIM`` 4), and the loss averaged over every rank (``pretrain_gpt2.py``
  ``forward_step`` → ``megatron/utils.py`` ``reduce_losses``: ``all_reduce`` on the
  default group), here the ``stage`` group, which is the whole job without a pipeline.

``broadcast_data`` also reads the sizes back to the host (``sizes_cuda.cpu()``); that
synchronisation is :mod:`llmsim.host_syncs`' (``training.host_syncs``), not counted here.
With tensor parallelism 1 the TP calls are calls on a group of one and cost nothing.

* ``megatron_deepspeed_pipe``: BigScience's Megatron-DeepSpeed (bigscience-workshop/
  Megatron-DeepSpeed 8387ae17, BLOOM) and its TurkuNLP fork (TurkuNLP/Megatron-DeepSpeed
  6732bc9) under DeepSpeed's ``PipelineEngine`` (``GPTModelPipe``): the same three
  cross-entropy all-reduces (``gpt_model.py`` ``CrossEntropy`` →
  ``mpu.vocab_parallel_cross_entropy(output.float())``) and ``get_batch_pipe``'s two
  broadcasts, which the engine runs as its ``batch_fn`` on the first and last stages only
  (``deepspeed/runtime/pipe/schedule.py`` ``TrainSchedule``: ``LoadMicroBatch`` where
  ``stage_id == 0 or stage_id == stages - 1``; DeepSpeed v0.6.0 and v0.8.1). The loss is
  averaged once a step (``PipelineEngine._aggregate_total_loss``), not a micro-batch: not
  counted here.
* ``megatron_core``: Megatron-LM with Megatron-Core (NVIDIA/Megatron-LM f2e5db402c,
  2024-07-15, the README's H100 table's commit): the unfused vocab-parallel cross-entropy
  (``megatron/core/tensor_parallel/cross_entropy.py`` ``VocabParallelCrossEntropy.forward``:
  three TP all-reduces, ``MAX`` then two ``SUM``; ``--cross-entropy-loss-fusion``, off by
  default, would make two). ``pretrain_gpt.py`` ``get_batch`` returns early on the middle
  stages (virtual ranks counted) and ``get_batch_on_this_tp_rank``
  (``megatron/training/utils.py``) broadcasts each tensor from the TP group's first rank on
  its own, shapes known, no size broadcast: at pp 1 the tokens, labels, loss mask (FP32),
  attention mask and position ids; on the first stage the tokens, attention mask and
  position ids, on the last the labels, loss mask and attention mask (llmsim puts the
  first stage's three before both ends' chunks: the last stage's FP32 loss mask is priced
  at the int64 size, 4·b·s bytes over). The attention mask is b × 1 × s × s ``torch.bool``
  (b·s² bytes: 16 MiB at s = 4,096), made by the dataset unless the run passes
  ``--no-create-attention-mask-in-dataloader`` (``create_attention_mask_in_dataloader`` on
  by default, ``megatron/training/arguments.py``); ``megatron_core_no_mask``: the same
  without it. ``loss_func`` all-reduces the loss and its token count (two FP32 values)
  over the data-parallel group every micro-batch (``reporting_loss``).
* ``nemo``: NeMo 24.03 (NVIDIA/NeMo v1.23.0 with megatron_core 0.5.0, its
  ``requirements_nlp.txt``): Megatron-Core's unfused cross-entropy, three TP all-reduces
  (``core_v0.5.0`` ``tensor_parallel/cross_entropy.py``); no batch broadcast:
  ``MegatronGPTModel.get_batch`` takes each rank's own batch from its data loader and
  copies the stage's tensors to the device (``.cuda(non_blocking=True)``,
  ``nemo/collections/nlp/models/language_modeling/megatron_gpt_model.py``); the loss
  all-reduced over the context-parallel group where cp > 1 (``loss_func``), then averaged
  over the data-parallel group (``average_losses_across_data_parallel_group``), both one
  FP32 value, every micro-batch. NeMo 1.17 (``v1.17.0_pt_23.04``, MLPerf Training v3.0's
  GPT-3) makes the same calls: apex's ``transformer/tensor_parallel/cross_entropy.py``
  (three all-reduces, unchanged from 2022-08 to the 23.04 container), each rank's own
  batch, the loss averaged over dp; it has no context parallelism (the cp call is on a
  group of one).
* ``megatron_bridge``: NVIDIA-NeMo/Megatron-Bridge's performance scripts (97ad8cc6f with
  Megatron-LM 92c8482e, 21d102f5e with 44151194): ``scripts/performance/utils/
  overrides.py`` sets ``cross_entropy_fusion_impl = "te"`` and the model provider keeps
  ``cross_entropy_loss_fusion`` on (``gpt_provider.py``), so Megatron-Core's
  ``LanguageModule.compute_language_model_loss`` calls Transformer Engine's
  ``parallel_cross_entropy``, whose Triton forward (``transformer_engine/pytorch/triton/
  cross_entropy.py`` ``cross_entropy_forward``, v2.8 and v2.9) all-gathers three FP32
  values a token (``m_d_X_y``: the maximum, the sum of exponentials, the predicted logit)
  from every TP rank in one ``all_gather_into_tensor``; no batch broadcast
  (``gpt_step.py`` ``get_batch_from_iterator``: each rank's own batch, copied to the
  device); ``masked_next_token_loss`` (``training/losses.py``) returns the loss and its
  token count without a collective (their reduction for logging, outside the
  micro-batches' loop, is not counted).
"""

from __future__ import annotations

from dataclasses import dataclass

from llmsim.ops import Axis, CommOp
from llmsim.specs.training import SmallCalls

FP32_BYTES = 4
INT64_BYTES = 8
BOOL_BYTES = 1


@dataclass(frozen=True)
class CallSet:
    """The small calls one framework makes per micro-batch outside the layers."""

    cross_entropy_all_reduces: int
    """TP all-reduces of the vocab-parallel cross-entropy, each of one FP32 value a token
    (``lumped``: one of three values a token)."""
    size_slots: int
    """int64 slots of ``broadcast_data``'s size broadcast (``_MAX_DATA_DIM`` times the one
    key); 0: no batch broadcast."""
    loss_average_axis: Axis | None
    """Group of the logging all-reduce of the loss (one FP32 value) on the last stage."""
    broadcast_on_every_chunk: bool = True
    """The batch is broadcast before every chunk's forward (Megatron's ``forward_step``);
    False: before the first and last stages' only (DeepSpeed's ``LoadMicroBatch``,
    Megatron-Core's ``get_batch``)."""
    per_tensor_batch: bool = False
    """The batch goes as one broadcast per tensor, shapes known (Megatron-Core's
    ``get_batch_on_this_tp_rank``), not ``broadcast_data``'s sizes and packed tokens."""
    attention_mask: bool = False
    """With :attr:`per_tensor_batch`: the b·s² bool attention mask is among them."""
    loss_values: int = 1
    """FP32 values of the loss average (Megatron-Core: the loss and its token count)."""
    cross_entropy_all_gather: bool = False
    """The cross-entropy's reductions are one TP all-gather of three FP32 values a token
    from each rank (Transformer Engine's ``parallel_cross_entropy``), not all-reduces."""
    loss_context_all_reduce: bool = False
    """The loss is all-reduced over the context-parallel group first (one FP32 value)."""


CALL_SETS: dict[SmallCalls, CallSet] = {
    "lumped": CallSet(1, 0, None),
    "megatron_mpu": CallSet(3, 5, "dp"),
    "megatron_2020": CallSet(3, 4, "stage"),
    "megatron_deepspeed_pipe": CallSet(3, 5, None, broadcast_on_every_chunk=False),
    "megatron_core": CallSet(3, 0, "dp", False, per_tensor_batch=True, attention_mask=True,
                             loss_values=2),
    "megatron_core_no_mask": CallSet(3, 0, "dp", False, per_tensor_batch=True,
                                     loss_values=2),
    "nemo": CallSet(3, 0, "dp", loss_context_all_reduce=True),
    "megatron_bridge": CallSet(0, 0, None, cross_entropy_all_gather=True),
}
"""Each ``training.small_calls`` value's calls (module docstring for the sources)."""


def cross_entropy_calls(small_calls: SmallCalls, tokens: int, tp: int) -> list[CommOp]:
    """The vocab-parallel cross-entropy's TP all-reduces of a micro-batch of ``tokens``
    tokens on a device, in the order the forward makes them (none at ``tp`` 1)."""
    if tp == 1:
        return []
    if CALL_SETS[small_calls].cross_entropy_all_gather:
        return [CommOp("loss_tp_gather", "all_gather", "tp", "F",
                       float(3 * FP32_BYTES * tokens * tp))]
    calls = CALL_SETS[small_calls].cross_entropy_all_reduces
    if calls == 1:
        return [CommOp("loss_tp", "all_reduce", "tp", "F", float(3 * FP32_BYTES * tokens))]
    names = ("loss_tp_max", "loss_tp_predicted", "loss_tp_sum_exp")
    return [CommOp(name, "all_reduce", "tp", "F", float(FP32_BYTES * tokens))
            for name in names[:calls]]


def broadcast_on_every_chunk(small_calls: SmallCalls) -> bool:
    """Whether the batch's broadcasts come before every chunk's forward (else before the
    first and last stages' chunks only)."""
    return CALL_SETS[small_calls].broadcast_on_every_chunk


def batch_broadcasts(small_calls: SmallCalls, micro_batch: int, seq_len: int,
                     tp: int, pp: int = 1) -> tuple[CommOp, ...]:
    """The batch's TP broadcasts before a chunk's forward (none at ``tp`` 1 or where the
    framework makes none): ``broadcast_data``'s two, the batch's sizes, then its
    b·(s + 1) int64 tokens; or Megatron-Core's one per tensor (five at ``pp`` 1, else the
    first stage's three)."""
    calls = CALL_SETS[small_calls]
    if tp == 1:
        return ()
    if calls.per_tensor_batch:
        return _per_tensor_broadcasts(calls, micro_batch, seq_len, pp)
    if calls.size_slots == 0:
        return ()
    return (CommOp("batch_sizes_bcast", "broadcast", "tp", "F",
                   float(INT64_BYTES * calls.size_slots)),
            CommOp("batch_bcast", "broadcast", "tp", "F",
                   float(INT64_BYTES * micro_batch * (seq_len + 1))))


def _per_tensor_broadcasts(calls: CallSet, micro_batch: int, seq_len: int,
                           pp: int) -> tuple[CommOp, ...]:
    """Megatron-Core's ``get_batch_on_this_tp_rank``: the tokens, labels, loss mask,
    attention mask and position ids at ``pp`` 1; else the tokens, attention mask and
    position ids (the last stage's labels, mask and loss mask priced as those)."""
    tokens = float(micro_batch * seq_len)
    sizes = {"batch_tokens_bcast": INT64_BYTES * tokens}
    if pp == 1:
        sizes |= {"batch_labels_bcast": INT64_BYTES * tokens,
                  "batch_loss_mask_bcast": FP32_BYTES * tokens}
    if calls.attention_mask:
        sizes["batch_attention_mask_bcast"] = BOOL_BYTES * tokens * seq_len
    sizes["batch_position_ids_bcast"] = INT64_BYTES * tokens
    return tuple(CommOp(name, "broadcast", "tp", "F", float(size))
                 for name, size in sizes.items())


def loss_average(small_calls: SmallCalls) -> tuple[CommOp, ...]:
    """The last stage's all-reduce of the micro-batch's loss for logging (one FP32 value;
    Megatron-Core's two, the loss and its token count), after NeMo's context-parallel
    one, or none (a one-rank group costs nothing)."""
    calls = CALL_SETS[small_calls]
    context: tuple[CommOp, ...] = (
        (CommOp("loss_cp", "all_reduce", "cp", "F", float(FP32_BYTES)),)
        if calls.loss_context_all_reduce else ())
    if calls.loss_average_axis is None:
        return context
    return (*context, CommOp("loss_average", "all_reduce", calls.loss_average_axis, "F",
                             float(FP32_BYTES * calls.loss_values)))

