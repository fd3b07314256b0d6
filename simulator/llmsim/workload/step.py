"""One training step's workload: the chunks each pipeline stage runs and the step's
pipeline, data-parallel and ZeRO traffic (:class:`Workload`); its gradient buckets are
:mod:`llmsim.workload.grad_buckets`'s."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import TYPE_CHECKING

from llmsim.ops import CommOp, ComputeOp
from llmsim.workload.grad_buckets import GradientBuckets
from llmsim.workload.persistent import post_step_gather

if TYPE_CHECKING:
    import pandas as pd


Op = ComputeOp | CommOp

EXTRA_OP_PREFIXES = ("embed", "final_norm", "head_", "lm_head", "loss")
"""Name prefixes of the ops outside the transformer blocks (first and last stage only)."""


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


@dataclass
class Workload(GradientBuckets):
    """One step: chunk op lists, pipeline message size, DP/ZeRO traffic, optimizer; the
    gradient buckets' methods come from :class:`GradientBuckets`. Read only (changed by
    ``dataclasses.replace``), but not ``frozen``: a frozen dataclass's ``__init__`` sets
    each of these 35 fields through ``object.__setattr__``, about three times a plain
    one's time, and the layout search makes one a layout (:func:`.build.step_traffic`);
    it holds a dict, so it was never hashable."""

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
    pp_exchange_host_s: float = 0.0
    """Device idle after each blocking pipeline exchange, seconds: a host sync after the
    batched send and receive (:func:`llmsim.host_syncs.exchange_sync_s`); it adds to each
    send's time."""
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
    parameter_server: bool = False
    """Gradient buckets pushed to parameter servers and the sums pulled back
    (``parallelism.dp_mode: parameter_server``) instead of all-reduced."""
    grad_bucket_nan_check: bool = False
    """Each gradient bucket checked for NaN before its reduction
    (``parallelism.grad_bucket_nan_check``)."""
    grad_bucket_prescale: bool = False
    """Each gradient bucket scaled by 1/dp before its reduction
    (``parallelism.grad_bucket_prescale``)."""
    regather_for_recompute: bool = False
    """ZeRO-3 with full recompute: each backward layer is gathered for its recompute and
    again for its backward (``parallelism.regather_for_recompute``)."""
    bucket_matrices: int = 0
    """Weight matrices per layer when gradient buckets hold whole matrices
    (``parallelism.grad_buckets_whole_matrices``); 0: buckets split by bytes."""
    gather_messages: int = 1
    """All-gathers per gathered layer, back to back: 1 (one per block), or one per weight
    matrix with ``parallelism.gather_per_module``."""
    recompute_gather_at_call: bool = False
    """With :attr:`regather_for_recompute`: each layer's recompute gather is issued when the
    recompute is reached, not one part ahead (``parallelism.prefetch_recompute_gather``
    false)."""
    gather_calls: int = 1
    """Calls of each gathered layer in each of its gathers, each call's all-gathers back to
    back (``parallelism.gathers_per_call``)."""
    unit_reductions: int = 0
    """ZeRO-3: 0, the gradients reduce-scattered after the backward pass; n, each gathered
    layer's gradient reduce-scattered n times as its backward part ends
    (``parallelism.reduce_in_backward``, ``reduce_scatters_per_unit``)."""
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
    hops: tuple[tuple[int, int], ...] = ()
    """Virtual stage k → the (stage, chunk) that runs it, when the schedule places chunks
    otherwise than ``c·p + s`` (ZB-V's V, :mod:`llmsim.schedules.route`); empty: looping."""
    ep: int = 1
    """Expert-parallel degree: the ep ranks hold different sequences (more replicas of the
    dense weights) and different routed experts."""
    cp: int = 1
    """Context-parallel degree: the cp ranks hold parts of the same sequences."""
    pipelines: int = 1
    """Whole pipelines sharing the stages (:attr:`ScheduleInfo.pipelines`): 2 for Chimera,
    whose chunk 1 of stage ``s`` is the up pipeline's replica of stage ``p − 1 − s``'s
    layers and runs half the micro-batches."""
    overlapped_pairs: bool = False
    """Whether the schedule's forward-backward pairs run overlapped, the all-to-alls of
    each beside the other's computation (``parallelism.moe_a2a_overlap`` under a schedule
    with :attr:`ScheduleInfo.overlapped_pairs`, DualPipe; :mod:`llmsim.engine.pairs`);
    the passes' own all-to-alls are then priced whole."""
    pair_comm_units: int = 0
    """Compute units the all-to-all kernels hold while an overlapped pair computes
    (``parallelism.moe_comm_units``)."""
    persistent_layer_elements: tuple[int, ...] = ()
    """ZeRO-3 with ``parallelism.persistent_regather``: elements of each persistent parameter
    of one layer on one device (:func:`~llmsim.workload.persistent.persistent_elements`),
    gathered back after every optimizer step (:meth:`persistent_gather`); empty: none."""
    persistent_final_elements: tuple[int, ...] = ()
    """Of the last chunk's final norm, likewise."""
    persistent_host_us: float = 0.0
    """Host time of each rank's slice in that gather's loops, microseconds."""

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
    def gather_group(self) -> tuple[str, int]:
        """(axis, ranks) of the per-layer weight all-gathers (ZeRO-3, and ZeRO-1/2 with
        ``overlap_param_gather``): the dense weights' group of :attr:`grad_groups`,
        ``dp``, or with context or expert parallelism the dp·ep·cp ranks that shard them
        (Megatron-Core's data-parallel group with context parallelism); the routed
        experts' share gathers over their own group (:meth:`gather_parts`)."""
        return self.grad_groups[0]

    @property
    def grad_ranks(self) -> int:
        """Ranks of the widest gradient group (dp when ep = cp = 1): above 1, the step
        reduces gradients over the network."""
        return self.grad_groups[0][1]

    @cached_property
    def stages(self) -> int:
        """Pipeline stages (computed once: the engine asks for every pipeline action)."""
        return 1 + max(s for s, _ in self.chunks)

    def stage_of(self, virtual_stage: int, chunk: int = 0) -> int:
        """The pipeline stage that runs ``virtual_stage`` on the pipeline of ``chunk``
        (Chimera's up pipeline, chunks from :attr:`chunks_per_stage` on, runs virtual
        stage ``k`` on stage ``p − 1 − k``)."""
        stage = self.hops[virtual_stage][0] if self.hops else virtual_stage % self.stages
        if chunk >= self.chunks_per_stage:
            return self.stages - 1 - stage
        return stage

    @cached_property
    def chunks_per_stage(self) -> int:
        """Model chunks per stage and pipeline (virtual stages; computed once)."""
        return (1 + max(c for _, c in self.chunks)) // self.pipelines

    @property
    def microbatches_per_chunk(self) -> int:
        """Micro-batches each chunk runs in a step: all of them, or with several
        :attr:`pipelines` each pipeline's share."""
        return self.microbatches // self.pipelines

    def stage_params(self, stage: int) -> int:
        """Parameters on one device of ``stage``."""
        return sum(c.params for (s, _), c in self.chunks.items() if s == stage)

    def replica_grad_exchange(self, stage: int) -> CommOp | None:
        """With two pipelines (Chimera), the gradients a device of ``stage`` sums with the
        device of stage ``p − 1 − s``, which holds the other replicas of its weights, after
        its data-parallel reductions: all of them, or with ZeRO-1/2 its shard (1/ranks of
        the dense gradient group); priced as a two-rank all-reduce
        (:mod:`llmsim.engine.replicas`). None with one pipeline."""
        if self.pipelines == 1:
            return None
        shards = self.grad_groups[0][1] if self.zero in (1, 2) else 1
        return CommOp("replica_grad_allreduce", "send_recv", "pp", "O",
                      self.stage_params(stage) * self.grad_bytes_per_param / shards)

    def dp_param_gathers(self, stage: int) -> list[CommOp]:
        """ZeRO-1/2's weight all-gathers after the step: one over each group whose ranks
        shard weights of this stage (:attr:`grad_groups`), the dense weights' first; with
        ZeRO-3, the gather of the persistent parameters where there is one
        (:meth:`persistent_gather`)."""
        if self.zero == 3:
            gather = self.persistent_gather(stage)
            return [gather] if gather is not None else []
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

    def persistent_gather(self, stage: int) -> CommOp | None:
        """ZeRO-3's gather of ``stage``'s persistent parameters after the optimizer step
        (:func:`~llmsim.workload.persistent.post_step_gather` over its chunks' layers and,
        on the last chunk, the final norm), or None."""
        if not self.persistent_layer_elements:
            return None
        chunks = [c for (s, _), c in self.chunks.items() if s == stage]
        elements = self.persistent_layer_elements * sum(c.layers for c in chunks)
        elements += self.persistent_final_elements if any(c.last for c in chunks) else ()
        axis, ranks = self.gather_group
        return post_step_gather(elements, ranks, axis, self.param_bytes_per_param,
                                self.persistent_host_us)

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
        if self.gather_group[1] == 1 or kind == "W":
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
        axis, ranks = self.gather_group
        if ranks == 1 or not (self.zero == 3 or self.overlap_param_gather):
            return None
        prefix = "z3_ag" if self.zero == 3 else "dp_ag_params"
        nbytes = chunk.params * self.param_bytes_per_param / chunk.units / self.gather_messages
        return CommOp(f"{prefix}_c{chunk.virtual_stage}_l0", "all_gather", axis, "F",
                      nbytes, copies=self.gather_copies,
                      fill_passes=self.gather_fill_passes, host_s=self.gather_host_s)

    def gather_parts(self, chunk: Chunk, op: CommOp) -> tuple[CommOp, ...]:
        """One of :meth:`weight_gathers` as the all-gathers it is made of: ``op`` itself;
        with expert parallelism its dense weights' share over the dense group, then its
        routed experts' share over the expert-data-parallel group (none when that group
        is one rank, which holds its experts whole)."""
        _, (expert_axis, expert_ranks) = self.grad_groups
        if not chunk.expert_params or self.ep == 1:  # one group holds all the weights
            return (op,)
        share = chunk.expert_params / chunk.params
        dense = replace(op, bytes=op.bytes * (1 - share))
        if expert_ranks == 1:
            return (dense,)
        return dense, replace(op, name=f"{op.name}_experts", axis=expert_axis,
                              bytes=op.bytes * share)

    def model_flops(self) -> float:
        """Model FLOPs of one step over all devices (recompute excluded)."""
        return self._step_flops[0]

    def hardware_flops(self) -> float:
        """FLOPs executed in one step over all devices, recompute included."""
        return self._step_flops[1]

    @cached_property
    def _step_flops(self) -> tuple[float, float]:
        """(model, hardware) FLOPs of one step, each counted once over every op: a result
        asks for them several times (MFU, HFU, throughput, energy)."""
        return self._flops(include_recompute=False), self._flops(include_recompute=True)

    def _flops(self, include_recompute: bool) -> float:
        per_replica = 0.0
        for c in self.chunks.values():
            for op in c.ops:
                if isinstance(op, ComputeOp) and (include_recompute or op.phase != "R"):
                    per_replica += op.flops * self.tp
        # Each micro-batch runs through one pipeline's chunks (Chimera's: half of them).
        return per_replica * self.microbatches_per_chunk * self.dp * self.ep * self.cp

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
