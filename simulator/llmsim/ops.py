"""The two kinds of operation in a workload graph: compute and communication.

Sizes are per device (already divided by tensor parallelism), so a cost model can
price an op from the op and the hardware alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from llmsim.specs import MemoryKind

ComputeKind = Literal["gemm", "attention", "memory"]
Phase = Literal["F", "B", "W", "R", "O"]
"""F forward, B input-gradient backward, W weight-gradient backward, R recompute, O optimizer."""
Collective = Literal["all_reduce", "all_gather", "reduce_scatter", "send_recv", "all_to_all",
                     "push_pull", "broadcast"]
Axis = Literal["tp", "cp", "ep", "dp", "pp", "stage", "cp+ep+dp", "cp+dp", "tp+ep", "etp",
               "xtp+ep"]
"""A parallel axis; ``stage``: every rank of one pipeline stage (all axes but pp); or a
group spanning several axes, named by them: ``cp+ep+dp`` the ranks that hold the same
dense weights (their gradient and ZeRO group), ``cp+dp`` those that hold the same
routed experts (Megatron-Core's expert-data-parallel group), ``tp+ep`` the ranks that
split the routed experts when each is whole on one rank (``expert_tp`` 1); with
``expert_tp`` between 1 and tp, ``etp`` the adjacent TP ranks that split one expert and
``xtp+ep`` the ranks that hold different experts (:meth:`llmsim.plan.Plan._sub_axes`)."""


@dataclass(frozen=True, slots=True)
class ComputeOp:
    """A kernel on one device."""

    name: str
    """Short name: ``qkv``, ``attn``, ``mlp_up``, ``ln1`` ..."""
    kind: ComputeKind
    """How it is priced: a GEMM, a fused attention kernel, or a memory-bound kernel."""
    phase: Phase
    """Where in the step it belongs."""
    flops: float
    """Floating-point operations on this device (model FLOPs; recompute ops are phase R)."""
    bytes: float
    """Bytes read and written from device memory."""
    mnk: tuple[int, int, int] | None = None
    """GEMM shape (M, N, K) for ``kind == "gemm"``; FLOPs = 2·M·N·K · batch."""
    batch: int = 1
    """Independent GEMMs of that shape launched together (batched GEMM)."""
    executed_fraction: float = 1.0
    """Share of ``flops`` the kernel really executes: causal flash attention skips the
    masked half (0.5); its backward recomputes the scores (FlashAttention-2: backward
    executes 2.5× the forward, against 2× counted as model FLOPs)."""
    dtype: str | None = None
    """Data type of the math when it differs from the training precision (FP8 training
    with Transformer Engine runs attention in BF16)."""
    splits: int = 1
    """The op runs as this many kernels, one launch each: a GEMM as GEMMs of ⌈M/splits⌉
    rows, one per chunk of the communication it is overlapped with (Transformer Engine's
    userbuffers); a memory-bound op as that many kernels over its bytes (a loop over
    tensors)."""
    concurrent_splits: int = 1
    """Chunks of a split GEMM that run at once, on separate streams, their tiles sharing
    the compute units."""
    reserved_units: int = 0
    """Compute units (SMs) that communication kernels running beside the kernel hold."""
    attention_shape: tuple[int, int] | None = None
    """(sequence length, head dimension) of a fused attention kernel: its efficiency
    depends on both (FlashAttention-2 is slower on short sequences and small heads)."""
    attention_heads: tuple[int, int] | None = None
    """(query heads, key-value heads) of a fused attention kernel on this device, times the
    micro-batch: the kernel's grid runs over both, so its rate depends on them."""
    attention_ring_steps: int = 1
    """Steps of the context-parallel ring a fused attention kernel runs as (cp; 1 without
    context parallelism): the first a causal square, the others non-causal blocks
    (:mod:`llmsim.costs.attention_tables`)."""
    memory_kind: MemoryKind = "stream"
    """What a memory-bound kernel (or a kernel's memory term) does: the accelerator's
    bandwidth depends on it (:meth:`llmsim.specs.Accelerator.memory_bytes_per_s`)."""
    output_bytes: float = 0.0
    """Bytes of the new tensor the kernel writes its result into (an eager framework
    allocates each op's output: a GEMM's M·N·batch values, an element-wise kernel's
    elements; a dropout mask beside it is not counted); 0 for in-place kernels and where
    not counted. Only a host allocator that maps fresh memory prices it
    (:mod:`llmsim.costs.allocator`)."""
    host_s: float = 0.0
    """Device idle a host synchronisation next to the kernel adds, seconds: the host waits
    for the device to drain, then reads the result and issues the next kernel
    (:mod:`llmsim.host_syncs`); it adds to the op's duration."""
    host_held: bool = False
    """Whether the host waits for the op to end on the device before it issues the next
    kernel (a ``torch.cuda.synchronize()`` after it, or at each of its steps:
    DistFlashAttn's attention, :mod:`llmsim.context_distflash`); False: the host goes on
    issuing while it runs (:mod:`llmsim.costs.host_issue`)."""
    host_held_tail: float = 0.0
    """With ``host_held``, the share of the op's device time (its ``host_s`` gaps left
    out) that runs after the host's last sync let it go: DistFlashAttn's last time step,
    one whole block of ½ + ⌊P/2⌋ (:mod:`llmsim.context_distflash`); 0: the host waits to
    the op's end (a sync after it)."""
    device_sync: bool = False
    """Whether the op's first host sync is ``torch.cuda.synchronize()``, which waits for
    every stream of the device (``cudaDeviceSynchronize``: "blocks until the device has
    completed all preceding requested tasks", CUDA Runtime API, Device Management), the
    collectives in flight on other streams included (a ZeRO-3/FSDP gather), not only the
    compute stream (a ``.item()`` or ``.cpu()`` read waits for the current stream alone):
    the engine's gathered passes (:meth:`llmsim.engine.gathers.WeightGathers._gathered_pass`)."""
    host_calls: int = 0
    """Host dispatches that issue the op's ``splits`` kernels (a framework's C++ loop over
    tensors is one call); 0: one per kernel."""
    ckpt_nodes: int = 0
    """Backward matmul nodes (``MmBackward0``) of a layer recomputed by a reentrant
    ``torch.utils.checkpoint`` that the op stands for, each costing the host extra work
    before it (:class:`llmsim.costs.host_issue.HostWork`); 0: none."""
    fsdp_hooks: Literal["forward", "backward"] | None = None
    """The op opens a ZeRO-3 unit's forward or backward, whose FSDP hooks the host runs
    before it (:class:`llmsim.costs.host_issue.HostWork`); None: no hooks."""
    host_loop_kernels: int = 0
    """Kernels a framework's C++ loop launches inside those calls, each costing the host a
    launch of its own beyond the call (Transformer Engine's per-expert quantisations and
    cuBLAS GEMMs, :mod:`llmsim.moe_host`); 0: the calls' dispatch covers every kernel."""

    @property
    def executed_flops(self) -> float:
        """FLOPs the kernel performs (what its run time depends on)."""
        return self.flops * self.executed_fraction


@dataclass(frozen=True, slots=True)
class CommOp:
    """A collective (or point-to-point transfer) among the members of one group.

    ``bytes`` follows nccl-tests' size convention: the full buffer of an all-reduce,
    the gathered output of an all-gather, the input of a reduce-scatter, the message of a
    send/recv or a broadcast.
    """

    name: str
    """Short name: ``tp_ar_attn``, ``dp_rs_bucket3``, ``pp_send`` ..."""
    collective: Collective
    """Collective kind."""
    axis: Axis
    """Parallel axis whose group runs it."""
    phase: Phase
    """Where in the step it belongs."""
    bytes: float
    """Message size in bytes (nccl-tests convention, see above)."""
    pairs_with: Literal["next", "previous"] | None = None
    """A sequence-parallel TP collective and the GEMM it can be pipelined with when TP
    communication overlap is on: the next GEMM for the all-gather that feeds it, the
    previous GEMM for the reduce-scatter of its output."""
    copies: int = 0
    """Device copies that go with the collective, one call each: PyTorch's tensor-list
    ``all_gather`` gathers into a new flat buffer and copies every rank's slice out."""
    staging_passes: int = 0
    """Passes of the whole message through device memory around the collective, one
    kernel each, each reading and writing it once: DeepSpeed's all-reduce fallback
    (``allreduce_and_copy``) flattens the bucket into one buffer, scales it and copies the
    result back into the gradients (3)."""
    within_node: bool = False
    """A send/recv between two members on one node (pipeline neighbours that share a node):
    it crosses the node's fabric, not the network, even when the group spans nodes."""
    two_rank: bool = False
    """A send/recv on a communicator of the pair alone (PyTorch's single ``isend`` or
    ``irecv``), not of the whole group (``batch_isend_irecv``): its channels are the pair's
    own, not the fewest any pair of the group has."""
    fill_passes: int = 0
    """Kernels that write the whole message once before the collective: DeepSpeed ZeRO-3 of
    2021 zero-fills each gathered buffer (``torch.zeros``) before its all-gather."""
    host_s: float = 0.0
    """Host CPU time spent before the collective can be issued, seconds, while nothing is
    queued on the device (DeepSpeed ZeRO-3 of 2021 builds its tensor list in a Python loop
    over the ranks after a ``torch.cuda.synchronize()``): it adds to the op's duration."""
    beside_weight_grad: bool = False
    """Megatron-LM's asynchronous TP all-reduce (``--async-tensor-model-parallel-allreduce``):
    the all-reduce of a column-parallel layer's input gradient runs while that layer's
    weight-gradient GEMM computes. Priced as overlapped, in bulk, with the input-gradient
    GEMM before it, which has the same FLOPs as the weight-gradient GEMM."""
    ring_steps: int = 0
    """A context-parallel ring exchange (:mod:`llmsim.context`): ``bytes`` is one step's
    block, sent beside the attention kernel that follows, in this many steps; the block
    keeps only the part the kernel does not hide."""
    ring_schedule: Literal["te_ring", "distflash"] = "te_ring"
    """Whose context-parallel schedule the exchange belongs to: it says how much of it the
    attention kernel hides (:data:`llmsim.cp_schedules.EXPOSED`)."""
