"""Parallel layout: degrees, pipeline schedule, ZeRO, recompute and overlap switches."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, NonNegativeInt, PositiveInt, field_validator, model_validator

from llmsim.specs._base import Spec
from llmsim.specs.parallelism_rules import check_layout_rules
from llmsim.specs.tp_overlap import TpOverlapGemm, TpOverlapGemmName

ScheduleName = Literal["gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2", "zb-v",
                       "chimera", "dualpipe", "pipedream"]
Axis = Literal["tp", "cp", "ep", "dp", "pp"]
CpSchedule = Literal["te_ring", "distflash"]
"""How context-parallel attention is scheduled (:attr:`Parallelism.cp_schedule`)."""
_BOOL_WORDS = ("true", "false", "yes", "no", "on", "off", "1", "0", "t", "f", "y", "n")
"""The strings pydantic reads as a boolean (its lax mode)."""


class Parallelism(Spec):
    """How the model and the batch are split over devices."""

    tp: PositiveInt = 1
    """Tensor-parallel degree (Megatron column/row split inside a layer)."""
    pp: PositiveInt = 1
    """Pipeline-parallel degree (stages)."""
    dp: int | Literal["auto"] = "auto"
    """Data-parallel degree, or ``auto`` for whatever the devices leave."""
    cp: PositiveInt = 1
    """Context-parallel degree: each sequence split over ``cp`` ranks, attention by ring
    exchange of the key/value blocks (Megatron-Core ``--context-parallel-size``)."""
    cp_schedule: CpSchedule = "te_ring"
    """Whose context-parallel attention runs: ``te_ring``, Transformer Engine's ring
    (Megatron-Core, :mod:`llmsim.context`), or ``distflash``, DistFlashAttn's load-balanced
    schedule of ⌊cp/2⌋ + 1 steps (Li et al. 2024, Algorithm 2; :mod:`llmsim.context_distflash`).
    Only with cp ≥ 2 (at cp 1 there is no context-parallel attention to schedule)."""
    ep: PositiveInt = 1
    """Expert-parallel degree: the routed experts of a MoE layer split over ``ep`` ranks,
    which hold different sequences (and so add to data parallelism for the dense weights);
    tokens reach their experts by all-to-all (Megatron-Core
    ``--expert-model-parallel-size``)."""
    expert_tp: PositiveInt | None = None
    """Tensor-parallel degree of the routed experts (Megatron-Core
    ``--expert-tensor-parallel-size``). None: ``tp``, each expert's matrices split over
    the TP group like the dense MLP's. 1: every expert whole on one rank, the ``tp``
    ranks of a TP group joining the expert-parallel group instead, so that the experts
    are split over ``tp·ep`` ranks and Megatron-Core's ``--expert-model-parallel-size``
    is ``tp·ep`` (see :attr:`expert_ranks`). Any divisor ``e`` of tp: each expert split
    over ``e`` adjacent TP ranks, the ``tp/e`` such groups of a TP group holding different
    experts (Megatron-Core's layout rule ``tp·cp·dp = expert_tp·ep·expert_dp`` in its own
    counts, which llmsim's ``ep`` axis and ``dp`` satisfy for every divisor)."""
    moe_a2a_overlap: bool = False
    """Hide the MoE token all-to-alls behind computation (Megatron-Core
    ``--overlap-moe-expert-parallel-comm``, DeepSeek-V3's DualPipe-style overlap of one
    micro-batch's forward with another's backward): each dispatch and combine costs only
    what exceeds the expert GEMM it is paired with (:mod:`llmsim.moe`). Needs ep > 1 or
    ``expert_tp`` 1 with tp > 1, and Megatron-Core's layer: DeepSpeed's (``moe_dispatcher:
    deepspeed``, ``training.expert_loop: deepspeed_uneven``) runs its all-to-alls in line."""
    moe_dispatcher: Literal["alltoall", "deepep", "deepep_low_latency", "hybridep",
                            "deepspeed"] = "alltoall"
    """How the MoE tokens cross nodes. ``alltoall``: one NCCL all-to-all of the routed
    rows, a token sent once per expert it is routed to (Megatron-Core's ``alltoall``
    dispatcher). ``deepep``: DeepSeek's dispatch and combine kernels (DeepSeek-V3 report
    §3.2.2; DeepEP, Megatron-Core ``--moe-token-dispatcher-type flex`` with
    ``--moe-enable-deepep``): a token crosses the network once per node its experts are
    on, to the GPU of the same index there, which forwards it over NVLink to its experts
    (:mod:`llmsim.costs.alltoall`), at the rates DeepEP's normal kernels reached
    (:mod:`llmsim.costs.deepep`). ``deepep_low_latency``: DeepEP's low-latency kernels,
    every row straight to its expert's GPU over RDMA, at their measured rates.
    ``hybridep``: NVIDIA's HybridEP (Megatron-Core's flex dispatcher ``hybridep``
    backend), DeepEP's path at HybridEP's measured H100 rates. ``deepspeed``: DeepSpeed's
    ``MOELayer`` of 2021-22 (GShard's einsums): the all-to-all of ``alltoall``, with dense
    GEMMs over one-hot ``[tokens, experts, capacity]`` masks in place of the row
    permutations and a host read of the expert counts in every forward
    (:mod:`llmsim.moe_einsum`); needs a capacity factor."""
    moe_max_nodes: PositiveInt | None = None
    """Node-limited routing: each token's experts on at most this many nodes (DeepSeek-V3
    §2.1.2, M = 4; Megatron-Core ``--moe-router-group-topk`` with one group a node). It
    changes the price only with ``moe_dispatcher: deepep``, whose network traffic grows
    with the nodes a token reaches. None: no limit."""
    moe_comm_units: NonNegativeInt = 0
    """Compute units (SMs) the all-to-all kernels hold beside the computation while an
    overlapped pair runs (``moe_a2a_overlap`` under DualPipe, :mod:`llmsim.engine.pairs`):
    the pair's computation runs on the units left. DeepSeek-V3 dedicates 20 of the
    H800's 132 SMs to its dispatch and combine kernels (report §3.2.2). 0: none held."""
    moe_shared_expert_overlap: bool = False
    """Run the MoE shared experts' forward beside the token all-to-alls: the first
    projection during the dispatch, the second during the combine (Megatron-Core
    ``--moe-shared-expert-overlap``; forward only). Needs shared experts and ep > 1."""
    schedule: ScheduleName = "1f1b"
    """Pipeline schedule."""
    virtual_stages: PositiveInt = 1
    """Model chunks per pipeline stage (interleaved 1F1B; 2 for ZB-V)."""
    first_stage_layers: NonNegativeInt | None = None
    """Transformer layers on the first stage, which also runs the embedding (default: an
    even split). The stages without a count split the remaining layers evenly
    (Megatron-Core ``--decoder-first-pipeline-num-layers``); see :mod:`llmsim.partition`."""
    last_stage_layers: NonNegativeInt | None = None
    """Transformer layers on the last stage, which also runs the LM head and loss
    (Megatron-Core ``--decoder-last-pipeline-num-layers``)."""
    layers_per_stage: list[PositiveInt] | None = None
    """Transformer layers on each pipeline stage, first to last, when stages hold unequal
    shares (a heterogeneous job's stages on node groups of different speeds, balanced by
    :func:`llmsim.hetero.balance_layers`); None: the split above (even, or
    ``first_stage_layers`` / ``last_stage_layers``)."""
    micro_batch: PositiveInt = 1
    """Sequences per micro-batch."""
    zero: int = Field(default=0, ge=0, le=3)
    """ZeRO stage: 1 shards optimizer state, 2 also gradients, 3 also weights."""
    sequence_parallel: bool = False
    """Megatron sequence parallelism: norms/dropout split over TP, RS+AG instead of AR."""
    async_tp_allreduce: bool = False
    """Without sequence parallelism: the backward all-reduce of each column-parallel
    layer's input gradient runs while the layer's weight gradient is computed
    (Megatron-LM ``--async-tensor-model-parallel-allreduce``: its default once the flag
    existed, ``--no-async-tensor-model-parallel-allreduce`` in ``arguments.py`` turns it
    off), instead of blocking before it."""
    sync_tp_duplicated_parameters: bool = False
    """Megatron-DeepSpeed's ``--sync-tp-duplicated-parameters`` (the BigScience fork and
    TurkuNLP's, ``megatron/model/fused_layer_norm.py`` and ``megatron/mpu/layers.py``):
    every forward of a layer norm all-reduces (AVG) its weight and bias, and every
    row-parallel linear its bias, over the TP group, each its own blocking call before
    the kernel that reads it: six all-reduces of a hidden vector a block a forward (and
    again in a recomputed forward), two at the final norm."""
    recompute: Literal["none", "selective", "full", "full_keep_attention"] = "none"
    """Activation recomputation: none, attention core only, every layer, or every op of the
    layer but the fused attention kernel (``full_keep_attention``: DistFlashAttn's
    rematerialization-aware checkpointing, Li et al. 2024 §3.3, which keeps the attention
    output and its log-sum-exp and ends each checkpoint at the attention kernel)."""
    recompute_norms_and_up_proj: bool = False
    """Recompute every RMSNorm, and MLA's up-projections, in the backward instead of
    storing their outputs (DeepSeek-V3 report §3.2.3, "Recomputation of RMSNorm and MLA
    Up-Projection"): a block keeps its norms' inputs and MLA's latents, not the normalised
    tensors nor the per-head queries, keys and values. Not with ``recompute: full``,
    which recomputes them already."""
    overlap_dp_comm: bool = True
    """Overlap the gradient reduction with the backward pass (bucketed)."""
    grad_reduce_dtype: Literal["fp32", "bf16", "fp16"] | None = None
    """Data type of the data-parallel gradient reduction. None: Megatron-LM's default for
    the training precision, FP32 for BF16 and FP8 (``accumulate_allreduce_grads_in_fp32``)
    and FP16 for FP16; NeMo's distributed Adam takes ``grad_sync_dtype``."""
    overlap_tp_comm: bool = False
    """Overlap each sequence-parallel all-gather / reduce-scatter with a GEMM as Transformer
    Engine's userbuffers do (Megatron-LM ``--tp-comm-overlap``, which requires
    ``--sequence-parallel``): the all-gathers feeding a GEMM by ring exchange, the GEMM cut
    into ``tp`` chunks; the forward reduce-scatters pipelined with their GEMM cut into
    ``tp_overlap_rs_splits`` chunks; the backward ones beside the gradient GEMMs.
    Except the ring exchanges, the transfers' kernels hold ``tp_overlap_comm_units``
    compute units while their GEMMs run."""
    tp_overlap_rs_splits: PositiveInt = 4
    """Chunks of a forward GEMM pipelined with its reduce-scatter (Transformer Engine's
    ``pipeline`` method, default ``num_splits`` 4)."""
    tp_overlap_comm_units: NonNegativeInt = 16
    """Compute units (SMs) the TP overlap's communication kernels hold while their GEMMs
    run (Transformer Engine's ``num_sm``, default 16 for its ``pipeline`` and ``bulk``
    methods; its ring exchanges move data with copy engines and hold none)."""
    tp_overlap_gemms: dict[TpOverlapGemmName, TpOverlapGemm] = Field(default_factory=dict)
    """Per-GEMM overrides of the overlap above, keyed by Transformer Engine's names (a
    ``--tp-comm-overlap-cfg`` / ``ub_tp_comm_overlap_cfg`` file): an entry replaces the
    default method, SMs and chunks of that GEMM; the others keep TE's defaults
    (``tp_overlap_rs_splits``, ``tp_overlap_comm_units``)."""
    tp_overlap_concurrent_chunks: PositiveInt = 1
    """Chunks of a TP-overlapped split GEMM priced as running at once, their tiles sharing
    the compute units. Transformer Engine launches the chunks on 3 streams in turn
    (``_stream_compute[i % NVTE_COMM_OVERLAP_MAX_STREAMS]``), but how far they overlap
    depends on when each chunk's data arrives and how the kernels share the SMs, which no
    measurement llmsim has gives: 1 prices them one after another (the slow bound), 3 lets
    three share the units whenever they fit (the fast bound)."""
    overlap_param_gather: bool = False
    """ZeRO-1/2: all-gather the updated weights during the next step's first forward, one
    layer ahead of the compute, instead of after the optimizer (Megatron-LM
    ``--overlap-param-gather``)."""
    prefetch_weights: bool | Literal["forward"] = True
    """Gather each layer's weights (ZeRO-3, or the ``overlap_param_gather`` forward) one
    layer ahead of its compute. False: a layer's all-gather starts only when the layer is
    reached and its compute waits for it, as in DeepSpeed ZeRO-3 before PR #1188 (June
    2021), which synchronised the device around every parameter all-gather. ``forward``:
    ahead in the forward passes only, when reached in the backward (its recompute
    included): a host that blocks on every collective (``NCCL_BLOCKING_WAIT``, oneCCL's
    ``CCL_OP_SYNC``) still has the previous layer's forward kernels queued while it
    waits for a gather, but in the backward it first waits out each layer's
    reduce-scatter, so the next gather finds the compute stream empty."""
    dp_mode: Literal["all_reduce", "parameter_server"] = "all_reduce"
    """How data-parallel ranks combine their gradients: collectives among them
    (``all_reduce``), or through parameter servers (``parameter_server``, synchronous):
    each rank pushes every gradient bucket to the servers, which sum it, and pulls the sum
    back before its own optimizer step (Li et al. 2014, OSDI, §3; MXNet's ``dist_sync``
    kvstore with ``update_on_kvstore=False``)."""
    parameter_servers: PositiveInt = 1
    """With ``dp_mode: parameter_server``: server processes, one on each of the first
    nodes of the job; each bucket is split evenly over them, and each server's traffic
    goes through its node's network injection."""
    grad_all_reduce: bool = False
    """Reduce the gradients through a flattened copy: each bucket flattened into a new
    buffer, scaled, all-reduced and copied back (three passes through device memory).
    ZeRO-1/2/3 then keep this rank's shard of a full all-reduce (twice a reduce-scatter's
    traffic): DeepSpeed's pipeline engine with BF16 (``_bf16_reduce_grads``:
    ``buffered_allreduce_fallback`` of the FP32 gradients), and ZeRO-3 without
    ``contiguous_gradients`` (its 2021 default: ``reduce_ipg_grads`` falls back to
    ``buffered_reduce_fallback``). At ZeRO-0, whose reduction is an all-reduce already, only
    the passes are added: Megatron-LM's local DDP without contiguous buffers (2020–21)."""
    gather_per_module: bool = False
    """ZeRO-3: gather a layer's weights with one all-gather per weight matrix (QKV,
    attention output, the MLP's two or three), back to back, as DeepSpeed's per-module
    fetch does (biases and norms stay resident under its persistence threshold). False:
    one all-gather per layer (PyTorch FSDP wrapping a block)."""
    modules_per_layer: PositiveInt | None = None
    """With ``gather_per_module`` or ``grad_buckets_whole_matrices``: the weight matrices of
    a layer that are gathered, or reduced, one by one, as equal shares of its weights.
    None: QKV as one matrix, the attention output and the MLP's two or three (Megatron's
    fused QKV). Hugging Face's Llama keeps ``q_proj``, ``k_proj`` and ``v_proj`` apart, so
    FSDP wrapping each ``nn.Linear`` (a size-based policy) makes 7 units of a Llama layer."""
    collective_wait_poll_ms: float = Field(default=0.0, ge=0)
    """Period at which the host polls a collective it waits on, milliseconds; each
    collective then takes, as the host sees it, the next whole number of periods. PyTorch's
    ``ProcessGroupNCCL`` under ``NCCL_BLOCKING_WAIT=1`` / ``TORCH_NCCL_BLOCKING_WAIT=1``:
    ``wait()`` loops on ``isCompleted()`` with ``sleep_for(kSynchronizeBusyWaitMillis)``:
    10 ms in the sources up to October 2024 (``WorkNCCL::synchronizeInternal``), 1 ms in
    those after it (docs/cost-models.md). 0: the wait is an event the stream waits on, no
    poll."""
    tensor_list_gathers: bool = False
    """ZeRO-3 all-gathers as DeepSpeed ZeRO-3 of 2021 ran them (``_allgather_param``, before
    it used ``_all_gather_base``): the output buffer allocated with ``torch.zeros`` (one
    write of the message), the tensor list built on the host (see
    ``tensor_list_host_us_per_rank``), then PyTorch's tensor-list ``all_gather``, which
    gathers into a new flat buffer and copies each rank's slice out with its own call, dp
    copies per all-gather. False: one gather into the flat buffer, no fill, loop or
    copies."""
    tensor_list_host_us_per_rank: float = Field(default=2.4, ge=0)
    """With ``tensor_list_gathers``: host CPU time per rank before each all-gather,
    microseconds, while the device is idle. DeepSpeed ZeRO-3 of 2021 (``_allgather_param``)
    calls ``torch.cuda.synchronize()``, then for every rank slices the flat buffer
    (``narrow``) and compares the rank with ``torch.distributed.get_rank(group)``, and
    ``torch.distributed.all_gather`` checks the list in Python and converts it for C++.
    ``benchmarks/bench_host_loop.py`` times both (best of 60 runs). On one Intel Xeon host
    the software of 2021 (Python 3.9.2, PyTorch 1.8.1: ``benchmarks/stack_2021.sh``) takes
    1.09 + 0.12 = 1.21 µs per rank, and runs the loop in 0.57 of the time today's software
    (Python 3.11, PyTorch 2.13) takes. Today's software ran the loop in 3.9 µs on a shared
    AMD EPYC Zen 3 host, the closer to Selene's Zen 2 EPYC 7742, 1.97 on the Intel host:
    2.4 µs is the 2021 figure scaled to the AMD host, 1.21 × 3.9 / 1.97. With
    ``persistent_regather``, also per rank and per slice copy of the gather after the
    optimizer step, with or without ``tensor_list_gathers``."""
    tensor_list_host_us_per_call: float = Field(default=325.0, ge=0)
    """With ``tensor_list_gathers``: host time of each all-gather call that does not grow
    with the rank count, microseconds, the device idle. A profile of DeepSpeed 0.3.16 with
    PyTorch 1.8.0 on 8 A100s (deepspeedai/DeepSpeed#1069, June 2021) shows each
    parameter's all-gather spending ≈ 130 µs on the host before the call and ≈ 250 µs in
    it: 380 µs per call at 8 ranks. llmsim already prices about 55 µs of that there, the
    per-rank host time (8 × 2.4 µs) and the call's nine kernel launches (8 slice copies
    and the fill, 4 µs each); the other 325 µs are charged once per call. One group size cannot
    tell whether part of it grows with the ranks; charging it per rank instead (40 µs)
    would add more than the 1,536-GPU rows of Narayanan et al. 2021 take in all."""
    regather_for_recompute: bool = False
    """ZeRO-3 with full recompute: gather each layer's weights for its recompute forward and
    again for its backward, as DeepSpeed ZeRO-3 of 2021 did (its post-forward hook released
    the weights after the recompute too; keeping them needed a valid module trace, which
    PR #1170 restored). False: one gather serves both (PyTorch FSDP, later DeepSpeed)."""
    gathers_per_call: int = Field(1, ge=1, le=64)
    """ZeRO-3: how many times each gathered layer is called, and so gathered, in each
    gather of it (its forward, its recompute, its backward), the calls' all-gathers back to
    back before the layer's part. FSDP1 ``FULL_SHARD`` gathers a non-root unit in each
    call's pre-forward and frees it in the post-forward (``_post_forward_reshard``), so a
    layer called twice a forward is gathered twice. 1: one call a pass (Hugging Face's
    checkpointing, Megatron, DeepSpeed). 2: DistFlashAttn's checkpointing patch
    (``lightseq_ckpt_monkey_patch.py`` of RulinShao/LightSeq at 135d8d2, ``forward`` and
    ``forward_ffn_attn_layer``): each decoder layer called once for its attention's
    projections and once for its feed-forward in the forward and again in the recompute
    (with ``regather_for_recompute``: two gathers before the recompute and two before the
    backward, as each recompute call is followed by its own pre-backward gather). A part
    whose gathers are issued as it is reached waits for its first call's only; issued one
    part ahead, for all of them. At most 64 (its ops grow with it)."""
    prefetch_recompute_gather: bool = True
    """With ``regather_for_recompute`` and ``prefetch_weights``: whether each layer's
    recompute gather is issued one part ahead, as the other gathers are. False: when the
    recompute is reached, its compute waiting for it (FSDP1 under a reentrant checkpoint:
    its backward prefetch, ``_get_handle_to_prefetch``, picks only a unit whose
    ``_needs_pre_backward_unshard`` a grad-enabled forward set, and a unit's only such
    forward is its own recompute, so the recompute's gather is issued by the recompute's
    own pre-forward; the backward's gather after it is issued by the pre-backward hook
    while the recompute runs, one part ahead)."""
    reduce_in_backward: bool = False
    """ZeRO-3: each layer's gradient reduce-scatter is issued as the layer's backward part
    ends, on the ``dp`` stream in order with the gathers (FSDP1's ``_post_backward_hook`` on
    the unit's flat parameter, PyTorch 2.0/2.1 ``torch/distributed/fsdp/_runtime_utils.py``;
    one NCCL stream a process group). False: all after the backward pass."""
    reduce_scatters_per_unit: int = Field(1, ge=1, le=8)
    """With ``reduce_in_backward``: reduce-scatters of each layer's full gradient a backward,
    one for each nested ``torch.autograd.backward`` that reaches the unit (FSDP1 clears
    ``.grad`` and reduces at every run of the hook). 2: DistFlashAttn's checkpointing patch,
    whose checkpoints each hold one layer's feed-forward and the next one's attention."""
    persistent_regather: bool = False
    """ZeRO-3 as DeepSpeed v0.3.13–v0.4.0 ran it: the end of the backward partitions every
    parameter (``_partition_all_parameters``), the resident biases and norms too, and the
    optimizer step gathers those back (``_post_step`` → ``_allgather_params``): one
    tensor-list all-gather of their shards, then a Python loop over the parameters and,
    for each, over the ranks, one ``copy_`` per rank's slice (about dp copies per bias or
    norm, :mod:`llmsim.workload.persistent`; the same code is in DeepSpeed up to v0.7.0 at
    least). False: they stay resident (PyTorch FSDP)."""
    overlap_pp_comm: bool = False
    """Pipeline sends overlap compute. Megatron-LM's point-to-point calls block until the
    transfer is done (``p2p_communication``); only ``--overlap-p2p-communication``
    (interleaved schedule) hides them."""
    pp_scatter_gather: Literal["none", "megatron", "deepspeed"] = "none"
    """Pipeline messages split over the tensor-parallel ranks, whose copies of the
    activation are the same: each rank sends a 1/tp slice on its own NIC and the receiving
    ranks all-gather the slices over their group before the pass that needs them.
    ``megatron``: Megatron-LM of 2021 (Narayanan et al. 2021, §4.1;
    ``--scatter-gather-tensors-in-pipeline``, on by default then): one gather per received
    message. ``deepspeed``: DeepSpeed's pipeline engine with tp > 1 (``is_pipe_partitioned``,
    ``is_grad_partitioned``), which also keeps only its slice of each output it sent and
    all-gathers it back before that micro-batch's backward. Only without sequence
    parallelism, whose messages are already 1/tp; no effect at tp = 1. ``none``: every
    rank sends the whole activation (Megatron-Core)."""
    dp_bucket_mb: float = Field(default=25.0, gt=0)
    """Gradient bucket size for the overlapped reduction, MB."""
    grad_buckets_whole_matrices: bool = False
    """Fill the gradient buckets with whole weight matrices, as DeepSpeed ZeRO's
    ``reduce_independent_p_g_buckets_and_remove_grads`` does (stage3.py, 2021): a bucket
    is reduced before the matrix that would take it past ``dp_bucket_mb`` joins it, so a
    matrix of more than half the bucket is reduced alone (a layer's QKV, attention output
    and MLP matrices count as equal shares of its weights). False: the chunk's gradients
    split into equal buckets of at most ``dp_bucket_mb``."""
    grad_reduce_launch: Literal["bucket_ready", "pp_aligned"] = "bucket_ready"
    """When each gradient bucket's reduction is issued, with ``overlap_dp_comm``.
    ``bucket_ready``: as soon as the last micro-batch's backward makes the bucket final
    (PyTorch DDP's, apex's and Megatron-Core's bucket hooks). ``pp_aligned``: as
    Megatron-Core issues it on a pipeline through its ``grad_sync_func``
    (``--delay-grad-reduce``, on by default from September 2023; ``--align-grad-reduce``
    from August 2024), so that the stages issue together: with ``interleaved-1f1b`` all
    of a chunk's buckets after the backward step that comes ``stage`` steps after the
    chunk's last one (after the stage's last backward when there is none); with ``1f1b``
    the first stage's as ``bucket_ready``, the others' after their last backward. Without
    a pipeline (pp = 1) as ``bucket_ready``."""
    grad_bucket_nan_check: bool = False
    """Check each gradient bucket for NaN before reducing it, on the compute stream: an L2
    norm of its gradients, then the host waits for the result (Megatron-Core's DDP
    ``start_grad_sync`` with ``check_for_nan_in_grad``, which Megatron-LM's
    ``--check-for-nan-in-loss-and-grad`` turns on by default)."""
    grad_bucket_prescale: bool = False
    """Scale each gradient bucket by 1/dp in place, on the compute stream, before reducing
    it (Megatron-Core's DDP ``gradient_scaling_factor``, unless ``average_in_collective``
    lets the collective average)."""
    rank_order: list[Axis] = Field(default_factory=lambda: ["tp", "cp", "ep", "dp", "pp"])
    """Axes from innermost (adjacent ranks) to outermost."""

    @property
    def etp(self) -> int:
        """Tensor-parallel degree of the routed experts: ``expert_tp``, else ``tp``."""
        return self.tp if self.expert_tp is None else self.expert_tp

    @property
    def expert_ranks(self) -> int:
        """Ranks the routed experts of a MoE layer are split over, and that exchange tokens
        by all-to-all: ``ep``, or ``tp·ep`` with ``expert_tp`` 1 (Megatron-Core's
        expert-model-parallel size, ``tp·ep / expert_tp``)."""
        return self.ep * self.tp // self.etp

    @property
    def tp_overlap_units(self) -> dict[str, int]:
        """Field → compute units its overlapped TP transfers' kernels hold beside the GEMMs
        (``tp_overlap_comm_units`` and each ``tp_overlap_gemms`` entry's ``num_sm``); empty
        when TP communication is not overlapped."""
        if not (self.overlap_tp_comm and self.tp > 1):
            return {}
        return {"tp_overlap_comm_units": self.tp_overlap_comm_units} | {
            f"tp_overlap_gemms.{name}.num_sm": gemm.num_sm
            for name, gemm in self.tp_overlap_gemms.items()}

    @field_validator("prefetch_weights", mode="before")
    @classmethod
    def _prefetch_bool_or_forward(cls, value: object) -> object:
        if (isinstance(value, bool | int) and value in (0, 1)) or value == "forward" or (
                isinstance(value, str) and value.lower() in _BOOL_WORDS):
            return value  # pydantic reads the booleans as for any other switch
        raise ValueError("prefetch_weights must be true, false or 'forward' (ahead in the "
                         "forward passes only)")

    @field_validator("dp", mode="before")
    @classmethod
    def _dp_positive_or_auto(cls, value: object) -> object:
        if value == "auto":
            return value
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError("dp must be a positive whole number or 'auto'")
        return value

    @model_validator(mode="after")
    def _check(self) -> Parallelism:
        check_layout_rules(self)
        return self


def prefetched(prefetch_weights: bool | Literal["forward"], kind: str) -> bool:
    """Whether a pass of ``kind`` (``F``, ``B``, ``W``) gathers its weights one layer
    ahead under :attr:`Parallelism.prefetch_weights`."""
    return prefetch_weights is True or (prefetch_weights == "forward" and kind == "F")
