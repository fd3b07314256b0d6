"""Attention kernels priced from FlashAttention-2's rate by a ratio measured side by side.

Two kernels llmsim has no rate table of run beside FlashAttention-2 in one benchmark on the
same board, so each is priced as FlashAttention-2's time (:meth:`ComputeModel.attention_math_s`)
times the measured ratio at the op's (sequence, head dimension), read as a curve
(:func:`llmsim.costs.flash_curve.curve_at`: interpolated in log₂(length) and held beyond the
benchmark's lengths; linear between head dimensions and held beyond them):

* ``flash1``: flash-attn 1.x, forward and backward alike, by FlashAttention-2's
  throughput over 1.x's (``flash1_vs_flash2_tflops``, :mod:`llmsim.costs.flash1`);
* ``triton_fwd``: DistFlashAttn's kernels (Li et al. 2024, arXiv:2310.03294; RulinShao/LightSeq
  ``lightseq/lightseq_async_attn.py`` at 135d8d2): a forward written in Triton from Triton's
  fused-attention tutorial (``_fwd_kernel``: BLOCK_M 128, BLOCK_N 64, 8 warps at head
  dimension 128, 4 stages) and FlashAttention-2's own CUDA backward (``_flash_attn_backward``
  of flash-attn 2, the default ``backward_engine``). The forward ops (phases F and R) are
  slower by the tutorial kernel's forward time over FlashAttention-2's forward time at the
  same causal shape (``triton_fwd_vs_flash2_ms``, :func:`triton_forward_slowdown`); the
  backward is FlashAttention-2's and keeps its price.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from llmsim.costs.flash1 import flash1_slowdown
from llmsim.costs.flash_curve import curve_at
from llmsim.ops import ComputeOp
from llmsim.specs import Accelerator

Pairs = Mapping[int, Mapping[int, tuple[float, float]]]
"""``{head_dim: {seq_len: (a, b)}}``: two kernels' measurements at one shape."""


def triton_forward_slowdown(pairs: Pairs, seq_len: int, head_dim: int) -> float:
    """The Triton tutorial forward's time over FlashAttention-2's forward time at a causal
    shape (≥ 1 where the CUDA kernel is faster), from side-by-side times
    ``{head_dim: {seq_len: (triton_ms, flash2_ms)}}`` read as a curve (:func:`curve_at`)."""
    ratios = {d: {s: triton / flash2 for s, (triton, flash2) in by_seq.items()}
              for d, by_seq in pairs.items()}
    return curve_at(ratios, seq_len, head_dim)


@dataclass(frozen=True)
class RelativeKernel:
    """How one attention kernel is priced from FlashAttention-2's time."""

    field: str
    """The accelerator's field holding the side-by-side measurement."""
    measured: str
    """What that field measures, for the error that refuses a board without it."""
    slowdown: Callable[[Pairs, int, int], float]
    """The factor on FlashAttention-2's time at (pairs, sequence, head dimension)."""
    phases: frozenset[str]
    """The phases of the attention ops it slows (F forward, R recompute, B backward)."""


RELATIVE_KERNELS: dict[str, RelativeKernel] = {
    "flash1": RelativeKernel("flash1_vs_flash2_tflops", "FlashAttention 1.x rate",
                             flash1_slowdown, frozenset({"F", "R", "B"})),
    "triton_fwd": RelativeKernel("triton_fwd_vs_flash2_ms", "Triton forward time",
                                 triton_forward_slowdown, frozenset({"F", "R"})),
}
"""The attention kernels priced relative to FlashAttention-2, by ``training.attention_kernel``."""


@dataclass(frozen=True)
class RelativePricing:
    """One accelerator's pricing of a relative kernel: its pairs and its rule."""

    kernel: RelativeKernel
    pairs: Pairs

    @classmethod
    def of(cls, accelerator: Accelerator, attention_kernel: str) -> RelativePricing | None:
        """The pricing of ``attention_kernel`` on ``accelerator``; None for a kernel priced by
        its own rates (``flash``, ``cudnn``, ``unfused``) or a board without the measurement
        (:func:`missing_measurement` names it)."""
        kernel = RELATIVE_KERNELS.get(attention_kernel)
        pairs = getattr(accelerator, kernel.field) if kernel else None
        return cls(kernel, pairs) if kernel and pairs else None

    def factor(self, op: ComputeOp) -> float:
        """The factor on FlashAttention-2's time of attention op ``op`` (1 in a phase the
        kernel leaves to FlashAttention-2)."""
        if op.phase not in self.kernel.phases:
            return 1.0
        seq_len, head_dim = op.attention_shape or (0, 0)
        if not seq_len:
            raise ValueError("a relatively priced attention op needs its (sequence, head "
                             "dim) shape")
        return self.kernel.slowdown(self.pairs, seq_len, head_dim)


def missing_measurement(accelerator: Accelerator, attention_kernel: str) -> str | None:
    """The one-sentence error for a relative kernel on a board without its measurement;
    None where nothing is missing."""
    kernel = RELATIVE_KERNELS.get(attention_kernel)
    if kernel is None or getattr(accelerator, kernel.field):
        return None
    return (f"training.attention_kernel: {attention_kernel} has no measured {kernel.measured} "
            f"on {accelerator.name}; use flash, or give the accelerator {kernel.field}")
