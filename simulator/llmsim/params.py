"""Parameters held by one device: Megatron's tensor-parallel split of each block, the
vocabulary-parallel embedding and LM head (Shoeybi et al. 2019 §3)."""

from __future__ import annotations

import math

from llmsim.partition import chunk_first_layer
from llmsim.specs import Model


def kv_dim_per_rank(model: Model, tp: int) -> int:
    """Key (or value) width on one TP rank; heads are replicated when tp > kv_heads."""
    return max(model.n_kv_heads // tp, 1) * model.head_dim


def layer_params_per_device(model: Model, tp: int) -> int:
    """Parameters of one transformer block on one TP rank (Megatron's split).

    Column-parallel matrices (QKV, MLP up/gate) and their biases and row-parallel matrices
    (attention output, MLP down) are divided by ``tp`` (Shoeybi et al. 2019 §3); norms and
    row-parallel biases are replicated on every rank. K/V heads are replicated when
    ``tp > kv_heads``. With ``tp = 1`` this equals ``Model.params_per_layer``.
    """
    h, f = model.hidden, model.ffn_hidden
    q, kv, f_rank = model.q_dim // tp, kv_dim_per_rank(model, tp), f // tp
    attention = h * (q + 2 * kv) + q * h if model.mla is None else mla_params_per_device(model, tp)
    matrices = attention + model.mlp_matrices * h * f_rank
    biases = (q + 2 * kv) + (model.mlp_matrices - 1) * f_rank + 2 * h if model.bias else 0
    norms = 2 * h * (2 if model.norm == "layernorm" else 1)
    return matrices + biases + norms


def embedding_params_per_device(model: Model, tp: int) -> int:
    """Vocabulary-parallel word embedding (⌈V/t⌉·h) plus replicated learned positions."""
    positions = model.embedding_params - model.vocab * model.hidden
    return math.ceil(model.vocab / tp) * model.hidden + positions


def head_params_per_device(model: Model, tp: int, pp: int) -> int:
    """Final norm plus the vocabulary-parallel LM head on the last stage.

    With tied embeddings and ``pp > 1`` Megatron keeps a copy of the word embedding on the
    last stage and all-reduces the two copies' gradients (Narayanan et al. 2021, and
    Megatron-LM ``setup_embeddings_and_output_layer``), so the head is counted there.
    """
    final_norm = model.head_params - (0 if model.tied_embeddings else model.vocab * model.hidden)
    has_matrix = not model.tied_embeddings or pp > 1
    return final_norm + (math.ceil(model.vocab / tp) * model.hidden if has_matrix else 0)


def param_tensors(model: Model, layers: int, first: bool, last: bool, stages: int) -> int:
    """Parameter tensors of a chunk of ``layers`` layers, in Megatron-LM's layout.

    A layer holds its QKV matrix (one fused tensor), the attention output, the MLP's input
    matrix (gate and up fused when gated) and output matrix, each with a bias when
    ``model.bias``, and two norms (weight, and bias for layernorm). The first chunk adds
    the word embedding and learned positions; the last the final norm and, when it holds
    its own copy, the LM head (:func:`head_params_per_device`).
    """
    norm = 2 if model.norm == "layernorm" else 1
    tensors = layers * (4 * (2 if model.bias else 1) + 2 * norm)
    if first:
        tensors += 1 + (model.position_embedding == "learned")
    if last:
        tensors += norm + (not model.tied_embeddings or stages > 1)
    return tensors


def mla_params_per_device(model: Model, tp: int) -> int:
    """Weights of one multi-head latent attention block on one TP rank (0 without MLA).

    Megatron-Core's ``MLASelfAttention``: the query and key/value down projections and
    the latents' norms are replicated on every rank, the up projections
    (column-parallel) and the output projection (row-parallel) split by heads over
    ``tp``. With ``tp = 1`` this is ``Model.mla_params``.
    """
    a = model.mla
    if a is None:
        return 0
    h, n = model.hidden, model.heads // tp
    return (h * a.q_lora_rank + a.q_lora_rank
            + a.q_lora_rank * n * (a.qk_nope_head_dim + a.qk_rope_head_dim)
            + h * (a.kv_lora_rank + a.qk_rope_head_dim) + a.kv_lora_rank
            + a.kv_lora_rank * n * (a.qk_nope_head_dim + a.v_head_dim) + n * a.v_head_dim * h)


def expert_params_per_device(model: Model, tp: int) -> int:
    """One expert MLP on one TP rank: its matrices split like the dense MLP's
    (Megatron-Core's expert tensor parallelism, here equal to ``tp``); a bias of the
    down projection replicated."""
    if model.moe is None:
        return 0
    h, f = model.hidden, model.moe.ffn_hidden // tp
    return model.mlp_matrices * h * f + (((model.mlp_matrices - 1) * f + h) if model.bias else 0)


def moe_layer_params_per_device(model: Model, tp: int, ep: int,
                                etp: int | None = None) -> tuple[int, int]:
    """(dense, expert) parameters of one MoE block on one device.

    Dense: the block without its MLP (attention and norms, split as in
    :func:`layer_params_per_device`), the router (replicated: Megatron-Core's
    ``TopKRouter`` weight) and the shared experts; expert: the ``experts / ep`` routed
    experts this expert-parallel rank holds. Their gradients are reduced over different
    groups (:mod:`llmsim.experts`). ``ep`` counts the ranks that split the routed experts
    (:attr:`~llmsim.specs.Parallelism.expert_ranks`), whose matrices are split over
    ``etp`` ranks (default ``tp``; the shared experts always over ``tp``).
    """
    assert model.moe is not None
    dense_mlp = (model.mlp_matrices * model.hidden * (model.ffn_hidden // tp)
                 + (((model.mlp_matrices - 1) * (model.ffn_hidden // tp) + model.hidden)
                    if model.bias else 0))
    expert = expert_params_per_device(model, tp)
    dense = (layer_params_per_device(model, tp) - dense_mlp + model.router_params
             + model.moe.shared_experts * expert)
    routed = expert if etp in (None, tp) else expert_params_per_device(model, etp)
    return dense, model.moe.experts // ep * routed


def layers_params_per_device(model: Model, tp: int, ep: int, first_layer: int,
                             layers: int, etp: int | None = None) -> tuple[int, int]:
    """(dense, expert) parameters of layers ``first_layer`` … ``first_layer + layers − 1``
    on one device; a dense model has no expert part."""
    moe = model.moe
    moe_layers = 0 if moe is None else (
        moe.moe_layers(first_layer + layers) - moe.moe_layers(first_layer))
    dense = (layers - moe_layers) * layer_params_per_device(model, tp)
    if not moe_layers:
        return dense, 0
    moe_dense, moe_expert = moe_layer_params_per_device(model, tp, ep, etp)
    return dense + moe_layers * moe_dense, moe_layers * moe_expert


def stage_layers_params(model: Model, tp: int, ep: int, split: list[list[int]],
                        stage: int, etp: int | None = None) -> tuple[int, int]:
    """(dense, expert) parameters of the transformer layers of pipeline ``stage`` on one
    device, over its model chunks (``split`` from :func:`llmsim.partition.chunk_layers`)."""
    dense = expert = 0
    for chunk, layers in enumerate(split[stage]):
        d, e = layers_params_per_device(model, tp, ep, chunk_first_layer(split, stage, chunk),
                                        layers, etp)
        dense, expert = dense + d, expert + e
    return dense, expert
