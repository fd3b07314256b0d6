"""The token dispatcher's own work around a MoE layer's all-to-alls (:mod:`llmsim.moe`):
whether the dropless dispatchers wait on the host for the token counts, and the size of
HybridEP's routing-map all-gather, as read in the frameworks' code (docs/moe.md). The
layer's ops that use them are built in :mod:`llmsim.moe`."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llmsim.specs import Parallelism
    from llmsim.specs.model import MoE


def dispatch_syncs_host(moe: MoE, par: Parallelism) -> bool:
    """Whether the token dispatcher waits on the host for the token counts once per MoE
    layer's forward, before its dispatch all-to-all (dropless routing: the receive
    buffer's size and the grouped GEMM's splits are known only on the device).

    * ``alltoall`` (Megatron-Core ``MoEAlltoAllTokenDispatcher``): the NCCL all-to-all
      needs its input and output splits on the host; ``_maybe_dtoh_and_synchronize``
      waits on the event of their device-to-host copy (``d2h_event.synchronize()``)
      unless the input is dropped and padded to capacity (``drop_and_pad``);
    * ``hybridep``: ``HybridEPDispatch`` passes no ``num_permuted_tokens`` when dropless
      ("HybridEP obtains the size from a GPU tensor, which causes a D2H
      synchronization", Megatron-LM ``fused_a2a.py``), and HybridEP's
      ``metadata_preprocessing`` then calls ``cudaStreamSynchronize`` (DeepEP
      ``hybrid-ep`` branch, ``csrc/hybrid_ep/executor/executor.cu`` at 94a9f8f);
    * ``deepep`` (normal kernels): the host spins on the received-token counter the
      notify kernel writes to mapped memory (``moe_recv_counter``, DeepEP
      ``csrc/deep_ep.cpp``), with or without a capacity: across nodes "Internode dispatch
      does not support ``num_worst_tokens > 0``" (``deep_ep/buffer.py``);
    * ``deepep_low_latency``: fixed-size receive buffers, no wait;
    * ``deepspeed``: DeepSpeed's ``top1gating`` reads the expert counts back in every
      forward (``exp_counts = torch.sum(mask1, dim=0).detach().to('cpu')``,
      ``deepspeed/moe/sharded_moe.py`` at 07887f66), capacity or not.

    The backward reuses the forward's counts (the combine's handle), so it does not
    wait; a recomputed forward does again (it repeats the ops)."""
    if par.moe_dispatcher == "deepep_low_latency":
        return False
    return par.moe_dispatcher in ("deepep", "deepspeed") or moe.capacity_factor is None


ROUTING_MAP_ENTRY_BYTES = 1
"""Bytes of one (token, expert) entry of the routing map HybridEP gathers: ``torch.bool``
(``HybridEPBuffer.dispatch_with_permute`` asserts ``routing_map.dtype == torch.bool``,
DeepEP ``hybrid-ep`` branch ``deep_ep/hybrid_ep_buffer.py`` at 34152ae)."""


def routing_map_gather_bytes(tokens: float, experts: int, ranks: int) -> float:
    """Gathered size of HybridEP's routing-map all-gather, bytes (nccl-tests' all-gather
    convention: the output): each of the ``ranks`` of the expert-parallel group
    contributes its ``tokens × experts`` boolean map, ``ranks·tokens·experts·1``."""
    return ranks * tokens * experts * ROUTING_MAP_ENTRY_BYTES
