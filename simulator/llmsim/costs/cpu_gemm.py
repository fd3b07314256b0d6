"""A CPU BLAS's GEMM efficiency by shape, read from its measured square GEMMs.

A CPU library's GEMM is not tiled over compute units the way a GPU kernel is: its threads
share each matrix through cache blocking, and its efficiency rises with the size of the
problem (more reuse of each packed block, less of the threads' start and join per FLOP).
Benchmarks report it for square GEMMs (m = n = k) at a few thread counts. The catalog
holds those points (``gemm.square_fraction``: dtype → threads → ``[size, fraction of the
threads' peak]``) and this module reads a GEMM of any shape from them:

* the GEMM of M×N×K is read at the square of the same volume, ``s = (M·N·K)^(1/3)``, the
  reading by volume of :class:`llmsim.costs.gemm_tables.GemmTable` (a square shape is
  read at its own measured size);
* between two measured sizes the fraction is interpolated linearly in ``log s``; outside
  the measured range the nearest end value holds (clamped, never extrapolated);
* the benchmark times the library alone. Where the catalog gives the share of that rate
  a framework reaches when it calls the library (``gemm.framework_share``), the GEMM runs
  at the curve times that share, at every shape and thread count: what the framework
  adds around each call (dispatch, fork and join of its threads, operands placed by
  first touch rather than interleaved) scales with the library's own time. Without it
  the rate is the curve at most ``gemm.peak_fraction``: the curve slows only the shapes
  the library itself runs slower than that;
* a GEMM runs on the curve of its thread count: all the device's cores
  (``gemm.compute_units``) for a multi-threaded call, one core for each matrix of a batch
  dealt one matrix per core (:mod:`llmsim.costs.batched_gemm`). A thread count or dtype
  the catalog did not measure has no curve: the GEMM keeps ``gemm.peak_fraction``.

Reading a skinny GEMM at its equal-volume square is an assumption, not a measurement:
the sources time only squares (``hardware/accelerators/a64fx.yaml``).
"""

from __future__ import annotations

import math

import numpy as np

from llmsim.costs.batched_gemm import one_matrix_per_unit_s
from llmsim.specs import Dtype, GemmModel


def equal_volume_size(m: int, n: int, k: int) -> float:
    """Side of the square GEMM with the volume of M×N×K: ``(M·N·K)^(1/3)``."""
    return float(m * n * k) ** (1.0 / 3.0)


def square_fraction(points: list[tuple[int, float]], size: float) -> float:
    """Fraction of peak at square size ``size`` from measured ``(size, fraction)`` points:
    linear in ``log size`` between the two nearest measured sizes, the end value outside
    them (repeated sizes averaged)."""
    by_size: dict[int, list[float]] = {}
    for s, fraction in points:
        by_size.setdefault(s, []).append(fraction)
    sizes = sorted(by_size)
    xs = np.log(np.array(sizes, dtype=float))
    ys = np.array([sum(by_size[s]) / len(by_size[s]) for s in sizes])
    return float(np.interp(math.log(size), xs, ys))


def cpu_gemm_fraction(
    m: int, n: int, k: int, threads: int, gemm: GemmModel, dtype: Dtype
) -> float | None:
    """Fraction of the ``threads`` cores' peak a GEMM of M×N×K reaches: the library's rate
    read from the catalog's measured squares at that thread count (see the module), times
    ``gemm.framework_share`` where given, else at most ``gemm.fraction(dtype)``; None
    where the catalog has no curve for this dtype and thread count."""
    points = gemm.square_fraction.get(dtype, {}).get(threads)
    if not points:
        return None
    library = square_fraction(points, equal_volume_size(m, n, k))
    if gemm.framework_share is not None:
        return library * gemm.framework_share
    return min(library, gemm.fraction(dtype))


def cpu_gemm_s(
    m: int,
    n: int,
    k: int,
    batch: int,
    gemm: GemmModel,
    peak_flops: float,
    dtype: Dtype,
    reserved_units: int = 0,
) -> float | None:
    """Math time, s, of ``batch`` GEMMs of M×N×K on a CPU from its measured squares; None
    where the catalog has no curve for the thread count they run on.

    With ``u = compute_units − reserved_units`` cores free and the device's peak
    ``peak_flops`` (FLOP/s) shared equally by its ``compute_units`` cores:

    * a batch dealt one matrix per core (``gemm.batched: one_matrix_per_unit``, batch > 1)
      takes ``⌈batch / u⌉`` rounds of one matrix on one core,
      ``2·M·N·K / (peak / compute_units · f₁)``, with ``f₁`` the one-thread curve;
    * any other GEMM runs multi-threaded on the device's cores, each matrix in turn:
      ``batch · 2·M·N·K / (peak · f_units) · compute_units / u``, with ``f_units`` the curve
      of ``compute_units`` threads (cores held by other work slow it in proportion).
    """
    flops = 2.0 * m * n * k
    units = gemm.compute_units
    free = units - reserved_units
    if gemm.batched == "one_matrix_per_unit" and batch > 1:
        fraction = cpu_gemm_fraction(m, n, k, 1, gemm, dtype)
        if fraction is None:
            return None
        return one_matrix_per_unit_s(m, n, k, batch, gemm, peak_flops, dtype, reserved_units,
                                     fraction)
    fraction = cpu_gemm_fraction(m, n, k, units, gemm, dtype)
    if fraction is None:
        return None
    return batch * flops / (peak_flops * fraction) * units / free
