"""Activation memory: the bytes one transformer block, the embedding and the output
layer store for one micro-batch on one tensor-parallel rank (what
:func:`llmsim.memory.memory_per_stage` multiplies by the micro-batches in flight).

Sources: Korthikanti et al. 2022 (activation memory, §4.1–§4.3 and Table 2) and Dao et
al. 2022 (flash attention's log-sum-exp, §3.1). docs/memory.md derives each term.
"""

from __future__ import annotations

import math

from llmsim.params import kv_dim_per_rank
from llmsim.specs import Model, Parallelism, Training

DROPOUT_MASK_BYTES = 1
"""Dropout masks are stored as one byte per element (Korthikanti et al. 2022 §4.1; PyTorch's
``native_dropout`` keeps a bool tensor)."""
FP32_BYTES = 4
"""Logits kept for the cross-entropy (Korthikanti et al. 2022 §4.3) and flash attention's
log-sum-exp (Dao et al. 2022 §3.1) are fp32."""


def activation_element_bytes(training: Training) -> int:
    """Bytes of one stored activation element: 2 (16-bit; fp8 GEMMs keep 16-bit
    activations outside the GEMM casts, an assumption), 4 for fp32 training."""
    return 4 if training.precision == "fp32" else 2


def activation_bytes_per_layer(model: Model, parallelism: Parallelism, training: Training) -> float:
    """Activation bytes one transformer block stores for one micro-batch, on one TP rank.

    Korthikanti et al. 2022 §4.1 (eq. 1), §4.2 (eq. 2) and Table 2, generalised term by
    term; ``e`` = bytes per element (2), masks 1 byte, ``kv`` = K/V width per rank,
    ``f`` = MLP width, ``t`` = tp, ``a`` = heads:

    * outside the TP region (divided by t only with sequence parallelism): two norm
      inputs 2·e·sbh, QKV-GEMM input e·sbh, MLP-up input e·sbh, two dropout masks 2·sbh
      → 10·sbh (8·sbh without hidden dropout);
    * TP-sharded: Q e·sbh/t, K and V 2·e·sb·kv, attention output (out-projection input)
      e·sbh/t (``heads·kv_channels`` for ``h`` in these two when the model sets it),
      activation input e·sbf/t (SwiGLU: gate and up, 2·e·sbf/t), MLP-down input e·sbf/t
      → 24·sbh/t for MHA with f = 4h and GeLU;
    * attention core (unfused, no selective recompute): softmax output, its dropout
      mask and dropout output, (2e + 1)·a·s²·b/t = 5·a·s²·b/t (the softmax output alone,
      e·a·s²·b/t, without attention dropout); with ``training.attention_softmax: eager``
      the mask is PyTorch's float dropout noise, e bytes, so 3e·a·s²·b/t;
    * flash attention instead stores only the fp32 log-sum-exp, 4·a·s·b/t (Dao et al.
      2022 §3.1), and regenerates its dropout mask.

    With ``recompute_norms_and_up_proj`` (DeepSeek-V3 §3.2.3) the two norms' outputs, the
    QKV-GEMM and MLP-up inputs, are recomputed in the backward: 2·e·sbh less outside the
    TP region (MLA's own tensors: :func:`llmsim.mla.mla_activation_bytes_delta`).
    Selective recompute drops the core; full recompute keeps only the block input,
    e·sbh (÷t with sequence parallelism); ``full_keep_attention`` keeps the block input,
    the attention output e·sb·q_dim/t and the log-sum-exp 4·a·s·b/t. For a GPT shape this
    is exactly sbh·(34 + 5as/h) without parallelism, sbh·(10 + 24/t + 5as/(ht)) with TP
    and sbh/t·(34 + 5as/h) with TP + sequence parallelism.
    """
    t, sp = parallelism.tp, parallelism.sequence_parallel
    s, b, h, f = training.seq_len, parallelism.micro_batch, model.hidden, model.ffn_hidden
    e, sb = activation_element_bytes(training), training.seq_len * parallelism.micro_batch
    if parallelism.recompute == "full":
        return e * sb * h / (t if sp else 1)
    if parallelism.recompute == "full_keep_attention":
        # DistFlashAttn's checkpoints end at the attention kernel and keep its output (the
        # out-projection's input) and the fp32 log-sum-exp beside the block input.
        kept = e * sb * model.q_dim / t + FP32_BYTES * model.heads / t * s * b
        return e * sb * h / (t if sp else 1) + kept
    masks = DROPOUT_MASK_BYTES if training.hidden_dropout > 0 else 0
    norm_outputs = 0 if parallelism.recompute_norms_and_up_proj else 2
    outside_tp = ((2 + norm_outputs) * e + 2 * masks) * sb * h / (t if sp else 1)
    act_inputs = 2 if model.activation == "swiglu" else 1
    sharded = e * sb * (2 * model.q_dim / t + 2 * kv_dim_per_rank(model, t)
                        + (act_inputs + 1) * f / t)
    core = 0.0
    if parallelism.recompute == "none":
        heads = model.heads / t
        if training.fused_attention:
            core = FP32_BYTES * heads * s * b
        else:
            # PyTorch's CPU dropout keeps a float noise tensor, not a byte mask (eager softmax).
            mask = e if training.attention_softmax == "eager" else DROPOUT_MASK_BYTES
            dropped = e + mask if training.attention_dropout > 0 else 0
            core = (e + dropped) * heads * s * s * b
    return outside_tp + sharded + core


def embedding_activation_bytes(model: Model, parallelism: Parallelism, training: Training) -> float:
    """First stage, per micro-batch: the embedding dropout mask, sbh bytes (÷t with
    sequence parallelism; Korthikanti et al. 2022 §4.3), none without hidden dropout. The
    embedding output itself is the first block's input and is counted there."""
    if training.hidden_dropout == 0:
        return 0.0
    sbh = training.seq_len * parallelism.micro_batch * model.hidden
    return DROPOUT_MASK_BYTES * sbh / (parallelism.tp if parallelism.sequence_parallel else 1)


def output_activation_bytes(model: Model, parallelism: Parallelism, training: Training) -> float:
    """Last stage, per micro-batch: final-norm input and LM-head input (e·sbh each, ÷t
    with sequence parallelism) and the fp32 logits 4·sb·⌈V/t⌉ kept for the cross-entropy.
    With sequence parallelism this is Korthikanti et al. 2022 §4.3's 4·sbh/t·(1 + V/h)."""
    t, sb = parallelism.tp, training.seq_len * parallelism.micro_batch
    inputs = 2 * activation_element_bytes(training) * sb * model.hidden
    logits = FP32_BYTES * sb * math.ceil(model.vocab / t)
    return inputs / (t if parallelism.sequence_parallel else 1) + logits
