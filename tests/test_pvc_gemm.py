"""The PVC stack's GEMM model against GEMMs measured on Aurora with every stack of the node busy.

Training runs one rank on each of a node's 12 stacks, all computing at once, and a stack
then runs its GEMMs at 0.81 of its rate alone (ALCF's node-performance overview gives both
columns). ``gemm.peak_fraction`` of ``hardware/accelerators/pvc-max1550-stack.yaml`` is fitted
to the four full-node measurements below (its ``sources:`` cite them); here each is checked
to within :data:`TOLERANCE`, and the fit is checked to be that geometric mean.

All four ran at Aurora's default clock of 2026, 1.5 GHz; the catalog's peak is the 1.6 GHz
one, and a GEMM's rate follows the clock (ALCF's two tables, of 1.6 and 1.5 GHz, give the
same fraction), so the model's rate is compared at 15/16 of its peak.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from llmsim.costs.compute import gemm_math_s, gemm_shape
from llmsim.loader import load_spec
from llmsim.specs import Accelerator

CLOCK_2026_OVER_CATALOG = 1.5 / 1.6
"""ALCF's default GPU clock of 2026 over the clock of the catalog's peak (its notes)."""

TOLERANCE = 0.05
"""Each measured GEMM within 5 %: the points mix a best-of-100 (ALCF's overview) and
medians over ~49,100 GPUs of each GPU's best call (the whole-machine sweeps)."""


@dataclass(frozen=True)
class FullNodeGemm:
    """One GEMM measured per stack with all 12 stacks of the node running it."""

    m: int
    n: int
    k: int
    dtype: str
    tflops_per_stack: float
    source: str


MEASURED = [
    # ALCF node-performance overview, 2026-01-12, Full Node column / 12 (argonne-lcf/user-guides
    # @7d04a3f docs/aurora/node-performance-overview/node-performance-overview.md, src/gemm.cpp).
    FullNodeGemm(8192, 8192, 8192, "bf16", 2487 / 12, "ALCF overview BF16GEMM"),
    FullNodeGemm(8192, 8192, 8192, "fp16", 2469 / 12, "ALCF overview HGEMM"),
    # ALCF whole-machine sweeps, per GPU (2 stacks) / 2, median of Jan-Apr 2026
    # (argonne-lcf/gemm_benchmarking @cb31849 aurora_2026/0*/output_post_process, gemm.cpp).
    FullNodeGemm(24576, 21504, 16384, "bf16", 410.6 / 2, "gemm_benchmarking HGEMM-BF16"),
    FullNodeGemm(12000, 12000, 12000, "fp16", 419.6 / 2, "gemm_benchmarking HGEMM-FP16"),
]


def _stack() -> Accelerator:
    return load_spec("accelerators", "pvc-max1550-stack")


def _model_over_measured(acc: Accelerator, g: FullNodeGemm) -> float:
    """The model's rate at the 1.5 GHz clock over the measured rate."""
    peak = acc.peak_flops(g.dtype) * CLOCK_2026_OVER_CATALOG
    seconds = gemm_math_s(g.m, g.n, g.k, 1, acc.gemm, peak, g.dtype,
                          memory_bytes_per_s=acc.sustained_memory_bytes_per_s)
    return 2 * g.m * g.n * g.k / seconds / (g.tflops_per_stack * 1e12)


@pytest.mark.parametrize("point", MEASURED, ids=[p.source for p in MEASURED])
def test_each_full_node_gemm_within_tolerance(point: FullNodeGemm) -> None:
    assert _model_over_measured(_stack(), point) == pytest.approx(1.0, abs=TOLERANCE)


def test_peak_fraction_is_the_geometric_mean_fit() -> None:
    ratios = [_model_over_measured(_stack(), p) for p in MEASURED]
    assert math.exp(sum(math.log(r) for r in ratios) / len(ratios)) == pytest.approx(1.0, abs=5e-4)


def test_8192_cubed_in_closed_form() -> None:
    # 32 x 32 = 1,024 tiles of 256 x 256 fill 56 Xe-cores in 19 waves (0.962 busy); each
    # wave costs a tile's 2·256²·(K + k_fill) FLOPs on every core at peak × fraction.
    acc = _stack()
    shape = gemm_shape(8192, 8192, 8192, 1, acc.gemm)
    assert (shape.tiles, shape.waves) == (1024, 19)
    closed = 2 * 56 * 256 * 256 * (8192 + 64) * 19 / (367.0e12 * acc.gemm.peak_fraction)
    assert _seconds(acc, 8192, 8192, 8192) == pytest.approx(closed, rel=1e-12)


def test_a_lone_stack_is_faster_than_the_model() -> None:
    # The overview's One Tile column (256 TFLOP/s BF16 at 1.5 GHz) is a stack with its
    # node-mates idle: the model, fitted to busy nodes, is 0.81 of it.
    ratio = _model_over_measured(_stack(), FullNodeGemm(8192, 8192, 8192, "bf16", 256, "one tile"))
    assert 0.78 < ratio < 0.84


def _seconds(acc: Accelerator, m: int, n: int, k: int) -> float:
    return gemm_math_s(m, n, k, 1, acc.gemm, acc.peak_flops("bf16"), "bf16",
                       memory_bytes_per_s=acc.sustained_memory_bytes_per_s)
