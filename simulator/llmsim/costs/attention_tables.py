"""Fused attention kernels timed on the board, looked up by shape.

An accelerator's catalog may hold causal kernels timed by (query heads, KV heads,
sequence, head dimension) (``flash_attention_measured``, ``cudnn_attention_measured``)
and non-causal blocks by (query heads, KV heads, query tokens, key-value tokens, head
dimension) (``flash_attention_blocks_measured``, ``cudnn_attention_blocks_measured``),
each with its forward and backward TFLOP/s (:data:`llmsim.specs.accelerator.
MeasuredAttention`). A shape in the table runs at its rate. Any other shape of a head
dimension the table has is interpolated: for each measured length, linearly in
log₂(query heads) over that length's rows (rows of equal heads and different KV heads
averaged: the KV heads move the measured rates by a few per cent), held beyond the
fewest and most heads; then linearly in log₂(length) over the lengths, held beyond the
longest (the rates are flat from 16k tokens on). A causal length is its sequence, a
block's its work, log₂(q·kv). Shorter than the shortest measured: no rate (the caller
keeps the catalog's fraction): short kernels run much slower than the table's shortest
and holding its rate would price them too fast.

With context parallelism (``ComputeOp.attention_ring_steps`` = cp, :mod:`llmsim.context`)
a rank's attention runs as cp steps of its ``s/cp`` tokens' queries: the first against
its own keys, a causal square of ``s/cp`` (Transformer Engine keeps each rank's two
chunks of ``s/(2·cp)`` in order, so one causal mask covers them), 1/cp of the rank's
executed FLOPs; each of the others non-causal against a peer's, either all its queries
against half the peer's keys or half its queries against all of them, ``s/cp × s/(2·cp)``
either way (the peer's chunk that precedes the rank's); taken half each. With no block
measured the steps run at the causal square's rate, as before the blocks were timed.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from functools import lru_cache

import numpy as np

from llmsim.ops import ComputeOp
from llmsim.specs import Accelerator, AttentionKernel

Rates = tuple[float, float]
"""Forward and backward FLOP/s."""
_Grid = dict[int, list[tuple[float, np.ndarray, np.ndarray, np.ndarray]]]
"""By head dimension: per length (log₂, ascending), log₂ heads and the forward and
backward rates (FLOP/s) at those heads, ascending in heads."""


def _grid(rows: Iterable[tuple[int, int, float, float, float]]) -> _Grid:
    """Rows of (head dim, heads, log₂ length, forward, backward TFLOP/s) as a grid; rows of
    equal shape but KV heads averaged."""
    points: dict[tuple[int, float, int], list[tuple[float, float]]] = defaultdict(list)
    for dim, heads, length, fwd, bwd in rows:
        points[(dim, length, heads)].append((fwd * 1e12, bwd * 1e12))
    by_dim: dict[int, dict[float, list[tuple[float, float, float]]]] = defaultdict(
        lambda: defaultdict(list))
    for (dim, length, heads), rates in sorted(points.items()):
        by_dim[dim][length].append((math.log2(heads), float(np.mean([r[0] for r in rates])),
                                    float(np.mean([r[1] for r in rates]))))
    return {dim: [(length, np.array([p[0] for p in ps]), np.array([p[1] for p in ps]),
                   np.array([p[2] for p in ps])) for length, ps in sorted(lengths.items())]
            for dim, lengths in by_dim.items()}


def _interpolate(grid: _Grid, dim: int, heads: int, length: float) -> Rates | None:
    """Rates at ``heads`` and log₂ length ``length`` (module docstring), or None where the
    grid has no such head dimension or the length is below its shortest."""
    rows = grid.get(dim)
    if not rows or length < rows[0][0] - 1e-9:
        return None
    x = math.log2(heads)
    lengths = [r[0] for r in rows]
    fwd = [float(np.interp(x, r[1], r[2])) for r in rows]
    bwd = [float(np.interp(x, r[1], r[3])) for r in rows]
    return float(np.interp(length, lengths, fwd)), float(np.interp(length, lengths, bwd))


class AttentionTable:
    """One kernel's measured causal and non-causal attention rates (module docstring)."""

    def __init__(self, causal: Iterable[tuple[int, int, int, int, float, float]],
                 blocks: Iterable[tuple[int, int, int, int, int, float, float]] = ()) -> None:
        causal, blocks = list(causal), list(blocks)
        self._causal = {(q, kv, s, d): (f * 1e12, b * 1e12) for q, kv, s, d, f, b in causal}
        self._blocks = {(q, kv, sq, skv, d): (f * 1e12, b * 1e12)
                        for q, kv, sq, skv, d, f, b in blocks}
        self._causal_grid = _grid((d, q, math.log2(s), f, b) for q, _, s, d, f, b in causal)
        self._block_grid = _grid((d, q, math.log2(sq * skv), f, b)
                                 for q, _, sq, skv, d, f, b in blocks)

    def __bool__(self) -> bool:
        return bool(self._causal)

    def causal(self, heads: int, kv_heads: int, seq: int, head_dim: int) -> Rates | None:
        """Forward and backward FLOP/s of a causal kernel of this shape, or None."""
        exact = self._causal.get((heads, kv_heads, seq, head_dim))
        if exact is not None:
            return exact
        return _interpolate(self._causal_grid, head_dim, heads, math.log2(seq))

    def block(self, heads: int, kv_heads: int, q_tokens: int, kv_tokens: int,
              head_dim: int) -> Rates | None:
        """Forward and backward FLOP/s of a non-causal block of this shape, or None."""
        exact = self._blocks.get((heads, kv_heads, q_tokens, kv_tokens, head_dim))
        if exact is not None:
            return exact
        return _interpolate(self._block_grid, head_dim, heads, math.log2(q_tokens * kv_tokens))

    def math_s(self, op: ComputeOp) -> float | None:
        """Time of a fused attention op at the measured rates, s, or None where the table
        has no rate for its shape. A context-parallel op (``attention_ring_steps`` > 1)
        runs its first step at the causal rate and the others at the blocks' (module
        docstring)."""
        if op.attention_shape is None or op.attention_heads is None:
            return None
        (seq, dim), (heads, kv) = op.attention_shape, op.attention_heads
        backward = op.phase == "B"
        square = self.causal(heads, kv, seq, dim)
        if square is None:
            return None
        flops, steps = op.executed_flops, op.attention_ring_steps
        if steps <= 1:
            return flops / square[backward]
        half = max(1, seq // 2)
        blocks = [self.block(heads, kv, seq, half, dim), self.block(heads, kv, half, seq, dim)]
        rates = [b[backward] for b in blocks if b is not None]
        if len(rates) < 2:  # no blocks measured: every step at the square's rate
            return flops / square[backward]
        off_diagonal = flops * (steps - 1) / steps
        return flops / steps / square[backward] + sum(off_diagonal / 2 / r for r in rates)


def attention_table(accelerator: Accelerator, kernel: AttentionKernel) -> AttentionTable:
    """The catalog's measured table of ``kernel`` (``flash`` or ``cudnn``); empty where it
    has none. Built once per distinct table: a search builds a cost model per placement."""
    if kernel == "cudnn":
        causal, blocks = (accelerator.cudnn_attention_measured,
                          accelerator.cudnn_attention_blocks_measured)
    else:
        causal, blocks = (accelerator.flash_attention_measured,
                          accelerator.flash_attention_blocks_measured)
    return _table(tuple(map(tuple, causal)), tuple(map(tuple, blocks)))


@lru_cache(maxsize=16)
def _table(causal: tuple, blocks: tuple) -> AttentionTable:
    return AttentionTable(causal, blocks)
