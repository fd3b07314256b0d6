"""The host synchronisations of a framework's training step, each a gap on the device.

Where the host waits for the device (a device-to-host read, ``torch.cuda.synchronize()``),
the device drains what was queued and then idles while the host wakes, goes on with its
Python and issues the next kernel: :data:`HOST_SYNC_GAP_S` (93.8 µs, measured
on an H100 host with PyTorch 2.11; taken for every device). A host that ran
ahead of the device loses its lead there, so the gap is paid even where pipeline messages
are overlapped. ``training.host_syncs`` says which a framework makes
(:data:`llmsim.specs.training.HostSyncs`); read from Megatron-LM as the Zero Bubble fork
ran it (sail-sg/zero-bubble-pipeline-parallelism at 6b74c58, Dec 2023, the paper's
commit):

* ``get_batch`` (``pretrain_gpt.py``) on the chunk with the embedding and the chunk with
  the LM head (``mpu.is_pipeline_first_stage()`` / ``is_pipeline_last_stage()``, virtual
  ranks counted: the other chunks return early) calls ``tensor_parallel.broadcast_data``,
  whose ``_build_key_size_numel_dictionaries`` reads the batch's sizes back with
  ``sizes_cuda.cpu()``: one sync before that chunk's forward, every micro-batch, then
  ``get_ltor_masks_and_position_ids``'s kernels (:func:`batch_ops`);
* ``loss_func`` asserts ``not loss.isnan()`` while ``check_for_nan_in_loss_and_grad`` is
  on (its flag ``--no-check-for-nan-in-loss-and-grad`` is off by default in the fork's
  ``megatron/arguments.py``): one sync after the LM head's forward (:func:`loss_ops`);
* ``_communicate`` (``megatron/core/pipeline_parallel/p2p_communication.py``) calls
  ``torch.cuda.synchronize()`` after every exchange when ``batch_p2p_comm and
  batch_p2p_sync`` ("to protect against race condition when using batch_isend_irecv()"):
  Megatron-LM's blocking schedules, not its overlapped interleaved one
  (``batch_p2p_comm`` is ``not overlap_p2p_comm``), nor the Zero Bubble runtime's own
  batched sends (``zb_schedules.py``), nor the interleaved cooldown's unbatched ones
  (:func:`exchange_sync_s`). A step's send and its receive go in one exchange
  (``send_forward_recv_backward``), so llmsim charges the gap with the send: the sender
  is blocked and the message is in only after it, which is also when the receiver's own
  exchange returns. The warmup's and cooldown's exchanges with a receive alone
  (``recv_forward``, ``recv_backward``: at most ``pp`` a step) are left out.

Megatron-LM of 2020–2021 made the same read-back before *every* chunk's forward
(``megatron_every_chunk`` and ``megatron_every_chunk_no_exchange_sync``): its
``forward_step`` calls ``get_batch`` on every stage and model chunk, with no early return
for the middle ones, and ``get_batch`` calls ``mpu.broadcast_data``
(``megatron/mpu/data.py`` ``_build_key_size_numel_dictionaries``: ``sizes_cpu =
sizes_cuda.cpu()``) and then ``get_ltor_masks_and_position_ids`` (``megatron/utils.py``:
the same FP32 ``torch.tril(torch.ones(...))`` s × s mask, compared ``< 0.5``). Read in
NVIDIA/Megatron-LM at c63906a (2020-09-29, ``pretrain_gpt2.py``, tensor parallelism
only), 1b8e289 (2021-01-29, ``pretrain_gpt.py``, ``forward_step(data_iterator, model,
input_tensor)``) and de7dc40 (2021-08-10, the SC21 scripts' commit,
``pretrain_gpt.py`` ``forward_step`` called by ``megatron/schedules.py`` for every
chunk). At de7dc40 ``megatron/p2p_communication.py`` ``_communicate`` ends every
exchange with ``torch.cuda.synchronize()`` ("To protect against race condition when
using batch_isend_irecv()"), unconditionally (``megatron_every_chunk``); at 1b8e289
``megatron/training.py`` ``communicate`` only waits on the requests (``req.wait()``) and
c63906a has no pipeline (``megatron_every_chunk_no_exchange_sync``). Not priced: these
versions' timers (``megatron/global_vars.py`` ``Timer.start``/``stop`` call
``torch.cuda.synchronize()``) around ``get_batch`` (``batch-generator``), each forward
and backward (``forward-compute``, ``backward-compute``) and each exchange: more syncs a
micro-batch, back to back with the ones above. The same code on a CPU (DeepSpeedFugaku
8e0eabb on A64FX) makes none: its sizes are a host tensor, ``.cpu()`` returns it, and
there is no device queue to drain (``none``; the mask kernels it runs on the host are
not priced).

Megatron-Core's ``pretrain_gpt.py`` (NVIDIA/Megatron-LM f2e5db402c, 2024-07-15, the
README's H100 table's commit; ``megatron_core``) reads nothing of the batch back:
``get_batch_on_this_tp_rank`` broadcasts tensors of known shapes
(:mod:`llmsim.workload.small_calls`). Its last stage makes two host reads a micro-batch
after the LM head's forward: ``loss_func``'s ``assert not loss[0].isnan()`` under
``--check-for-nan-in-loss-and-grad`` (on by default), and the schedule's
``total_num_tokens += num_tokens.item()`` (``megatron/core/pipeline_parallel/
schedules.py``, every schedule; ``num_tokens`` is the loss's token count on the device
there, a host tensor on the other stages); ``_communicate`` syncs after each batched
exchange when ``batch_p2p_comm and batch_p2p_sync`` (the same rule as the Zero Bubble
fork's). Its timers sync only at ``--timing-log-level`` 2 (``forward-compute``), off by
default. NeMo 24.03 (NVIDIA/NeMo v1.23.0 on megatron_core 0.5.0; ``megatron_p2p_sync``)
copies each rank's own batch to the device (no read-back), has no NaN check in its
training ``loss_func`` and no ``num_tokens.item()`` in Megatron-Core 0.5.0's schedules,
and keeps ``batch_p2p_sync`` on (``megatron_base_model.py``: "call
torch.cuda.synchronize() after batch isend/rcv", with Megatron-Core's default
``batch_p2p_comm``): the exchange sync alone.

Which wait for what: ``torch.cuda.synchronize()`` (``cudaDeviceSynchronize``) waits for
every stream of the device, a weight gather in flight on another stream included
(``ComputeOp.device_sync``: ``training.host_syncs: attention`` and DistFlashAttn's
per-step syncs, :mod:`llmsim.context_distflash`); ``.cpu()`` and ``.item()`` copy on the
current stream and wait for it alone (``get_batch``'s and the NaN check's: a gap on the
compute stream). Megatron-LM's exchange sync is device-wide too but is priced as a gap
(:func:`exchange_sync_s`), without the engine's wait for other streams.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from llmsim.ops import CommOp, ComputeOp
from llmsim.specs import Parallelism
from llmsim.specs.training import HostSyncs, Training

Op = ComputeOp | CommOp

HOST_SYNC_GAP_S = 93.8e-6
"""GPU idle one host synchronisation in the stream adds, seconds: the device drains what
the host queued and then waits while the host wakes, reads the counts, allocates the
receive buffer and launches the next kernel. Measured on an H100 SXM5 with PyTorch
2.11 eager (``benchmarks/host_sync_gap.py``, 300 interleaved trials, the median with a
sync less the median without: 93.8 µs, 95.2 µs on a rerun;
``benchmarks/results/h100-2026-11-27-host-sync/``). A lower bound for a framework: a
dispatcher's Python between the sync and its kernel adds to it. Taken for every device
(an A100's or an MI250X's host and driver were not measured)."""

MASK_BYTES_PER_POSITION = 17
"""Bytes ``get_ltor_masks_and_position_ids`` moves per entry of its s × s causal mask (no
per-document reset, so one mask for the micro-batch): ``torch.ones`` writes 4 (FP32),
``torch.tril`` reads and writes 8, ``attention_mask < 0.5`` reads 4 and writes 1."""

MASK_KERNELS = 5
"""Kernels of ``get_ltor_masks_and_position_ids``: the ones, the tril, the comparison, the
loss mask's ones and the position ids' ``arange``."""


@dataclass(frozen=True)
class MegatronSyncs:
    """Where one Megatron-LM version makes its host syncs (module docstring)."""

    batch_chunks: Literal["none", "ends", "every"]
    """Chunks whose forward starts with ``get_batch``'s read-back of the sizes and its
    masks: none, the embedding's and the LM head's, or every chunk."""
    loss_syncs: tuple[str, ...]
    """The host reads after the LM head's forward on the last stage, by name."""
    exchange_sync: bool
    """A ``torch.cuda.synchronize()`` ends each blocking, batched pipeline exchange."""


MEGATRON_SYNCS: dict[HostSyncs, MegatronSyncs] = {
    "megatron": MegatronSyncs("ends", (), True),
    "megatron_nan_check": MegatronSyncs("ends", ("loss_nan_check",), True),
    "megatron_every_chunk": MegatronSyncs("every", (), True),
    "megatron_every_chunk_no_exchange_sync": MegatronSyncs("every", (), False),
    "megatron_core": MegatronSyncs("none", ("loss_nan_check", "loss_tokens_item"), True),
    "megatron_p2p_sync": MegatronSyncs("none", (), True),
}
"""The ``training.host_syncs`` values that make Megatron-LM's syncs, and where."""

MEGATRON = frozenset(MEGATRON_SYNCS)
"""The ``training.host_syncs`` values that make Megatron-LM's syncs."""


def batch_ops(training: Training, ends: bool = True) -> tuple[ComputeOp, ...]:
    """``get_batch``'s kernels before a chunk's forward (``ends``: the chunk holds the
    embedding or the LM head): the causal mask and position ids, issued after the host
    read the batch's sizes back (the sync's gap, ``host_s``). The loss mask and position
    ids (b·s values) are not counted in the bytes. Empty where the framework makes no such
    sync before this chunk."""
    syncs = MEGATRON_SYNCS.get(training.host_syncs)
    if syncs is None or syncs.batch_chunks == "none" or not (
            ends or syncs.batch_chunks == "every"):
        return ()
    s = training.seq_len
    return (ComputeOp("batch_masks", "memory", "F", 0.0, MASK_BYTES_PER_POSITION * s * s,
                      splits=MASK_KERNELS, host_s=HOST_SYNC_GAP_S),)


def loss_ops(training: Training) -> tuple[ComputeOp, ...]:
    """The host's reads of the loss after the LM head's forward, each one kernel on one
    value read by the host (the sync's gap, ``host_s``): the NaN check
    (``loss.isnan()``), and Megatron-Core's token count (``num_tokens.item()``); empty
    without them."""
    syncs = MEGATRON_SYNCS.get(training.host_syncs)
    names = syncs.loss_syncs if syncs is not None else ()
    return tuple(ComputeOp(name, "memory", "F", 0.0, 0.0, host_s=HOST_SYNC_GAP_S)
                 for name in names)


def exchange_sync_s(training: Training, par: Parallelism) -> float:
    """The gap after each blocking pipeline exchange, seconds: Megatron-LM's
    ``torch.cuda.synchronize()`` after a batched ``batch_isend_irecv`` (0 with overlapped
    messages, without a pipeline, or where the framework makes no such sync)."""
    syncs = MEGATRON_SYNCS.get(training.host_syncs)
    if syncs is None or not syncs.exchange_sync or par.pp == 1 or par.overlap_pp_comm:
        return 0.0
    return HOST_SYNC_GAP_S


def apply_attention_syncs(lists: tuple[list[Op], ...],
                          training: Training) -> tuple[list[Op], ...]:
    """A block's op lists with a ``torch.cuda.synchronize()`` before and after each fused
    attention kernel (``training.host_syncs: attention``): the host waits for the device
    to drain before it issues the kernel (a gap, ``host_s``) and again until the kernel
    ends (a second gap; ``host_held``: the host issues the next kernel only then, so its
    work after the kernel no longer runs ahead of the device); both are device-wide
    (``device_sync``: they wait for a weight gather in flight too). Unchanged for other
    settings."""
    if training.host_syncs != "attention":
        return lists
    return tuple([replace(op, host_s=op.host_s + 2 * HOST_SYNC_GAP_S, host_held=True,
                          device_sync=True)
                  if isinstance(op, ComputeOp) and op.kind == "attention" else op
                  for op in ops] for ops in lists)
