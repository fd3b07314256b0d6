"""The MI250X GCD's GEMM model against the GEMMs timed on an MI250X itself.

The catalog's ``gemm.peak_fraction`` is fitted to an MI210 (tests/test_mi250x_gemm.py).
Two BF16 ``torch.mm`` results on one MI250X GCD check it (both cited in
hardware/accelerators/mi250x-gcd.yaml, ``gemm.peak_fraction``): the MAMF finder's best
shape on ROCm 6.2 (stas00/ml-engineering 359ee1c / 37d41a7, 2024-08/10: 147.0 TFLOP/s,
the fastest of 100 calls, at A 1024 x 14080 times B 14080 x 19968) and a second user's
sweep on one GCD that "peaks at 127" (stas00/ml-engineering issue 76, 2024-10-15).

They bound what the GEMM rate can explain of FRONTIER25-01 (−37 %, docs/validation.md
section 8): the row's GEMMs would have to run at about half of llmsim's rate, far below
either MI250X measurement.
"""

from __future__ import annotations

import pytest

from llmsim import validation as v
from llmsim.costs.compute import gemm_math_s
from llmsim.loader import load_spec

MAMF_SHAPE = (1024, 19968, 14080)  # M, N, K: mamf-finder's A is m x n and B n x k
MAMF_FASTEST_TFLOPS = 147.0  # ROCm 6.2, one GCD, fastest of 100 calls at the best shape
SECOND_SWEEP_PEAK_TFLOPS = 127.0  # another user's one-GCD sweep, its peak
GEMM_OPS = {"qkv", "attn_proj", "mlp_up", "mlp_down", "lm_head"}
"""The row's GEMMs (forward names; ``_dx`` and ``_dw`` are their backward GEMMs)."""


def _model_tflops(m: int, n: int, k: int) -> float:
    gcd = load_spec("accelerators", "mi250x-gcd")
    seconds = gemm_math_s(m, n, k, 1, gcd.gemm, gcd.peak_flops("bf16"), "bf16",
                          memory_bytes_per_s=gcd.sustained_memory_bytes_per_s)
    return 2 * m * n * k / seconds / 1e12


def test_the_model_lies_between_the_two_mi250x_measurements() -> None:
    """At the MAMF shape the MI210 fit gives 127.7 TFLOP/s: above the second sweep's peak,
    0.87 of the fastest single call."""
    model = _model_tflops(*MAMF_SHAPE)
    assert SECOND_SWEEP_PEAK_TFLOPS <= model <= MAMF_FASTEST_TFLOPS
    assert model / MAMF_FASTEST_TFLOPS == pytest.approx(0.87, abs=0.01)


def test_the_gemm_rate_cannot_close_the_frontier_row() -> None:
    """FRONTIER25-01's measured step less what llmsim prices besides the GEMMs leaves the
    GEMMs 4.29 s where llmsim gives them 2.80 (with the MI250X flash-attention curve,
    tests/test_mi250x_attention.py, and the blocking wait's exposed reduce-scatters; 4.72 s
    before them, 5.15 s with the old 0.49 attention fraction): they would have to run at 0.65
    of the model's rate, about 85 TFLOP/s at the row's largest GEMM, under 0.7 of the slower
    MI250X measurement. The GEMMs are most of the step: 0.5996 of it since the blocking
    wait's 1 ms poll (``collective_wait_poll_ms``, branch poll) rounds each FSDP call up,
    0.60 before."""
    run = next(r for r in v.load_runs() if r.id == "FRONTIER25-01")
    result = v.predict(run).result
    frame = result.to_dataframe()
    compute = frame[(frame.device == 0) & (frame.stream == "compute")]
    base = compute.name.str.replace(r"_(dx|dw)$", "", regex=True)
    gemm_s = float(compute[base.isin(GEMM_OPS)].duration_s.sum())
    needed_s = run.measured - (result.step_time_s - gemm_s)
    assert 0.5 * result.step_time_s < gemm_s < result.step_time_s
    needed_tflops = _model_tflops(8192, 14336, 4096) * gemm_s / needed_s  # MLP up-projection
    assert needed_tflops < 0.7 * SECOND_SWEEP_PEAK_TFLOPS
