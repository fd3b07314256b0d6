"""DualPipe's overlapped forward-backward pairs in the estimator: each stage's passes
split into computation and all-to-alls on the units the all-to-all kernels leave.

The engine prices a pass of an overlapped pair (:mod:`llmsim.engine.pairs`, DeepSeek-V3
report §3.2.1, Figure 4) from its chunk's blocks with ``parallelism.moe_comm_units``
compute units held (:attr:`llmsim.workload.Workload.pair_comm_units`): the forward keeps
``max(0, a_F − c_BW)`` of its all-to-alls, ``c_BW`` being the partner backward's and
weight pass's computation, the backward ``max(0, a_B − c_F)``. :func:`stage_pair_parts`
prices the same blocks — the same ops (:func:`llmsim.workload.pass_ops`,
:func:`llmsim.workload.chunk_extras`) on the same costs with the same units held — so that
:mod:`.two_pipelines` can give the walk's paired passes the engine's durations
(:func:`paired_passes`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llmsim.blocks import Block
from llmsim.moe import pairs_overlap
from llmsim.specs import Scenario
from llmsim.workload import chunk_extras, pass_ops


@dataclass(frozen=True, slots=True)
class PairParts:
    """One stage's chunk, one micro-batch, with the pair's units held: seconds of
    computation (compute, TP and CP time) and of all-to-alls of each pass."""

    forward_s: float
    forward_a2a_s: float
    backward_s: float
    """Input-gradient pass (recompute included), computation."""
    backward_a2a_s: float
    weight_s: float
    """Weight-gradient pass with its gradient accumulation, computation."""


def paired_passes(own: PairParts, partner: PairParts) -> tuple[float, float]:
    """(forward, backward) seconds of ``own``'s chunk in a pair with ``partner``'s, as the
    engine prices them (:func:`llmsim.engine.pairs.beside_partner`): each keeps the part
    of its all-to-alls the partner's computation does not hide."""
    forward = own.forward_s + max(0.0, own.forward_a2a_s - partner.backward_s
                                  - partner.weight_s)
    backward = own.backward_s + max(0.0, own.backward_a2a_s - partner.forward_s)
    return forward, backward


MEMO = 256
"""Layouts whose stages' pair parts one process keeps (few layouts run DualPipe's pairs)."""

_MEMO: dict[tuple, tuple[Any, list[PairParts]]] = {}


def stage_pair_parts(sc: Scenario, costs: Any, split: list[list[int]],
                     starts: list[list[int]]) -> list[PairParts] | None:
    """Per stage, its single chunk's :class:`PairParts` (chunk ``split[s][0]`` layers from
    layer ``starts[s][0]``; the embedding on stage 0, the LM head on the last), or None
    where the layout's pairs are not overlapped (:func:`llmsim.moe.pairs_overlap`)."""
    par, model, training = sc.parallelism, sc.model, sc.training
    if not pairs_overlap(par):
        return None
    key = (id(costs), id(model), id(training), par.model_dump_json(),
           tuple(map(tuple, split)), tuple(map(tuple, starts)))
    hit = _MEMO.get(key)
    if hit is None:
        if len(_MEMO) >= MEMO:
            _MEMO.clear()
        hit = _MEMO[key] = ((costs, model, training), _price(sc, costs, split, starts))
    return hit[1]


def _price(sc: Scenario, costs: Any, split: list[list[int]],
           starts: list[list[int]]) -> list[PairParts]:
    par, model, training = sc.parallelism, sc.model, sc.training
    ops, held, otp = pass_ops(model, par, training), par.moe_comm_units, par.overlap_tp_comm
    priced: dict[tuple, tuple[float, float]] = {}

    def parts(*lists: tuple) -> tuple[float, float]:
        """(computation, all-to-all) seconds of ``lists`` laid out one after another."""
        comp = a2a = 0.0
        for o in lists:
            if not o:
                continue
            hit = priced.get(o)
            if hit is None:
                block = Block.of(tuple(o), costs, otp, held)
                hit = priced[o] = (block.duration_s - block.a2a_s, block.a2a_s)
            comp, a2a = comp + hit[0], a2a + hit[1]
        return comp, a2a

    p, out = len(split), []
    for s in range(p):
        n, start = split[s][0], starts[s][0]
        first, last = s == 0, s == p - 1
        layers = [ops.block(model, i) for i in range(start, start + n)]
        amax_f, amax_b, accumulate = chunk_extras(model, par, training, n, first, last, start)
        emb, head = ops.embedding, ops.head
        f = parts(*([emb[0]] if first else []), *(lay[0] for lay in layers), tuple(amax_f),
                  *([head[0]] if last else []))
        b = parts(*([head[1]] if last else []), *(x for lay in layers for x in lay[1:3]),
                  tuple(amax_b), *([emb[1]] if first else []))
        w = parts(*([head[2]] if last else []), *(lay[3] for lay in layers),
                  *([emb[2]] if first else []), tuple(accumulate))
        out.append(PairParts(f[0], f[1], b[0], b[1], w[0]))
    return out
