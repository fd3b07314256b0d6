"""DeepSpeed's GShard-style token dispatch and combine: dense einsums over one-hot masks.

DeepSpeed's ``MOELayer`` (``deepspeed/moe/sharded_moe.py``, read at 07887f66 of
2021-12-12, the DeepSpeed of DeepSpeed-MoE's runs, Rajbhandari et al. 2022,
arXiv:2201.05596; ``USE_EINSUM = True``) implements GShard's Algorithm 2 (Lepikhin et al.
2021, arXiv:2006.16668) with no gather of the token rows: ``top1gating`` builds a
``[S, E, C]`` (tokens, experts, capacity) tensor of combine weights and a dispatch mask,
and two matrix products move the tokens:

forward
    ``combine_weights = einsum("se,sc->sec", gates, locations1_sc)`` writes the FP32
    ``[S, E, C]`` weights; ``dispatch_mask = combine_weights.bool()`` reads them and writes a
    byte each; ``dispatch_mask.type_as(input)`` reads that and writes 2 bytes each;
    ``einsum("sec,sm->ecm", ...)`` is a GEMM ``[E·C, S] × [S, M]`` (the dispatch, before the
    all-to-all); after the combine all-to-all ``combine_weights.type_as(input)`` reads the
    FP32 weights and writes 16-bit ones, and ``einsum("sec,ecm->sm", ...)`` is a GEMM
    ``[S, E·C] × [E·C, M]``. Elements moved: 4 + (4 + 1) + (1 + 2) + (4 + 2) = 18 bytes per
    ``[S, E, C]`` entry, besides the GEMMs' own operands.
backward
    the combine's two gradients (the expert output's ``[E·C, S] × [S, M]`` and the combine
    weights' ``[S, M] × [M, E·C]``), the cast of the latter back to FP32 (2 + 4 bytes an
    entry) and the ``"se,sc->sec"`` einsum's gradient for the gates, which reads it (4
    bytes); the dispatch's input gradient ``[S, E·C] × [E·C, M]`` (the mask takes none).

Each of the four forward and three backward products is ``2·S·E·C·M`` FLOPs, whatever the
routing: at DeepSpeed-MoE's 1.3B+MoE-128 (8,192 tokens a GPU, 128 experts, capacity 64,
hidden 2,048) 275 GFLOP each, as much as the expert's own two GEMMs together. The capacity
is DeepSpeed's ``_capacity``: ``ceil(S/E · capacity_factor)`` for top-1, twice the factor
for top-2 (``top2gating``), ``ceil(S·k·f/E)``; its ``min_capacity`` (4) is not counted.
The gate's host read of the expert counts (``exp_counts = ... .to('cpu')`` in every
forward) is priced with the dispatch (:func:`llmsim.moe_dispatcher.dispatch_syncs_host`).
These ops replace the Megatron-Core row permutations (``moe_permute``, ``moe_unpermute``
and their gradients) of :mod:`llmsim.moe` under ``parallelism.moe_dispatcher: deepspeed``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from llmsim.ops import ComputeOp

if TYPE_CHECKING:
    from llmsim.moe import MoeBlock
    from llmsim.workload import Op

MASK_FWD_BYTES_PER_ENTRY = 18
"""Bytes the forward's mask kernels move per ``[S, E, C]`` entry (module docstring): the
FP32 combine weights written (4), ``.bool()`` (4 read, 1 written), the dispatch mask's cast
(1 read, 2 written), the combine weights' cast (4 read, 2 written)."""

MASK_BWD_BYTES_PER_ENTRY = 10
"""Bytes the backward's mask kernels move per ``[S, E, C]`` entry: the 16-bit gradient of
the combine weights cast to FP32 (2 read, 4 written) and read by the gates' gradient (4)."""


def capacity(tokens: float, experts: int, top_k: int, capacity_factor: float) -> int:
    """Rows an expert takes from one rank's ``tokens``: DeepSpeed's ``_capacity``,
    ``ceil(tokens/experts · capacity_factor)`` with the factor doubled for top-2,
    ``ceil(tokens·top_k·capacity_factor/experts)``."""
    return max(1, math.ceil(tokens * top_k * capacity_factor / experts))


def mask_entries(block: MoeBlock) -> tuple[int, int, int]:
    """``(S, E·C, S·E·C)``: the rank's routed tokens, the dispatched rows and the entries of
    the ``[S, E, C]`` masks."""
    moe = block.moe
    s = int(block.tokens_routed)
    factor = 1.0 if moe.capacity_factor is None else moe.capacity_factor
    ec = moe.experts * capacity(s, moe.experts, moe.top_k, factor)
    return s, ec, s * ec


def forward_ops(block: MoeBlock, name: str) -> list[ComputeOp]:
    """The ops that stand for ``moe_permute`` (the masks and the dispatch GEMM) or
    ``moe_unpermute`` (the combine GEMM) in the forward."""
    b, h = block.b, block.b.m.hidden
    s, ec, n = mask_entries(block)
    if name == "moe_permute":
        masks = ComputeOp("moe_einsum_masks", "memory", "F", 0.0,
                          float(MASK_FWD_BYTES_PER_ENTRY * n))
        return [masks, b._gemm("moe_dispatch_einsum", "F", ec, h, s)]
    return [b._gemm("moe_combine_einsum", "F", s, h, ec)]


def backward_ops(block: MoeBlock, name: str) -> list[ComputeOp]:
    """The ops that stand for ``moe_unpermute_bwd`` (the combine's two gradients and the
    weights' cast back) or ``moe_permute_bwd`` (the dispatch's input gradient)."""
    b, h = block.b, block.b.m.hidden
    s, ec, n = mask_entries(block)
    if name == "moe_unpermute_bwd":
        return [b._gemm("moe_combine_einsum_dx", "B", ec, h, s),
                b._gemm("moe_combine_einsum_dw", "B", s, ec, h),
                ComputeOp("moe_einsum_masks_bwd", "memory", "B", 0.0,
                          float(MASK_BWD_BYTES_PER_ENTRY * n))]
    return [b._gemm("moe_dispatch_einsum_dx", "B", s, h, ec)]


def with_einsums(block: MoeBlock, fwd: list[Op], bwd: list[Op],
                 wgt: list[Op]) -> tuple[list[Op], list[Op], list[Op]]:
    """A MoE block's ops with the row permutations replaced by DeepSpeed's einsums under
    ``parallelism.moe_dispatcher: deepspeed``; as they are otherwise or without routing."""
    if block.b.par.moe_dispatcher != "deepspeed" or not block.routing:
        return fwd, bwd, wgt
    out_f: list[Op] = []
    for op in fwd:
        out_f += forward_ops(block, op.name) if op.name in ("moe_permute",
                                                            "moe_unpermute") else [op]
    out_b: list[Op] = []
    for op in bwd:
        out_b += backward_ops(block, op.name) if op.name in ("moe_permute_bwd",
                                                             "moe_unpermute_bwd") else [op]
    return out_f, out_b, wgt

