"""Sustained SM clocks under a board power limit, and the compute slowdown they cause.

The model and its sources are in :class:`llmsim.specs.clocks.SustainedClocks`; this module
solves it for a power limit and turns the clock of each kind of work into a factor on the
catalog's math-bound times.
"""

from __future__ import annotations

from collections.abc import Mapping

from llmsim.specs import Dtype, SustainedClocks
from llmsim.specs.clocks import COMPUTE_KINDS, WorkKind

DYNAMIC_POWER_EXPONENT = 3.0
"""Dynamic power ∝ f³: P = C·V²·f with V ∝ f over the DVFS range (Weste & Harris,
"CMOS VLSI Design", 4th ed., §5.1). Only matters away from the measured limit."""


def sustained_mhz(clocks: SustainedClocks, kind: WorkKind, power_limit_w: float) -> float:
    """SM clock of ``kind`` under ``power_limit_w``, MHz (see :class:`SustainedClocks`).

    The kind's dynamic draw at ``max_mhz`` is extrapolated from its measured point with
    :data:`DYNAMIC_POWER_EXPONENT`; the clock is the one at which static plus dynamic
    power meets the limit, at most ``max_mhz``. A kind drawing no more than the static
    power (idle) keeps its measured clock.
    """
    point = clocks.measured[kind]
    dynamic_w = point.power_w - clocks.static_w
    if dynamic_w <= 0:
        return point.mhz
    # max_mhz·(headroom / at_max)^(1/n) with at_max = dynamic·(max_mhz / mhz)^n, written
    # so that no power of a clock ratio is formed (it under- or overflows at extreme clocks)
    headroom_w = max(power_limit_w - clocks.static_w, 0.0)
    ratio = (headroom_w / dynamic_w) ** (1.0 / DYNAMIC_POWER_EXPONENT)
    return min(clocks.max_mhz, point.mhz * ratio)


def compute_kind(op_kind: str, dtype: Dtype) -> WorkKind | None:
    """The kind of work of a compute op: a GEMM (FP8 or not), attention; None otherwise."""
    if op_kind == "gemm":
        return "gemm_fp8" if dtype == "fp8" else "gemm"
    if op_kind == "attention":
        return "attention"
    return None


def slowdowns(clocks: SustainedClocks | None, power_limit_w: float | None) -> dict[WorkKind, float]:
    """Factor ≥ 1 on the math time of each compute kind under ``power_limit_w`` (None: the
    board's own limit): ``rates_at_mhz / clock``, 1 where the clock reaches the rate's
    own clock or the kind has no measured point or reference clock."""
    if clocks is None:
        return {}
    limit_w = clocks.power_limit_w if power_limit_w is None else power_limit_w
    factors: dict[WorkKind, float] = {}
    for kind in COMPUTE_KINDS:
        reference = clocks.rates_at_mhz.get(kind)
        if reference is None or kind not in clocks.measured:
            continue
        factors[kind] = max(1.0, reference / sustained_mhz(clocks, kind, limit_w))
    return factors


def slowdown(factors: Mapping[WorkKind, float], op_kind: str, dtype: Dtype) -> float:
    """The factor of :func:`slowdowns` for one op (1 for memory-bound ops)."""
    kind = compute_kind(op_kind, dtype)
    return 1.0 if kind is None else factors.get(kind, 1.0)
