"""The ops of a mixture-of-experts MLP, for one micro-batch on one device.

A MoE layer is the dense block (:mod:`llmsim.workload`) with its MLP replaced by
(Megatron-Core ``MoELayer`` with the ``alltoall`` token dispatcher; Lepikhin et al. 2021,
GShard §2.2) the ops below, for expert tensor parallelism equal to ``tp``. With
``parallelism.expert_tp`` 1 every expert is whole on one rank: the TP collectives of the
routed rows go, each rank routes its own ``T/t`` tokens, and the all-to-alls run over
the ``tp·ep`` ranks that split the experts (``tp+ep``). With ``expert_tp`` ``e`` between
(a divisor of tp, Megatron-Core's ``--expert-tensor-parallel-size``) each expert is split
over ``e`` adjacent TP ranks (``etp``), whose TP collectives of the routed rows run
there, and the all-to-alls over the ``tp/e·ep`` ranks that hold different experts
(``xtp+ep``: the TP ranks ``e`` apart, times ep):

forward
    router GEMM (tokens × experts) and its top-k selection; permutation of the token rows
    into expert order (``moe_permute``); with HybridEP the all-gather of the routing map
    (``moe_routing_map_ag``); the **dispatch all-to-all** over the expert-parallel group;
    with sequence parallelism the all-gather of the received rows over the TP group; the
    **grouped expert GEMMs** (one batched GEMM per projection, as many GEMMs as local
    experts, each of the mean rows per expert, run ``λ`` times as long for the busiest
    rank's excess, :func:`llmsim.experts.expert_rows`); the activation;
    the TP reduce-scatter (all-reduce without sequence parallelism); the **combine
    all-to-all**; the un-permutation that weights and sums each token's ``top_k``
    outputs; the shared experts as a dense MLP of ``shared_experts·ffn_hidden`` width —
    with ``parallelism.moe_shared_expert_overlap`` its input all-gather first, its first
    projection beside the dispatch and its second beside the combine, each all-to-all
    then costing only what exceeds its GEMM (:func:`llmsim.blocks.exposed_overlap_s`).
backward
    the same in reverse, each all-to-all and TP collective once more; weight gradients
    of the grouped GEMMs, router and shared experts in the W pass.

With ``parallelism.moe_a2a_overlap`` (Megatron-Core ``--overlap-moe-expert-parallel-comm``,
the 1F1B overlap that DeepSeek-V3's DualPipe introduced: one micro-batch's forward
chunk runs beside another's backward chunk, each all-to-all beside the other's
attention or MLP computation) every all-to-all costs only what exceeds a GEMM
(:func:`llmsim.blocks.exposed_overlap_s`, in bulk): the dispatch the first expert GEMM
after it, the combine the last before it. That GEMM stands in for the other
micro-batch's sub-module, which is at least as long (the MLP's backward is about twice
its forward); the warm-up and cool-down passes of the pipeline, which have no partner,
are priced as overlapped too. Under a schedule that runs such pairs itself (DualPipe,
:attr:`llmsim.schedules.ScheduleInfo.overlapped_pairs`) the passes keep their
all-to-alls whole and the engine prices each pair (:mod:`llmsim.engine.pairs`).

One expert (top-1) is the dense MLP: no router, no permutation, and no all-to-all
without expert parallelism, so its ops price exactly as the dense block's. Sizes:
``T`` tokens per micro-batch, ``T_s = T/t`` with sequence parallelism (the rows a rank
routes), ``R`` the routed rows of the busiest rank's experts.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from llmsim.expert_loop import with_expert_loop
from llmsim.experts import FP8_CACHED_BYTES, FP32_BYTES, expert_group_tokens, expert_rows
from llmsim.host_syncs import HOST_SYNC_GAP_S
from llmsim.moe_dispatcher import dispatch_syncs_host, routing_map_gather_bytes
from llmsim.moe_einsum import with_einsums
from llmsim.moe_fp8 import (
    pads_expert_rows,
    requant_op,
    split_quantize_ops,
    token_cast_op,
)
from llmsim.moe_host import block_ops
from llmsim.ops import Axis, CommOp, ComputeOp
from llmsim.schedules import SCHEDULES

if TYPE_CHECKING:
    from llmsim.specs import Parallelism
    from llmsim.workload import LayerBuilder, Op

def pairs_overlap(par: Parallelism) -> bool:
    """Whether the all-to-alls hide in the schedule's overlapped forward-backward pairs
    (``moe_a2a_overlap`` under DualPipe) rather than beside a GEMM of their own pass."""
    return par.moe_a2a_overlap and SCHEDULES[par.schedule].overlapped_pairs is not None


ROUTER_PASSES = 3
"""FP32 passes over the router logits: the score function (softmax or sigmoid) reads
and writes them, top-k reads them (Megatron-Core ``TopKRouter.routing``)."""


class MoeBlock:
    """The MoE MLP's forward, input-gradient and weight-gradient ops (module docstring)."""

    def __init__(self, builder: LayerBuilder) -> None:
        b = self.b = builder
        m, par = b.m, b.par
        assert m.moe is not None
        self.moe = m.moe
        self.ep = par.expert_ranks
        self.etp = par.etp
        # Experts split over the TP group (the TP collectives of the routed rows), or
        # whole on each rank with the TP ranks in the all-to-all's group instead.
        self.split = self.etp > 1
        self.axis: Axis = "ep" if self.etp == par.tp else "tp+ep" if self.etp == 1 else "xtp+ep"
        self.routing = self.moe.experts > 1
        self.tokens_routed = b.T / b.t if b.sp else float(b.T)  # T_s
        local, rows = expert_rows(m, par, b.trn)
        self.local = local
        # Mean rows per expert (the model FLOPs) and the busiest rank's excess over it.
        mean = self.ep * expert_group_tokens(par, b.trn) * self.moe.top_k / self.moe.experts
        self.mean_rows = mean
        self.excess = rows / mean
        self.rows = local * rows  # R
        g = 2 if m.activation == "swiglu" else 1
        self.up_n = self.moe.ffn_hidden * g // self.etp
        self.down_k = self.moe.ffn_hidden // self.etp
        # under a schedule that pairs passes (DualPipe) the pair hides the all-to-alls
        self.overlap_a2a = par.moe_a2a_overlap and not pairs_overlap(par)
        self.syncs = dispatch_syncs_host(self.moe, par)
        self.padded = pads_expert_rows(self.moe, par, b.fp8, rows)
        # DeepSeek-V3's FP8 path: the h-wide operands quantised once a token before the
        # all-to-all that carries them in FP8 (:meth:`_fp8_tokens`), not per routed row.
        self.tile_fp8 = b.fp8 and b.trn.fp8_activation_cache and self.routing

    # -- pieces -------------------------------------------------------------------
    def _grouped(self, name: str, phase: str, m: float, n: int, k: int) -> ComputeOp:
        """A grouped GEMM of ``local`` experts, each ``m × n × k`` on average (rows in
        ``m`` when the rows are the output dimension), run for the busiest rank."""
        e, batch = self.b.e, self.local
        shape = tuple(max(1, round(x)) for x in (m, n, k))
        return ComputeOp(name, "gemm", phase, 2.0 * m * n * k * batch,
                         float(e * batch * (m * k + k * n + m * n)), shape, batch,
                         executed_fraction=self.excess)

    def _a2a(self, name: str, phase: str) -> list[CommOp]:
        """One all-to-all over the expert-parallel group of this rank's share of the
        routed rows, ``R·h·e`` (÷t with sequence parallelism). With
        ``training.fp8_activation_cache`` the rows the experts' GEMMs take in FP8 travel in
        it (``e`` = 1 + 4/128): the dispatch's and, backward, the combine's gradients
        before the down-projection (DeepSeek-V3 report §3.3.3, "Low-Precision
        Communication"; the combine and the dispatch's gradients stay in BF16)."""
        if self.ep == 1:
            return []
        fp8 = self.b.trn.fp8_activation_cache and name in ("moe_dispatch", "moe_combine_bwd")
        e = FP8_CACHED_BYTES if fp8 else self.b.e
        nbytes = self.rows / (self.etp if self.b.sp else 1) * self.b.m.hidden * e
        host_s = HOST_SYNC_GAP_S if name == "moe_dispatch" and self.syncs else 0.0
        return [CommOp(name, "all_to_all", self.axis, phase, nbytes, host_s=host_s)]

    def _routing_map_gather(self) -> list[CommOp]:
        """HybridEP's all-gather of the routing map over the expert-parallel group before
        its dispatch, once per MoE layer's forward: ``metadata_preprocessing`` gathers
        every rank's boolean map (``Executor::allgather_routing_map``: NCCL's
        ``all_gather_into_tensor`` across nodes, its own 32-SM NVLink kernel on one node;
        DeepEP ``hybrid-ep`` branch ``csrc/hybrid_ep/executor/executor.cu`` at 34152ae,
        the DeepEP commit Megatron-Bridge 21d102f5e's ``docker/Dockerfile.ci`` builds) and
        its preprocessing kernel reads the result on the same stream before the dispatch,
        so nothing hides it. The backward reuses the forward's handle (Megatron-LM
        ``fused_a2a.py`` ``HybridEPDispatch`` and ``HybridEPCombine`` at 4415119414) and
        gathers nothing. Both ways priced as the collective model's all-gather on the
        group's links."""
        if self.ep == 1 or not self.routing or self.b.par.moe_dispatcher != "hybridep":
            return []
        nbytes = routing_map_gather_bytes(self.tokens_routed, self.moe.experts, self.ep)
        return [CommOp("moe_routing_map_ag", "all_gather", self.axis, "F", nbytes)]

    def _tp(self, name: str, kind: str, phase: str) -> list[CommOp]:
        """A TP collective of the routed rows, ``R·h·e`` bytes (none when the experts are
        whole on each rank)."""
        if not self.split:
            return []
        ops = self.b._tp_comm(name, kind, phase, self.rows * self.b.m.hidden * self.b.e)
        if self.etp < self.b.t:  # over the expert-TP group, part of the TP group
            return [replace(op, axis="etp") for op in ops]
        return ops

    def _tp_exit(self, name: str, phase: str) -> list[CommOp]:
        return self._tp(name, "reduce_scatter" if self.b.sp else "all_reduce", phase)

    def _router(self, phase: str) -> list[ComputeOp]:
        if not self.routing:
            return []
        b = self.b
        ts = int(self.tokens_routed)
        logits = float(ts * self.moe.experts * FP32_BYTES * ROUTER_PASSES)
        gemm = b._gemm("router", "F", ts, self.moe.experts, b.m.hidden)
        if phase == "F":
            return [gemm, ComputeOp("router_topk", "memory", "F", 0.0, logits)]
        dx, _ = b._gemm_grads(gemm)
        return [ComputeOp("router_topk_bwd", "memory", "B", 0.0, logits), dx]

    def _permute(self, name: str, phase: str, unpermute: bool = False) -> list[ComputeOp]:
        """Gather the token rows into expert order (read and write ``T_s·k`` rows); the
        un-permutation reads the ``k`` outputs of each token and writes their weighted sum."""
        if not self.routing:
            return []
        b, rows = self.b, self.tokens_routed * self.moe.top_k
        elements = (rows + self.tokens_routed) if unpermute else 2 * rows
        return [b._mem(name, phase, elements * b.m.hidden, 1)]

    def _fp8(self, name: str, phase: str, width: int) -> list[ComputeOp]:
        """FP8 quantisation of a grouped GEMM's operand, ``R × width`` (the input forward,
        the output gradient backward), as Transformer Engine's ``GroupedLinear`` runs it:
        ``tex.split_quantize`` of the operand into the local experts' row blocks, each with
        its own quantizer (:func:`llmsim.moe_fp8.split_quantize_kernels`). The
        cast-transpose reads 2 and writes 1 + 1 bytes per element; under current scaling
        each expert's amax kernel reads its block once more (2 bytes per element)."""
        if not self.b.fp8:
            return []
        return split_quantize_ops(name, phase, self.rows * width, self.local,
                                  self.b.trn.fp8_scaling)

    def _fp8_tokens(self, name: str, phase: str) -> list[ComputeOp]:
        """DeepSeek-V3's FP8 cast of the ``T_s × h`` token rows before the all-to-all that
        carries them in FP8 (:func:`llmsim.moe_fp8.token_cast_op`), in place of the
        per-expert split quantisation of the routed rows (:meth:`_fp8`)."""
        if not self.tile_fp8:
            return []
        return [token_cast_op(name, phase, self.tokens_routed * self.b.m.hidden, self.b.e)]

    def _fp8_requant(self, name: str) -> list[ComputeOp]:
        """The expert side's transposed re-quantisation of a :meth:`_fp8_tokens` operand's
        ``R × h`` rows for its weight gradient (:func:`llmsim.moe_fp8.requant_op`)."""
        return [requant_op(name, self.rows * self.b.m.hidden)] if self.tile_fp8 else []

    def _padding(self, name: str, phase: str) -> list[ComputeOp]:
        """One FP8 alignment copy of the routed rows (:func:`llmsim.moe_fp8.pads_expert_rows`):
        TE's ``fused_multi_row_padding`` or ``fused_multi_row_unpadding`` reads the ``R × h``
        rows and writes them into (or out of) the aligned blocks, one kernel; then the
        same copy of the rows' FP32 routing probabilities (``permuted_probs``, one value a
        row), which the forward pads beside the input and the backward unpads. The padding
        rows, under 16 an expert, are not counted."""
        if not self.padded:
            return []
        b = self.b
        ops = [b._mem(name, phase, self.rows * b.m.hidden, 2)]
        if name in ("expert_pad", "expert_pad_bwd"):
            ops.append(ComputeOp(f"{name}_probs", "memory", phase, 0.0,
                                 2.0 * FP32_BYTES * self.rows))
        return ops

    def _shared(self) -> tuple[list[list[Op]], list[Op], list[Op]]:
        """Shared experts: a dense MLP of ``shared_experts·ffn_hidden`` width on every
        token, with its own TP collectives (Megatron-Core ``SharedExpertMLP``). The
        forward in four pieces: the input all-gather, the first projection and
        activation, the second projection, and the reduce-scatter and add."""
        s = self.moe.shared_experts
        if not s:
            return [[], [], [], []], [], []
        b = self.b
        g = 2 if b.m.activation == "swiglu" else 1
        width = s * self.moe.ffn_hidden // b.t
        up = b._gemm("shared_up", "F", b.T, width * g, b.m.hidden)
        down = b._gemm("shared_down", "F", b.T, b.m.hidden, width)
        act_passes = 3 if b.m.activation == "swiglu" else 2
        up_dx, up_dw = b._gemm_grads(up)
        down_dx, down_dw = b._gemm_grads(down)
        fwd: list[list[Op]] = [[*b._entry("tp_ag_shared", "F")],
                               [up, b._mem("shared_act", "F", b.T * width, act_passes)],
                               [down],
                               [*b._exit("tp_shared", "F"), b._mem("shared_add", "F", b.stream, 3)]]
        bwd: list[Op] = [*b._entry("tp_ag_shared_bwd", "B"), down_dx,
                         b._mem("shared_act_bwd", "B", b.T * width, act_passes + 1), up_dx,
                         *b._exit("tp_shared_bwd", "B")]
        return fwd, bwd, [down_dw, up_dw]

    # -- the block -----------------------------------------------------------------
    def ops(self) -> tuple[list[Op], list[Op], list[Op]]:
        """Forward, input-gradient and weight-gradient ops of the MoE MLP (between the
        second norm and the second residual add)."""
        b, h = self.b, self.b.m.hidden
        act_passes = 3 if b.m.activation == "swiglu" else 2
        mean = self.mean_rows
        up = self._grouped("expert_up", "F", mean, self.up_n, h)
        down = self._grouped("expert_down", "F", mean, h, self.down_k)
        gather = self._tp("tp_ag_moe", "all_gather", "F") if b.sp else []
        act_elements = self.rows * self.down_k
        (shared_in, shared_up, shared_down, shared_out), shared_b, shared_w = self._shared()
        overlap = b.par.moe_shared_expert_overlap and bool(shared_up) and self.ep > 1
        dispatch, combine = self._a2a("moe_dispatch", "F"), self._a2a("moe_combine", "F")
        # With the all-to-all overlap each all-to-all sits next to the expert GEMM it is
        # priced against (before the TP gather, after the TP reduce-scatter: the order of
        # a pass's serial ops does not change its time).
        a2a_overlap = self.overlap_a2a and not overlap
        exit_f = self._tp_exit("tp_moe", "F")
        if overlap:  # each all-to-all beside the shared expert's next GEMM
            dispatch = [replace(op, pairs_with="next") for op in dispatch]
            combine = [replace(op, pairs_with="next") for op in combine]
            beside_dispatch, beside_combine, after = shared_up, shared_down, []
        else:
            beside_dispatch, beside_combine, after = [], [], shared_up + shared_down
        if a2a_overlap:
            dispatch = [*gather, *(replace(op, pairs_with="next") for op in dispatch)]
            combine = [*(replace(op, pairs_with="previous") for op in combine), *exit_f]
            gather, exit_f = [], []
        up_cast = [] if self.tile_fp8 else self._fp8("expert_up", "F", h)
        fwd: list[Op] = [
            *(shared_in if overlap else []),
            *self._router("F"), *self._fp8_tokens("expert_up", "F"),
            *self._permute("moe_permute", "F"),
            *self._routing_map_gather(), *dispatch, *beside_dispatch, *gather,
            *self._padding("expert_pad", "F"), *up_cast, up,
            b._mem("expert_act", "F", act_elements, act_passes),
            *self._fp8("expert_down", "F", self.down_k), down,
            *self._padding("expert_unpad", "F"),
            *exit_f,
            *combine, *beside_combine, *self._permute("moe_unpermute", "F", True),
            *([] if overlap else shared_in), *after, *shared_out,
        ]
        gather_b = self._tp("tp_ag_moe_bwd", "all_gather", "B") if b.sp else []
        combine_b, exit_b = self._a2a("moe_combine_bwd", "B"), self._tp_exit("tp_moe_bwd", "B")
        dispatch_b = self._a2a("moe_dispatch_bwd", "B")
        if self.overlap_a2a:
            combine_b = [*gather_b, *(replace(op, pairs_with="next") for op in combine_b)]
            dispatch_b = [*(replace(op, pairs_with="previous") for op in dispatch_b), *exit_b]
            gather_b, exit_b = [], []
        down_grad_cast = [] if self.tile_fp8 else self._fp8("expert_down_grad", "B", h)
        bwd: list[Op] = [
            *shared_b, *self._fp8_tokens("expert_down_grad", "B"),
            *self._permute("moe_unpermute_bwd", "B", True), *combine_b,
            *gather_b, *self._padding("expert_unpad_bwd", "B"),
            *down_grad_cast,
            self._grouped("expert_down_dx", "B", mean, self.down_k, h),
            b._mem("expert_act_bwd", "B", act_elements, act_passes + 1),
            *self._fp8("expert_up_grad", "B", self.up_n),
            self._grouped("expert_up_dx", "B", mean, h, self.up_n),
            *self._padding("expert_pad_bwd", "B"),
            *exit_b,
            *dispatch_b, *self._permute("moe_permute_bwd", "B"),
            *self._router("B"),
        ]
        # dW = Xᵀ·dY per expert: (k × n), reducing over its rows.
        wgt: list[Op] = [
            *self._fp8_requant("expert_down_grad"),
            self._grouped_wgrad("expert_down_dw", self.down_k, h),
            *self._fp8_requant("expert_up"),
            self._grouped_wgrad("expert_up_dw", h, self.up_n),
            *([b._gemm_grads(b._gemm("router", "F", int(self.tokens_routed),
                                     self.moe.experts, h))[1]] if self.routing else []),
            *shared_w,
        ]
        return fwd, bwd, wgt

    def _grouped_wgrad(self, name: str, k: int, n: int) -> ComputeOp:
        """Weight gradient of a grouped GEMM: per expert ``k × n`` over its mean rows."""
        e, batch, m = self.b.e, self.local, self.mean_rows
        shape = (k, n, max(1, round(m)))
        return ComputeOp(name, "gemm", "W", 2.0 * m * n * k * batch,
                         float(e * batch * (m * k + m * n + k * n)), shape, batch,
                         executed_fraction=self.excess)


def replace_mlp(fwd: list[Op], bwd: list[Op], wgt: list[Op],
                builder: LayerBuilder) -> tuple[list[Op], list[Op], list[Op]]:
    """A dense block's forward, input-gradient and weight-gradient ops with its MLP (from
    after ``ln2`` to before ``residual2``; in the backward from after ``residual2_bwd``
    to before ``ln2_bwd``; the MLP's weight gradients) replaced by the MoE MLP's."""
    block = MoeBlock(builder)
    # with the host's loops (moe_host), the experts' (expert_loop) and DeepSpeed's einsums
    # (moe_einsum)
    moe_f, moe_b, moe_w = with_einsums(block, *with_expert_loop(block, *block_ops(block)))
    f0 = _index(fwd, "ln2") + 1
    f1 = _index(fwd, "residual2")
    b0 = _index(bwd, "residual2_bwd") + 1 if any(o.name == "residual2_bwd" for o in bwd) else 0
    b1 = _index(bwd, "ln2_bwd")
    dense_w = {"mlp_down_dw", "mlp_up_dw"}
    return (fwd[:f0] + moe_f + fwd[f1:], bwd[:b0] + moe_b + bwd[b1:],
            moe_w + [op for op in wgt if op.name not in dense_w])


def _index(ops: list[Op], name: str) -> int:
    for i, op in enumerate(ops):
        if op.name == name:
            return i
    raise AssertionError(f"no op {name!r} in the dense block")  # a workload/layer.py rename
