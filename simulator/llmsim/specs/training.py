"""Training spec: batch, sequence, precision and the size of the whole run."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, NonNegativeInt, PositiveFloat, PositiveInt, model_validator

from llmsim.specs._base import Spec

AttentionKernel = Literal["flash", "flash1", "triton_fwd", "cudnn", "unfused"]
"""How attention runs: FlashAttention-2, FlashAttention 1.x, a Triton forward with
FlashAttention-2's backward (DistFlashAttn), cuDNN's fused flash attention, or unfused."""

AttentionSoftmax = Literal["fused", "eager"]
"""How the unfused attention's scale, mask, softmax and dropout run: fused kernels, or
PyTorch's eager CPU kernels one by one."""

Allocator = Literal["caching", "glibc"]
"""Where a CPU framework's tensors come from: a caching allocator, or glibc's ``malloc``."""

HostPath = Literal["bare", "modules", "hugging_face"]
"""How a framework's host issues eager kernels: ``bare`` PyTorch ops, ``modules`` (layers
as Python modules with autograd), or ``hugging_face`` (the same, with the host work of a
reentrant checkpoint's backward and of FSDP's hooks priced apart,
:attr:`Training.host_path`)."""

PointwiseOps = Literal["fused", "hf_eager", "eager_swiglu"]
"""How a block's norms, rotary embedding and gated activation run: one fused kernel each
(no rotary traffic), Hugging Face LLaMA's eager PyTorch operators, or fused norms with an
eager SiLU and product (:mod:`llmsim.workload.hf_eager`)."""

RopeKernel = Literal["fused", "unfused", "complex"]
"""How a RoPE model's rotary embedding runs on q and k: one fused kernel each per pass,
PyTorch's eager ``rotate_half`` operators, or the complex multiply of torchtitan and Meta's
LLaMA (:mod:`llmsim.workload.rope`)."""

HostSyncs = Literal["none", "megatron", "megatron_nan_check", "megatron_every_chunk",
                    "megatron_every_chunk_no_exchange_sync", "megatron_core",
                    "megatron_p2p_sync", "attention"]
"""Which host synchronisations a framework's training step makes per micro-batch
(:attr:`Training.host_syncs`, :mod:`llmsim.host_syncs`)."""

SmallCalls = Literal["lumped", "megatron_mpu", "megatron_2020", "megatron_deepspeed_pipe",
                     "megatron_core", "megatron_core_no_mask", "nemo",
                     "megatron_bridge"]
"""Which small collectives a framework makes per micro-batch outside the layers (the
cross-entropy's all-reduces, the batch's broadcast, the loss's average;
:attr:`Training.small_calls`, :mod:`llmsim.workload.small_calls`)."""

ExpertLoop = Literal["grouped", "deepspeed_uneven"]
"""How a MoE layer's local experts run (:mod:`llmsim.expert_loop`): ``grouped``, each
expert GEMM of all local experts as one grouped kernel; ``deepspeed_uneven``, DeepSpeed's
``Experts`` loop over uneven token batches as X-MoE runs it, one expert MLP after another."""


class Training(Spec):
    """One optimizer step's batch and the whole run's size."""

    global_batch: PositiveInt
    """Sequences per optimizer step (all data-parallel replicas together)."""
    seq_len: PositiveInt
    """Tokens per sequence."""
    precision: Literal["bf16", "fp16", "fp8", "fp32"] = "bf16"
    """Data type of the matrix multiplications (mixed precision keeps fp32 master weights)."""
    optimizer: Literal["adam"] = "adam"
    """Optimizer (mixed-precision Adam: 16 bytes of state per parameter)."""
    optimizer_kernels: Literal["multi_tensor", "fused", "per_tensor"] = "multi_tensor"
    """How the optimizer step runs over the local shard. ``multi_tensor`` (Megatron-LM
    from 2021, Megatron-Core, DeepSpeed): apex multi-tensor kernels, one pass each — 16-bit
    gradients cast to FP32 copies, with fp16 the loss-scale unscale and inf/NaN check, the
    gradient norm for clipping, Adam, the 16-bit weights copied from the FP32 ones.
    ``fused``: the norm and one kernel that reads the gradient, the FP32 weight and moments
    and writes them and the 16-bit weight (apex ``DistributedFusedAdam``, NeMo's
    distributed optimizer). ``per_tensor``: Megatron-LM of 2020 (apex-era
    ``FP16_Optimizer``): the ``multi_tensor`` passes, plus an overflow check that casts
    every 16-bit gradient tensor to FP32 and sums it, and a clipping norm taken tensor by
    tensor, each waiting for its result on the host, and the 16-bit weights copied tensor
    by tensor."""
    attention_kernel: AttentionKernel = "flash"
    """Fused attention without the s×s matrix in memory — ``flash`` (FlashAttention-2),
    ``flash1`` (flash-attn 1.x, which Transformer Engine of spring 2023 called; priced
    from FlashAttention-2's rate, :mod:`llmsim.costs.flash1`), ``triton_fwd`` (DistFlashAttn's
    forward written in Triton from Triton's fused-attention tutorial, with FlashAttention-2's
    CUDA backward; the forward priced from FlashAttention-2's by their measured ratio,
    :mod:`llmsim.costs.attention_relative`) or ``cudnn`` (cuDNN's fused
    flash attention, Transformer Engine's ``FusedAttention``, which Transformer Engine
    prefers on Hopper) — or the unfused softmax path."""
    attention_softmax: AttentionSoftmax = "fused"
    """With ``attention_kernel: unfused``: ``fused``, one scale-mask-softmax kernel and a
    dropout that writes a 1-byte mask (Megatron-LM's CUDA kernels); ``eager``, Megatron's
    ``forward_torch_softmax`` as PyTorch runs it on a CPU in FP32, kernel by kernel: the
    scores scaled into a new tensor, masked in place, and a dropout that draws a float
    noise tensor of the probabilities' size (:mod:`llmsim.workload.softmax`)."""
    pointwise_ops: PointwiseOps = "fused"
    """How the block's RMSNorms, rotary embedding and SwiGLU run: ``fused``, one kernel each
    (Megatron-LM's and Transformer Engine's fused norms and activation; the rotary embedding
    not priced); ``hf_eager``, Hugging Face ``LlamaForCausalLM`` of 2023 (transformers
    4.31–4.35) as PyTorch runs it: ``LlamaRMSNorm`` upcast to FP32 in 8 kernels, ``rotate_half``
    and ``apply_rotary_pos_emb`` on q and k, SiLU and the gate product as two kernels, and
    autograd's backward of each (:mod:`llmsim.workload.hf_eager`). Needs an RMSNorm, RoPE,
    SwiGLU model without MLA or experts (LLaMA's modeling code has neither).
    ``eager_swiglu``: the norms fused, the SwiGLU as ``F.silu(w1(x)) * w3(x)`` in two eager
    kernels and its backward in three (torchtitan's Llama without ``torch.compile``); the
    rotary embedding as ``rope`` says. Needs a SwiGLU model."""
    rope: RopeKernel = "fused"
    """How the rotary embedding of a ``position_embedding: rope`` model runs
    (:mod:`llmsim.workload.rope`): ``fused``, one memory-bound kernel on q and one on k each
    pass (Transformer Engine's fused RoPE; Megatron-LM ``--apply-rope-fusion``, later the
    default, turned off by ``--no-rope-fusion``: the version that changed it not pinned
    here; NeMo's LLaMA recipes); ``complex``, torchtitan's ``view_as_complex`` product
    between an FP32 upcast and a cast back, three kernels on q and on k each pass, eager or
    compiled (Inductor does not lower complex operators); ``unfused``, the
    eager ``t * cos + rotate_half(t) * sin`` operators (Megatron-LM without the flag, before
    2024; Hugging Face). ``pointwise_ops: hf_eager`` runs it unfused (``complex`` with it
    is an error).
    ``unfused`` is an error for other position embeddings and MLA (no rotary kernel to
    price)."""
    attention_layout_copies: bool = False
    """With flash attention: whether q, k, v (and, for a micro-batch above one, the output)
    are copied between the model's [s, b, h] layout and the kernel's [b, s, heads, d]
    (Megatron-LM's legacy model with ``--use-flash-attn``; Transformer Engine of 2023,
    whose FlashAttention wrapper fed flash-attn 1.x), or read in place (Transformer Engine
    from 2024, cuDNN)."""
    bias_kernels: Literal["fused", "separate"] = "fused"
    """How linear-layer biases run (models with ``bias: true``): ``fused`` in the GEMM
    epilogues and the fused bias-GeLU / bias-dropout-add kernels, their gradients with
    the weight-gradient GEMMs (Transformer Engine); ``separate`` as Megatron-LM's own
    layers run them (``--transformer-impl local``): the QKV bias added after its GEMM and
    every bias gradient a reduction over the tokens."""
    grad_accumulation: Literal["fused", "autograd", "fp32_cast_add"] = "fused"
    """How each micro-batch's weight gradients are added to the gradient buffer.
    ``fused``: the weight-gradient GEMMs add into it (Megatron-LM's
    ``--gradient-accumulation-fusion``, Transformer Engine), and only the embeddings,
    whose gradients come from no GEMM, are added by a separate kernel (Megatron-LM's
    data-parallel hook). ``autograd``: PyTorch adds every gradient into ``param.grad``, in
    the parameters' dtype, from the second micro-batch on (Megatron-LM of 2020–21, before
    its fused kernels). ``fp32_cast_add``: every micro-batch's gradients are cast to FP32
    and added to FP32 copies (DeepSpeed's BF16_Optimizer, ``update_hp_grads``)."""
    hidden_dropout: float = Field(default=0.1, ge=0, lt=1)
    """Dropout probability on the embedding output and on each residual branch
    (Megatron-LM's ``--hidden-dropout``, default 0.1). Above zero each of those kernels
    also writes a 1-byte mask, which the backward reads and the activations keep; at zero
    there is no mask and no dropout backward. Only zero versus non-zero changes a cost."""
    attention_dropout: float = Field(default=0.1, ge=0, lt=1)
    """Dropout probability on the attention probabilities (Megatron-LM's
    ``--attention-dropout``, default 0.1). With unfused attention, above zero a dropout
    kernel reads and writes the s×s probabilities and a mask, forward and backward, and
    the activations keep both; flash kernels drop in registers, at no priced cost."""
    fp8_amax_reduction: bool = False
    """With ``precision: fp8``: whether Transformer Engine's delayed scaling all-reduces the
    latest amax of every FP8 tensor over all ranks of the pipeline stage (Megatron's
    tensor-and-data-parallel group) each time a model chunk's forward ends and again when
    its backward ends, blocking the compute stream (``reduce_amax``, TE of 2023:
    ``global_amax_reduction`` with ``async_op=False``)."""
    fp8_scaling: Literal["delayed", "current"] = "delayed"
    """With ``precision: fp8``: how Transformer Engine scales each tensor before its cast.
    ``delayed`` (TE's ``DelayedScaling``): the scale comes from earlier steps' amax
    history, and the cast-transpose kernel records the new amax as it casts.
    ``current`` (TE 2.x ``Float8CurrentScaling``): an amax kernel reads the 16-bit tensor
    before its cast (``nvte_compute_amax``), the cast waits for it."""
    fp8_param_gather: bool = False
    """With ``precision: fp8``: weights kept in FP8 for the forward, so the distributed
    optimizer's and ZeRO-3's weight all-gathers move 1 byte per weight, not 2
    (Megatron-LM ``--fp8-param-gather``, TE ``fp8_model_init``)."""
    fp8_weight_cast: Literal["per_step", "per_microbatch"] = "per_step"
    """With ``precision: fp8``: how often Transformer Engine casts each weight to FP8 (the
    copy and its transpose). ``per_step``: on the first micro-batch of each step, the copy
    kept for the others (the framework passes ``is_first_microbatch``, as Megatron-LM and
    NeMo do); ``per_microbatch``: before every forward (``is_first_microbatch=None``, a
    plain TE model)."""
    fp8_amax_history_len: PositiveInt = 1024
    """With ``precision: fp8`` and delayed scaling: FP32 amaxes of past iterations kept per
    FP8 tensor, rolled at the end of each forward and backward region (Transformer Engine's
    ``DelayedScaling.amax_history_len``, whose default is 1024 from v0.8 on; NeMo's GPT
    configurations of 2023 set 1)."""
    fp8_amax_update: Literal["per_region", "per_module"] = "per_region"
    """With ``precision: fp8`` and delayed scaling: how Transformer Engine updates the amax
    histories and scales. ``per_region`` (TE 1.x): once per ``fp8_autocast`` region's
    forward and backward, two kernels for all its tensors; ``per_module`` (TE 0.x): each
    TE module before its own forward and backward, two to four small kernels each."""
    fp8_activation_cache: bool = False
    """With ``precision: fp8``, a MoE model's experts keep what their backward needs in
    FP8 (DeepSeek-V3 report §3.3.3, "Low-Precision Storage and Communication"): the
    routed experts' input rows (quantised before the dispatch) and the routed and shared
    experts' activation (SwiGLU) inputs, 1 byte an element plus an FP32 scale per
    1×128 tile (§3.3.1); the activation's output, the down-projection's input, is
    recomputed in the backward instead of stored (:mod:`llmsim.experts`). The dispatch
    all-to-all, and backward the combine's gradients, carry those FP8 rows
    (:mod:`llmsim.moe`)."""
    cuda_graphs: bool = False
    """Whether the step's compute kernels replay from captured CUDA graphs (one launch for
    a captured sequence; MLPerf Training v4 submissions capture theirs): each compute
    kernel costs the device's gap between graph-launched kernels (``graph_kernel_us``)
    instead of an eager launch (``kernel_launch_us``), and never waits for the host's
    dispatch (``host_dispatch_us``, :mod:`llmsim.costs.host_issue`)."""
    moe_router_kernels: tuple[NonNegativeInt, NonNegativeInt] = (0, 0)
    """Kernels per MoE layer that the framework launches around its router beyond the
    gating GEMM and top-k kernel llmsim prices, (forward, backward): a load-balancing
    loss, benchmark logits, type casts. Each costs the device its gap per kernel
    (``kernel_launch_us``) and the host one dispatch; counts are read from the
    framework's code (:mod:`llmsim.workload.router_kernels`)."""
    host_path: HostPath = "bare"
    """How the framework's host issues each eager kernel (:mod:`llmsim.costs.host_issue`):
    ``bare``, one PyTorch op called back to back (the accelerator's ``host_dispatch_us``,
    the floor); ``modules``, a model's layers as Python modules under autograd (its
    ``host_module_dispatch_us``, measured where given; a UserError where not);
    ``hugging_face``, ``modules`` and, measured on the accelerator's host
    (:mod:`llmsim.workload.host_work`), each backward matmul node of a layer that a
    reentrant ``torch.utils.checkpoint`` recomputes (``host_ckpt_node_us``) and FSDP's
    hooks around each ZeRO-3 unit's forward and backward (``host_fsdp_forward_us``,
    ``host_fsdp_backward_us``). No effect under ``cuda_graphs``."""
    expert_host_loop: bool = False
    """Whether the MoE experts' module launches its per-expert kernels from a host loop,
    each a launch of its own (Transformer Engine's ``GroupedLinear``: one quantisation and
    one cuBLAS GEMM per local expert, :mod:`llmsim.moe_host`); False: each grouped op costs
    the host its dispatches alone (a fused grouped kernel). No effect under
    ``cuda_graphs``."""
    expert_loop: ExpertLoop = "grouped"
    """How the MoE layer's local experts run on the device (:mod:`llmsim.expert_loop`):
    ``grouped``, one grouped kernel per expert GEMM for all local experts;
    ``deepspeed_uneven``, DeepSpeed's ``Experts`` module over uneven token batches (X-MoE's
    ``--use-uneven-all-to-all``): one GEMM per local expert, each its own tile and wave
    quantisation and launch, with the copies its loop and the layer's interleave make.
    X-MoE runs it only behind its padding-free dispatch: refused with
    ``moe_dispatcher: deepspeed`` and with ``moe_a2a_overlap``."""
    host_syncs: HostSyncs = "none"
    """The host synchronisations of the framework's step, each a gap on the device
    (:mod:`llmsim.host_syncs`): ``none``; ``megatron``, Megatron-LM's ``get_batch``
    reading the batch's sizes back (``broadcast_data``: ``sizes_cuda.cpu()``) before
    the forward of the chunk with the embedding and of the one with the LM head, and, with
    blocking pipeline messages, the ``torch.cuda.synchronize()`` after each batched
    exchange (``batch_p2p_sync``); ``megatron_nan_check``, those and the loss's NaN check
    on the last stage (``assert not loss.isnan()``, ``check_for_nan_in_loss_and_grad``,
    on by default in Megatron-LM from September 2023); ``megatron_every_chunk``,
    Megatron-LM of 2021 (de7dc40): the read-back and masks before every chunk's forward
    and the sync after each blocking exchange; ``megatron_every_chunk_no_exchange_sync``,
    Megatron-LM of 2020 and January 2021 (c63906a, 1b8e289): the read-back and masks
    before every chunk, no sync after the exchanges; ``megatron_core``, Megatron-Core's
    ``pretrain_gpt.py`` of 2024 (f2e5db402c): no read-back of the batch, the loss's NaN
    check and the schedule's ``num_tokens.item()`` on the last stage, and the exchange
    sync; ``megatron_p2p_sync``, the exchange sync alone (NeMo 24.03 with
    Megatron-Core 0.5.0); ``attention``, a
    ``torch.cuda.synchronize()`` before and after each attention kernel of the forward,
    the recompute and the backward (``benchmarks/time_hf_llama_host.py``'s ``_sync``
    modes; one rank of DistFlashAttn's schedule, which syncs at each of its steps)."""
    small_calls: SmallCalls = "lumped"
    """The small collectives of a micro-batch outside the layers, one blocking call each
    (:mod:`llmsim.workload.small_calls`): ``lumped``, the vocab-parallel cross-entropy's
    reductions as one TP all-reduce of three FP32 values a token (frameworks whose code
    was not read for it); ``megatron_mpu``, Megatron-LM's ``mpu`` of 2021 and its forks
    (DeepSpeedFugaku): the cross-entropy's three TP all-reduces of one value a token,
    ``broadcast_data``'s two TP broadcasts (sizes, tokens) before every chunk's forward,
    and the loss's all-reduce over the data-parallel group on the last stage;
    ``megatron_2020``, Megatron-LM of September 2020: the same, the loss reduced over
    every rank; ``megatron_deepspeed_pipe``, BigScience's Megatron-DeepSpeed under
    DeepSpeed's pipeline engine: the three all-reduces, the two broadcasts before the
    first and last stages' forward only, no loss average a micro-batch; ``megatron_core``,
    Megatron-Core's ``pretrain_gpt.py`` (2024): the three all-reduces, one TP broadcast
    per batch tensor before the first and last stages' forward, the b·s² attention mask
    among them, and the loss and its token count all-reduced over the data-parallel
    group; ``megatron_core_no_mask``, the same with
    ``--no-create-attention-mask-in-dataloader``; ``nemo``, NeMo 1.17 and 24.03: the three
    all-reduces, no batch broadcast, the loss all-reduced over cp and averaged over dp;
    ``megatron_bridge``, Megatron-Bridge's performance scripts: Transformer Engine's
    cross-entropy, one TP all-gather of three FP32 values a token, nothing else."""
    power_limit_w: PositiveFloat | None = None
    """Board power limit the run sets, W (``nvidia-smi -pl``); None: the accelerator's own
    (``clocks.power_limit_w``). Sets the sustained SM clocks where the accelerator has
    measured ``clocks``; a limit above every kind's draw gives the catalog's rates. On an
    accelerator without ``clocks`` it changes nothing, and the run warns so."""
    tokens: PositiveFloat | None = None
    """Run size in training tokens (give this or ``flops``)."""
    flops: PositiveFloat | None = None
    """Run size as a model-FLOP budget, e.g. 3e25 for GPT-4 (give this or ``tokens``)."""
    step_overhead_s: float = Field(default=0.0, ge=0)
    """Fixed per-step host time (data loading, logging), seconds."""
    allocator: Allocator = "caching"
    """Where a CPU framework's tensors come from. ``caching``: memory is kept and reused
    (a GPU framework's caching allocator; on a CPU a preloaded tcmalloc); ``glibc``: the C
    library's ``malloc``, which returns every block of 32 MiB or more to the OS at
    ``free``, so each such tensor is faulted in again (:mod:`llmsim.costs.allocator`;
    needs the accelerator's ``host_pages``)."""

    @model_validator(mode="after")
    def _fp8_options_need_fp8(self) -> Training:
        if self.fp8_param_gather and self.precision != "fp8":
            raise ValueError(
                f"training.fp8_param_gather: true needs precision fp8 (got {self.precision}); "
                "set training.precision: fp8 or turn it off"
            )
        return self

    @model_validator(mode="after")
    def _eager_softmax_is_unfused(self) -> Training:
        if self.attention_softmax == "eager" and self.attention_kernel != "unfused":
            raise ValueError(
                f"training.attention_softmax: eager needs attention_kernel: unfused (got "
                f"{self.attention_kernel}); set attention_kernel: unfused or drop "
                "attention_softmax"
            )
        return self

    @model_validator(mode="after")
    def _one_run_size(self) -> Training:
        if self.tokens is not None and self.flops is not None:
            raise ValueError(
                "training.tokens and training.flops are both set; keep only one of them "
                "as the run size"
            )
        return self

    @model_validator(mode="after")
    def _fp8_switches_need_fp8(self) -> Training:
        for name in ("fp8_amax_reduction", "fp8_activation_cache"):
            if getattr(self, name) and self.precision != "fp8":
                raise ValueError(
                    f"training.{name} is true but training.precision is "
                    f"{self.precision}; set precision to fp8 or drop {name}"
                )
        return self

    @property
    def tokens_per_step(self) -> int:
        """Tokens in one global batch."""
        return self.global_batch * self.seq_len

    @property
    def fused_attention(self) -> bool:
        """Whether attention runs as one fused kernel (flash or cuDNN)."""
        return self.attention_kernel != "unfused"
