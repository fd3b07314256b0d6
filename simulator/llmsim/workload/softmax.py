"""The unfused attention's kernels between its scores GEMM and its context GEMM.

``training.attention_softmax: fused`` (the default): Megatron's fused scale-mask-softmax
kernel (read the scores, write the probabilities) and, with dropout, its dropout kernel
(read, write, a byte mask); the backward mirrors them.

``eager``: the scale, mask, softmax and dropout as PyTorch's eager CPU kernels run them in
FP32.

Megatron-LM's ``FusedScaleMaskSoftmax`` calls its fused CUDA kernel only for 16-bit
input; FP32 scores take ``forward_torch_softmax``, one PyTorch kernel per line
(Fugaku-LLM/DeepSpeedFugaku ``megatron/model/fused_softmax.py`` and ``utils.py`` at
8e0eabb, the commit of the development benchmarks, February 2023; the same code as
Megatron-LM of 2021):

* ``input = input * self.scale``: a new tensor of the scores' size. The scale is the
  layer number whenever ``apply_query_key_layer_scaling`` is on, Megatron's default
  (``--no-query-key-layer-scaling`` turns it off; the benchmark scripts do not pass it);
* ``attention_mask_func``: ``attention_scores.masked_fill_(mask, -10000.0)``, in place;
* ``torch.nn.Softmax(dim=-1)``: the probabilities, a new tensor.

``torch.nn.Dropout`` on a CPU tensor is ``at::dropout`` → ``_dropout_impl``
(``aten/src/ATen/native/Dropout.cpp``; the fused kernel with a byte mask is CUDA only,
``is_fused_kernel_acceptable``): ``noise = at::empty_like(input)``, ``noise.bernoulli_(1 -
p)``, ``noise.div_(1 - p)``, ``input * noise``. So the mask is a float tensor as large as
the probabilities, written, scaled in place and read.

The backward runs autograd's derivative of each: ``grad * noise`` (the dropout's, reading
two tensors), the softmax backward, ``masked_fill_``'s ``grad.clone().masked_fill_(mask,
0)`` (a copy, then the fill in place) and ``grad * scale`` (a new tensor). So per layer
and micro-batch the eager path allocates five score-sized tensors in the forward where
the fused one allocates two, and four in the backward where the fused one allocates two;
under glibc's allocator each of 32 MiB or more is faulted in afresh
(:mod:`llmsim.costs.allocator`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from llmsim.ops import ComputeOp
from llmsim.specs.training import AttentionSoftmax

MemOp = Callable[..., ComputeOp]
"""The layer's memory-bound op factory: ``(name, phase, elements, passes, masks=0,
out_elements=None)`` (:meth:`llmsim.workload.layer.LayerBuilder._mem`)."""


def eager_softmax_forward(mem: MemOp, phase: str, probs: float,
                          dropout: bool) -> list[ComputeOp]:
    """The kernels between the scores GEMM and the context GEMM of one forward (or
    recompute, ``phase``), over ``probs`` score elements: scale (read, write a new
    tensor), mask in place (read, write), softmax (read, write a new tensor) and, with
    ``dropout``, the noise drawn into a new tensor (write), scaled in place (read, write)
    and multiplied in (read two, write a new tensor)."""
    return [
        mem("attn_scale", phase, probs, 2),
        mem("attn_mask_fill", phase, probs, 2, out_elements=0),
        mem("attn_softmax", phase, probs, 2),
        *([mem("attn_dropout_noise", phase, probs, 1),
           mem("attn_dropout_noise_div", phase, probs, 2, out_elements=0),
           mem("attn_dropout", phase, probs, 3)] if dropout else []),
    ]


def eager_softmax_backward(mem: MemOp, probs: float, dropout: bool) -> list[ComputeOp]:
    """The backward's kernels between the context GEMM's gradients and the scores GEMM's,
    over ``probs`` score elements: with ``dropout`` the gradient times the noise (read
    two, write a new tensor), the softmax backward (read the gradient and the
    probabilities, write a new tensor), ``masked_fill_``'s gradient as a clone (read,
    write a new tensor) filled in place (read, write), and the scale's gradient (read,
    write a new tensor)."""
    return [
        *([mem("attn_dropout_bwd", "B", probs, 3)] if dropout else []),
        mem("attn_softmax_bwd", "B", probs, 3),
        mem("attn_mask_fill_bwd", "B", probs, 2),
        mem("attn_mask_fill_bwd_fill", "B", probs, 2, out_elements=0),
        mem("attn_scale_bwd", "B", probs, 2),
    ]


def alibi_scores(position_embedding: str, mem: MemOp, scores: ComputeOp,
                 probs: float) -> list[ComputeOp]:
    """The unfused attention's scores GEMM over ``probs`` score elements, with ALiBi as the
    BigScience Megatron-DeepSpeed adds it: ``torch.baddbmm(alibi, q, kᵀ, beta=1/layer)`` on
    the [b·heads, 1, s] bias (``megatron/model/transformer.py``, bigscience-workshop at
    8387ae17 and the TurkuNLP fork at 6732bc9; beta 0 and no bias without ALiBi). PyTorch
    expands the bias to the output's size and, for beta ≠ 0, copies it into the output
    before the GEMM (the baddbmm meta function's ``result.copy_(self)``, ATen
    ``LinearAlgebra.cpp``; ``copy_`` after ``expand_size`` in the CUDA baddbmm of 2020,
    pytorch/pytorch PR 38421), and the GEMM reads it back as C: one write and one read of
    the scores more than the plain GEMM, which then allocates no output of its own."""
    if position_embedding != "alibi":
        return [scores]
    copy = mem("attn_alibi_copy", scores.phase, probs, 1)  # write; the bias row stays cached
    return [copy, replace(scores, bytes=scores.bytes + copy.bytes, output_bytes=0.0)]


def softmax_forward(kind: AttentionSoftmax, mem: MemOp, phase: str, probs: float,
                    dropout: bool) -> list[ComputeOp]:
    """The forward's (or recompute's, ``phase``) kernels over ``probs`` score elements:
    the fused kernels, or :func:`eager_softmax_forward`."""
    if kind == "eager":
        return eager_softmax_forward(mem, phase, probs, dropout)
    return [mem("attn_softmax", phase, probs, 2),  # read scores, write probs
            *([mem("attn_dropout", phase, probs, 2, masks=1)] if dropout else [])]


def softmax_backward(kind: AttentionSoftmax, mem: MemOp, probs: float,
                     dropout: bool) -> list[ComputeOp]:
    """The backward's kernels over ``probs`` score elements: the fused kernels' backward,
    or :func:`eager_softmax_backward`."""
    if kind == "eager":
        return eager_softmax_backward(mem, probs, dropout)
    return [*([mem("attn_dropout_bwd", "B", probs, 2, masks=1)] if dropout else []),
            mem("attn_softmax_bwd", "B", probs, 3)]
