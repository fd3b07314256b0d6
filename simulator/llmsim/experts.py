"""Expert routing arithmetic: how many token rows each expert-parallel rank computes,
and what a mixture-of-experts block stores for its backward.

Conventions (Megatron-Core's ``MoEAlltoAllTokenDispatcher``): one micro-batch puts
``T`` tokens through each tensor-parallel group; with expert tensor parallelism equal to
``tp`` the ``ep`` groups of one expert-parallel group route their ``ep·T`` tokens,
``top_k`` assignments each, to ``experts`` experts, ``experts / ep`` of them on each
rank; with ``expert_tp`` 1 the ``tp·ep`` ranks route ``T/tp`` tokens each (the same
``ep·T`` in all) to ``experts / (tp·ep)`` whole experts each. Routing is balanced in
expectation (the load-balancing loss, or DeepSeek-V3's bias adjustment, keeps every
expert's expected share equal), so a rank receives ``T·top_k`` rows on average (``T/tp``
times that with ``expert_tp`` 1); the busiest rank sets the pace of the step's
all-to-alls and grouped GEMMs (:func:`busiest_rank_factor`).
"""

from __future__ import annotations

import math

from llmsim.partition import chunk_first_layer
from llmsim.specs import Model, Parallelism, Training

FP32_BYTES = 4
"""The router's logits and probabilities are kept in FP32 (Megatron-Core ``TopKRouter``
casts its input with ``moe_router_dtype`` fp32 for stability)."""
FP8_CACHED_BYTES = 1 + 4 / 128
"""Bytes of one activation element cached in FP8 with DeepSeek-V3's fine-grained
quantisation: one byte, plus one FP32 scaling factor per 1×128 tile of a row (DeepSeek-V3
report §3.3.1 and §3.3.3)."""


def busiest_rank_factor(rows: float, ep: int) -> float:
    """Expected load of the busiest of ``ep`` ranks over the mean load, dropless routing.

    Each of ``rows = ep·T·k`` token-to-expert assignments lands on a given rank with
    probability ``1/ep`` (experts equally likely, each rank holding ``experts/ep``), so a
    rank's load is Binomial(rows, 1/ep): mean ``μ = rows/ep``, variance
    ``σ² = μ(1 − 1/ep)``. The expected maximum of ``ep`` such loads, taken as independent
    normals, is at most ``μ + σ·√(2 ln ep)`` (the Gaussian maximal inequality, e.g.
    Boucheron, Lugosi & Massart 2013, *Concentration Inequalities* §2.5), which this
    returns divided by ``μ``. It is the imbalance of an ideally balanced router: a
    trained router's is larger, and a capacity factor bounds it (:func:`expert_rows`).
    """
    if ep <= 1 or rows <= 0:
        return 1.0
    mean = rows / ep
    return 1.0 + math.sqrt(2.0 * math.log(ep) * (1.0 - 1.0 / ep) / mean)


def expert_rows(model: Model, par: Parallelism, training: Training) -> tuple[int, float]:
    """(local experts, token rows of each) in one micro-batch's grouped expert GEMMs on
    the busiest expert-parallel rank.

    Dropless: the rank's ``T·k·λ`` rows (λ :func:`busiest_rank_factor`) spread evenly
    over its experts. With a capacity factor ``C`` every expert computes exactly
    ``⌈C·ep·T·k/experts⌉`` rows, dropped tokens and padding included (Megatron-Core
    ``--moe-pad-expert-input-to-capacity``; Fedus et al. 2022, Switch Transformer §2.2).
    With ``expert_tp`` 1 the ``tp·ep`` ranks (:attr:`Parallelism.expert_ranks`) take the
    place of ``ep`` and each routes ``T/tp`` tokens (:func:`expert_group_tokens`).
    """
    moe = model.moe
    assert moe is not None
    tokens = expert_group_tokens(par, training)
    ranks = par.expert_ranks
    if moe.experts % ranks:
        raise ValueError(f"parallelism: {ranks} expert-parallel ranks (tp·ep/expert_tp) do "
                         f"not divide the {moe.experts} experts; change ep or expert_tp")
    local = moe.experts // ranks
    assignments = ranks * tokens * moe.top_k
    if moe.capacity_factor is not None:
        return local, float(math.ceil(moe.capacity_factor * assignments / moe.experts))
    per_rank = tokens * moe.top_k * busiest_rank_factor(assignments, ranks)
    return local, per_rank / local


def expert_group_tokens(par: Parallelism, training: Training) -> float:
    """Tokens of one micro-batch that one expert-tensor-parallel group routes: the ``T``
    tokens of a TP group (``s/cp`` of each sequence) when the experts are split like the
    dense MLP (``expert_tp`` = tp); with ``expert_tp`` 1 and sequence parallelism each
    rank routes its own ``T/tp`` (Megatron-Core's ``MoEAlltoAllTokenDispatcher`` skips
    the TP all-gather then), ``T·expert_tp/tp`` in general."""
    tokens = par.micro_batch * training.seq_len // par.cp
    if par.sequence_parallel and par.tp > 1:
        return tokens * par.etp / par.tp
    return float(tokens)


def routed_rows(model: Model, par: Parallelism, training: Training) -> float:
    """Token rows the busiest rank's experts compute in one micro-batch (all its
    experts together)."""
    local, rows = expert_rows(model, par, training)
    return local * rows


def moe_activation_bytes_delta(model: Model, par: Parallelism, training: Training,
                               element_bytes: int) -> float:
    """What one MoE block stores for its backward beyond the dense block it replaces,
    bytes on one device for one micro-batch (no recompute; full recompute keeps only
    the block input, the same as a dense block), of the ``s/cp`` tokens the rank holds;
    0 for a dense model.

    The dense MLP's TP-sharded tensors, ``e·sb·(g + 1)·f/t`` (``g`` = 2 activation
    inputs for SwiGLU, else 1; see :func:`llmsim.memory.activation_bytes_per_layer`),
    give way to: the routed experts' activation inputs and down-projection input
    ``e·R·(g + 1)·f_e/t_e`` (``R`` = :func:`routed_rows`, ``t_e`` the experts' TP
    degree, :attr:`Parallelism.etp`), the shared experts'
    ``e·sb·(g + 1)·s·f_e/t`` and, when there is routing to do (more than one expert),
    the permuted expert input rows ``e·R·h`` (kept whole on each TP rank for the weight
    gradient) and the router's FP32 probabilities, ``4·sb·experts`` (÷t with sequence
    parallelism). One expert is the dense MLP: no router, no permutation, and the delta
    is 0 when its width is the dense one.

    With ``training.fp8_activation_cache`` (DeepSeek-V3 report §3.3.3) the permuted rows
    and the routed and shared experts' activation inputs are kept in FP8
    (:data:`FP8_CACHED_BYTES` an element) and the down-projection inputs are not kept
    (the activation is recomputed in the backward): ``e_8·R·(h + g·f_e/t_e)`` and
    ``e_8·sb·g·s·f_e/t``.
    """
    moe = model.moe
    if moe is None or par.recompute == "full":
        return 0.0
    t, sb = par.tp, par.micro_batch * training.seq_len // par.cp
    g = 2 if model.activation == "swiglu" else 1
    dense = element_bytes * sb * (g + 1) * model.ffn_hidden / t
    rows = routed_rows(model, par, training)
    # bytes an element and elements a row of the experts' activation input and output
    kept, widths = ((FP8_CACHED_BYTES, g) if training.fp8_activation_cache
                    else (element_bytes, g + 1))
    routed = kept * rows * widths * moe.ffn_hidden / par.etp
    shared = kept * sb * widths * moe.shared_experts * moe.ffn_hidden / t
    routing = 0.0
    if moe.experts > 1:
        row_bytes = FP8_CACHED_BYTES if training.fp8_activation_cache else element_bytes
        routing = (row_bytes * rows * model.hidden
                   + FP32_BYTES * sb * moe.experts / (t if par.sequence_parallel else 1))
    return routed + shared + routing - dense


def moe_layers_in_flight(model: Model, split: list[list[int]], in_flight: list[int],
                         stage: int) -> int:
    """MoE layers' activations a stage holds at its peak: Σ over its chunks of the
    chunk's MoE layers × its micro-batches in flight (``in_flight[chunk]``)."""
    if model.moe is None:
        return 0
    total = 0
    for chunk, layers in enumerate(split[stage]):
        start = chunk_first_layer(split, stage, chunk)
        total += in_flight[chunk] * (model.moe.moe_layers(start + layers)
                                     - model.moe.moe_layers(start))
    return total
