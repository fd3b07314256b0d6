"""The A100's GEMM tiles: cuBLAS's 256×128, 128×256 and 128×128 Tensor Core tiles (NVIDIA's
Matrix Multiplication Background guide, §2.3; ``hardware/accelerators/a100-sxm4-80gb.yaml``
``gemm.extra_tiles``), each GEMM on the one that finishes it first.

Closed forms: tiles, waves and wave efficiency of a shape on one tile
(:func:`llmsim.costs.compute.gemm_shape`, the guide's §3.2), the tile a shape runs on, and
its time. Check, not a fit: the Zero Bubble models' middle stage against the per-pass times
the paper's scheduler profiled on its A100s (Qi et al. 2024, Appendix D).
"""

from __future__ import annotations

import collections
import math

import pytest

from llmsim import validation as v
from llmsim.costs.compute import gemm_math_s, gemm_shape
from llmsim.loader import load_spec
from llmsim.specs import Accelerator, GemmModel

A100S = ["a100-sxm4-80gb", "a100-sxm4-40gb"]
SMS = 108


def _a100(name: str = "a100-sxm4-80gb") -> Accelerator:
    return load_spec("accelerators", name)


def _on_tile(gemm: GemmModel, tile: tuple[int, int]) -> GemmModel:
    """The same library with ``tile`` as its only tile."""
    return gemm.model_copy(update={"tile_m": tile[0], "tile_n": tile[1], "extra_tiles": []})


def _seconds(acc: Accelerator, m: int, n: int, k: int, gemm: GemmModel | None = None) -> float:
    return gemm_math_s(m, n, k, 1, gemm or acc.gemm, acc.peak_flops("fp16"), "fp16",
                       memory_bytes_per_s=acc.sustained_memory_bytes_per_s)


def _picked(acc: Accelerator, m: int, n: int, k: int) -> tuple[int, int]:
    """The tile the shape runs on: the first of the library's tiles (main tile first) whose
    time alone is the time with all of them."""
    best = _seconds(acc, m, n, k)
    return next(t for t in acc.gemm.tiles()
                if _seconds(acc, m, n, k, _on_tile(acc.gemm, t)) == best)


@pytest.mark.parametrize("name", A100S)
def test_the_a100_runs_cublas_three_largest_tensor_core_tiles(name: str) -> None:
    assert _a100(name).gemm.tiles() == [(256, 128), (128, 256), (128, 128)]
    assert _a100(name).gemm.compute_units == SMS


@pytest.mark.parametrize(
    ("tile", "tiles", "waves"),
    [((256, 128), 4 * 40, 2), ((128, 256), 8 * 20, 2), ((128, 128), 8 * 40, 3)],
)
def test_waves_of_a_14_6b_projection_on_each_tile(
    tile: tuple[int, int], tiles: int, waves: int
) -> None:
    # M = 1,024 tokens (one sequence), N = 5,120 (the 14.6B model's attention output and MLP
    # down-projections): 160 large tiles fill 108 SMs once and 52 of them again, 320 of
    # 128 × 128 fill three waves but for 4 SMs.
    shape = gemm_shape(1024, 5120, 5120, 1, _on_tile(_a100().gemm, tile))
    assert (shape.tiles, shape.waves) == (tiles, waves)
    assert shape.wave_efficiency == pytest.approx(tiles / (waves * SMS))
    assert math.ceil(tiles / SMS) == waves


@pytest.mark.parametrize("k", [5120, 20480])
def test_a_14_6b_projection_runs_on_128_by_128_tiles_in_closed_form(k: int) -> None:
    acc = _a100()
    assert _picked(acc, 1024, 5120, k) == (128, 128)
    # 3 waves of 128 × 128 tiles over K + k_fill, each SM at its share of peak × fraction.
    closed = 2 * SMS * 128 * 128 * (k + 96) * 3 / (312e12 * 0.747)
    assert _seconds(acc, 1024, 5120, k) == pytest.approx(closed, rel=1e-12)
    large = _seconds(acc, 1024, 5120, k, _on_tile(acc.gemm, (256, 128)))
    assert large / closed == pytest.approx(2 * 256 / (3 * 128))  # 2 big waves against 3 small


@pytest.mark.parametrize(
    ("m", "n", "k", "tile", "waves"),
    [
        (8192, 8192, 8192, (256, 128), 19),  # 2,048 tiles: a tie with 128 × 128, the main tile
        (2048, 7680, 20480, (128, 128), 9),  # 960 small tiles, 9 waves, against 480 large in 5
        (1152, 3072, 4096, (128, 256), 1),  # 9 × 12 = 108 tiles, one full wave
    ],
)
def test_the_tile_a_shape_runs_on(
    m: int, n: int, k: int, tile: tuple[int, int], waves: int
) -> None:
    acc = _a100()
    assert _picked(acc, m, n, k) == tile
    assert gemm_shape(m, n, k, 1, _on_tile(acc.gemm, tile)).waves == waves
    closed = 2 * SMS * tile[0] * tile[1] * (k + 96) * waves / (312e12 * 0.747)
    assert _seconds(acc, m, n, k) == pytest.approx(closed, rel=1e-12)


# The paper's per-pass profile, T_F + T_B + T_W of one stage, ms (Qi et al. 2024, Zero
# Bubble Pipeline Parallelism, Appendix D; transcribed in docs/validation.md §7).
PROFILED_MS = {"ZB24-T4-26": 45.9, "ZB24-T4-29": 79.1, "ZB24-T4-32": 30.7, "ZB24-T4-35": 28.3}


def _middle_stage_ms(run_id: str) -> float:
    """F + B + W compute time of the middle pipeline stage's first device for one steady
    micro-batch of a ZB-1p row, ms."""
    result = v.predict({r.id: r for r in v.load_runs()}[run_id]).result
    records = result.trace.records
    middle = sorted({r.stage for r in records})[len({r.stage for r in records}) // 2]
    device = min(r.device for r in records if r.stage == middle)
    by_kind: dict[str, float] = collections.defaultdict(float)
    for r in records:
        if (r.device, r.microbatch, r.stream) == (device, 10, "compute"):
            by_kind[r.kind] += r.end_s - r.start_s
    return 1e3 * (by_kind["F"] + by_kind["B"] + by_kind["W"])


def test_zero_bubble_middle_stages_follow_the_papers_profile() -> None:
    ratios = {i: _middle_stage_ms(i) / ms for i, ms in PROFILED_MS.items()}
    assert all(0.95 < r < 1.07 for r in ratios.values()), ratios
    assert ratios["ZB24-T4-32"] == pytest.approx(1.0, abs=0.03), ratios  # was 1.12 on 256 × 128
