"""Measured GEMM rates: a calibration's table of achieved TFLOP/s (:class:`GemmTable`) and
the shapes an accelerator's catalog entry timed on the board (:func:`measured_shape_rates`).
:class:`llmsim.costs.compute.ComputeModel` prices a GEMM from these where they cover it."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable

import numpy as np

from llmsim.calibration import GemmPoint
from llmsim.costs.clocks import compute_kind, sustained_mhz
from llmsim.specs import Accelerator, Dtype


class GemmTable:
    """Measured GEMM throughput of one device: by shape where measured, else by volume.

    A GEMM whose (M, N, K) and dtype were measured takes the measured TFLOP/s (repeated
    measurements of one shape averaged): two shapes of one volume, a skinny and a square
    one, can differ by tens of percent. Any other GEMM of a measured dtype is looked up
    by volume: the achieved TFLOP/s of the measured shapes are sorted by log(M·N·K)
    (shapes of equal volume averaged) and linearly interpolated between the two nearest
    measured volumes; outside the measured range the nearest end value is used (clamped,
    never extrapolated). A batched GEMM is looked up by its total volume batch·M·N·K.
    """

    def __init__(self, points: Iterable[GemmPoint]) -> None:
        by_dtype: dict[str, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
        by_shape: dict[tuple[str, int, int, int], list[float]] = defaultdict(list)
        for p in points:
            by_dtype[p.dtype][math.log(p.m * p.n * p.k)].append(p.tflops)
            by_shape[(p.dtype, p.m, p.n, p.k)].append(p.tflops)
        self._shapes = {key: sum(v) / len(v) for key, v in by_shape.items()}
        self._tables: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for dtype, volumes in by_dtype.items():
            xs = sorted(volumes)
            ys = [sum(volumes[x]) / len(volumes[x]) for x in xs]
            self._tables[dtype] = (np.array(xs), np.array(ys))

    def covers(self, dtype: Dtype) -> bool:
        """Whether any shape of ``dtype`` was measured."""
        return dtype in self._tables

    def achieved_flops(self, m: int, n: int, k: int, batch: int, dtype: Dtype) -> float:
        """Achieved FLOP/s for this shape: measured, or interpolated by volume
        (``covers(dtype)`` must hold)."""
        measured = self._shapes.get((dtype, m, n, k)) if batch == 1 else None
        if measured is not None:
            return measured * 1e12
        xs, ys = self._tables[dtype]
        tflops = float(np.interp(math.log(batch * m * n * k), xs, ys))
        return tflops * 1e12


def measured_shape_rates(accelerator: Accelerator) -> dict[tuple[str, int, int, int], float]:
    """The accelerator's GEMMs timed by shape (``gemm.measured_tflops``) as FLOP/s at the
    clock its catalog rates are given at, keyed by (dtype, M, N, K).

    A shape was timed at the sustained clock of its kind under the board's own power
    limit (``clocks.measured``, :func:`llmsim.costs.clocks.sustained_mhz`); the rate is
    scaled to the clock of the catalog's rates (``clocks.rates_at_mhz``) so that the
    clock model (:mod:`llmsim.costs.clocks`) slows it exactly as it slows the model's:
    at the board's own power limit the shape runs at its measured rate, under another
    limit at that rate times the ratio of the clocks (at most that of the rates' clock).
    Without both clocks the measured rate is used as it is.
    """
    rates: dict[tuple[str, int, int, int], float] = {}
    for dtype, points in accelerator.gemm.measured_tflops.items():
        scale = _to_rates_clock(accelerator, dtype)
        for m, n, k, tflops in points:
            rates[(dtype, m, n, k)] = tflops * 1e12 * scale
    return rates


def unaligned_rates(accelerator: Accelerator) -> dict[str, float]:
    """FLOP/s, by dtype, of a GEMM with a dimension off the library's alignment
    (``gemm.unaligned_tflops``), at the clock of the catalog's rates, scaled as
    :func:`measured_shape_rates` scales a timed shape."""
    return {dtype: tflops * 1e12 * _to_rates_clock(accelerator, dtype)
            for dtype, tflops in accelerator.gemm.unaligned_tflops.items()}


def is_aligned(m: int, n: int, k: int, dtype: Dtype, alignment_bytes: int) -> bool:
    """Whether M, N and K are all multiples of ``alignment_bytes`` worth of ``dtype``
    elements (1 byte for FP8, 2 for 16-bit types, 4 for FP32 and TF32, 8 for FP64)."""
    elements = max(1, alignment_bytes // _ELEMENT_BYTES[dtype])
    return m % elements == 0 and n % elements == 0 and k % elements == 0


_ELEMENT_BYTES: dict[str, int] = {"fp64": 8, "fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2,
                                  "fp8": 1}
"""Bytes of one GEMM input element by dtype."""


def _to_rates_clock(accelerator: Accelerator, dtype: Dtype) -> float:
    """Factor from a rate measured at the board's sustained clock of the dtype's GEMM kind
    (``clocks.measured``) to the clock of the catalog's rates (``clocks.rates_at_mhz``);
    1 without both clocks."""
    kind = compute_kind("gemm", dtype)
    clocks = accelerator.clocks
    if clocks is None or kind not in clocks.measured or kind not in clocks.rates_at_mhz:
        return 1.0
    return clocks.rates_at_mhz[kind] / sustained_mhz(clocks, kind, clocks.power_limit_w)
