"""llmsim's compute of one tensor-parallel rank against the same layers timed on an H100.

``tests/data/h100_layers_2026_11.csv`` holds PyTorch-eager timings of validation rows'
per-rank layers on one H100 SXM5 (``benchmarks/time_layers.py --tp N``; raw logs in
``benchmarks/results/h100-layers-2026-11-26/``). The measured times are fixed; llmsim's side
is priced afresh, so a change to the compute model that moves it away from the board shows
here. The band is the one ``docs/calibration.md`` states: eager PyTorch runs unfused norms
and activations that a Megatron-LM run fuses, so the two are not expected to agree exactly.
"""

from __future__ import annotations

import csv
import statistics

import pytest
from helpers import ROOT, load_script

time_layers = load_script("benchmarks/time_layers.py")

TOLERANCE = 0.15
"""Largest |llmsim / measured − 1| of one case's forward + backward."""
MEDIAN_TOLERANCE = 0.05
"""Largest |median ratio − 1| over the cases' forward + backward."""


def _cases() -> list[dict[str, str]]:
    path = ROOT / "tests" / "data" / "h100_layers_2026_11.csv"
    lines = [line for line in path.read_text().splitlines() if not line.startswith("#")]
    return list(csv.DictReader(lines))


CASES = _cases()


def _ratios(case: dict[str, str]) -> tuple[float, float]:
    overrides = [case["overrides"]] if case["overrides"] else []
    scenario = time_layers.resolve(case["case"], overrides)
    one = time_layers.single_device(scenario, int(case["layers"]), tp=int(case["tp"]))
    forward_s, both_s = time_layers.predicted_s(one)
    return (forward_s * 1e3 / float(case["pytorch_forward_ms"]),
            both_s * 1e3 / float(case["pytorch_forward_backward_ms"]))


@pytest.mark.parametrize("case", CASES, ids=[f"{c['case']}-{c['run']}" for c in CASES])
def test_rank_compute_within_band_of_the_h100(case: dict[str, str]) -> None:
    _, both = _ratios(case)
    assert abs(both - 1) <= TOLERANCE, f"llmsim/measured forward+backward = {both:.3f}"


def test_median_rank_compute_matches_the_h100() -> None:
    both = [_ratios(case)[1] for case in CASES]
    assert abs(statistics.median(both) - 1) <= MEDIAN_TOLERANCE, both


MOE_RESULTS = ROOT / "benchmarks" / "results" / "h100-2026-11-27-moe-layers"
time_layers_moe = load_script("benchmarks/time_layers_moe.py")

MOE_PART_TOLERANCE = 0.20
"""Largest |llmsim / measured − 1| of the MBRIDGE-2604-MOE-02 rank's attention and grouped
expert GEMMs per layer. Wider than :data:`TOLERANCE`: the board ran the MoE layers at
about 1,950 MHz, under its power limit, and llmsim prices BF16 GEMMs at their sustained
1,350 MHz; llmsim is 13-14 % slower on both (the folder's README)."""


@pytest.mark.parametrize("part", ["attention", "expert_gemms"])
def test_moe_rank_kernels_against_the_h100_profile(part: str) -> None:
    """The parts of a MoE layer that Megatron-Core runs as the same kernels as eager
    PyTorch, profiled on an H100 (``--ep 16 --permute gather``), against llmsim's price of
    them per layer; the permutation and activation are eager-only kernels and not held
    to llmsim (README)."""
    row = time_layers.resolve("MBRIDGE-2604-MOE-02", [])
    four, two = (time_layers.single_device(row, n, ep=16) for n in (4, 2))
    measured = time_layers_moe.profiled_parts_us(
        MOE_RESULTS / "profile_moe02_ep16_gather.csv", four)
    _, predicted = time_layers_moe.predicted_layer_parts_us(four, two)[part]
    assert abs(predicted / measured[part] - 1) <= MOE_PART_TOLERANCE, (predicted, measured)
