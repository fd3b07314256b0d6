"""The language-model loss's memory traffic."""

from __future__ import annotations


def cross_entropy_bytes_per_logit(logit_bytes: int) -> tuple[int, int]:
    """HBM bytes per logit of Megatron-LM's vocab-parallel cross-entropy: (forward, backward).

    The loss runs in FP32 on the (16-bit) logits, one PyTorch kernel per line of
    ``megatron/core/tensor_parallel/cross_entropy.py`` (the same sequence as 2020's
    ``mpu/cross_entropy.py``): ``.float()`` reads the logits and writes an FP32 copy, then
    ``max`` reads it, ``-= max`` and ``exp(out=)`` each read and write it, ``sum`` reads
    it and ``div_`` reads and writes it, the softmax kept for the backward. The backward's
    ``mul_`` reads and writes the softmax, and the gradient of ``.float()`` casts it back
    to the logits' dtype. FP32 logits skip both casts.
    """
    fp32 = 4
    cast = logit_bytes + fp32 if logit_bytes != fp32 else 0
    forward = cast + fp32 * (1 + 2 + 2 + 1 + 2)  # max, sub, exp, sum, div
    backward = fp32 * 2 + cast                   # mul_, cast of the gradient
    return forward, backward
