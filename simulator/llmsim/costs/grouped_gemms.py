"""Grouped GEMMs timed on the board, looked up by shape.

A mixture-of-experts layer runs its E local experts' GEMMs (each [T × K]·[K × N], T the
rows routed to the expert) as one grouped kernel. llmsim prices such an op as a batched
GEMM with wave quantisation (:func:`llmsim.costs.compute.gemm_math_s`); timed on an H100,
that matches the grouped kernel from about 2,048 rows per expert on and is too fast below
(the kernel's tiles of few rows fill the units poorly: at 128 rows it runs 0.55–0.87 of
the model's rate; ``docs/calibration.md``). Where the catalog holds grouped GEMMs timed
by shape (``gemm.grouped_tflops``: E, T, N, K, TFLOP/s), a batched GEMM op of a timed
(N, K) in a timed dtype runs at its measured rate: the exact row where there is one,
else interpolated linearly in log₂ E at each timed T (held beyond the fewest and most
experts), then in log₂ T (held above the most rows); below the fewest rows timed, or for
an (N, K) not timed, the model prices it. Rates are scaled to the clock of the catalog's
rates as :func:`llmsim.costs.gemm_tables.measured_shape_rates` scales a timed shape, so
the clock model slows them as it slows the model's.
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np

from llmsim.costs.gemm_tables import _to_rates_clock
from llmsim.specs import Accelerator


class GroupedGemmRates:
    """The catalog's grouped GEMMs (``gemm.grouped_tflops``) as FLOP/s by shape (module
    docstring)."""

    def __init__(self, accelerator: Accelerator) -> None:
        self._exact: dict[tuple[str, int, int, int, int], float] = {}
        points: dict[tuple[str, int, int], dict[int, list[tuple[float, float]]]] = (
            defaultdict(lambda: defaultdict(list)))
        for dtype, rows in accelerator.gemm.grouped_tflops.items():
            scale = _to_rates_clock(accelerator, dtype)
            for experts, tokens, n, k, tflops in rows:
                rate = tflops * 1e12 * scale
                self._exact[(dtype, experts, tokens, n, k)] = rate
                points[(dtype, n, k)][tokens].append((math.log2(experts), rate))
        self._grids = {
            key: [(math.log2(t), np.array([e for e, _ in sorted(ps)]),
                   np.array([r for _, r in sorted(ps)])) for t, ps in sorted(by_t.items())]
            for key, by_t in points.items()}

    def __bool__(self) -> bool:
        return bool(self._exact)

    def flops(self, dtype: str, experts: int, tokens: int, n: int, k: int) -> float | None:
        """FLOP/s of E grouped GEMMs of [T × K]·[K × N], or None where not timed."""
        exact = self._exact.get((dtype, experts, tokens, n, k))
        if exact is not None:
            return exact
        grid = self._grids.get((dtype, n, k))
        if not grid or tokens < 2 ** grid[0][0] - 1e-9:
            return None
        e = math.log2(experts)
        rates = [float(np.interp(e, log_e, r)) for _, log_e, r in grid]
        return float(np.interp(math.log2(tokens), [t for t, _, _ in grid], rates))
