"""Fugaku's power knobs and NUMA placement against the development rows (issue 36).

llmsim prices neither core retention (Fugaku's default below 9,217 nodes: an idle core
drops to a low-power state and takes about 3 ms to run again) nor a clock other than the
catalog's 2.0 GHz. The rows' own source also timed two of its one-node runs with
``retention_state=0``; these tests hold llmsim's prediction of those configurations against
the runs without retention, and check from the catalog that weights first-touched on one
CMG cost the GEMMs no ring-bus bandwidth (docs/validation.md section 8, "Power knobs, NUMA
placement and small GEMMs").
"""

from __future__ import annotations

import pytest

from llmsim.loader import load_spec

RETENTION_OFF_S = {
    # Fugaku-LLM/DeepSpeedFugaku experiments/124m_13b_benchmarking/fugaku_sweep.md (history
    # before commit bb88177, last version 35c25d4): the same one-node run as the row, with the
    # job's power knob retention_state=0, 2.0 GHz, glibc malloc, PyTorch 1.7.
    "FUGAKU-DEV-6": 10023.9,  # 1.3B, '1 ("retention_state=0")', against 11,727.9 s
    "FUGAKU-DEV-10": 1401.1,  # 124M, '1 ("retention_state=0")', against 1,489.7 s
}


def predicted(row_id: str) -> tuple[float, float]:
    """(measured, predicted) seconds per iteration of a validation row."""
    from llmsim import validation as v

    p = v.predict(next(r for r in v.load_runs() if r.id == row_id))
    return p.run.measured, p.predicted


@pytest.mark.parametrize("row", sorted(RETENTION_OFF_S))
def test_the_one_node_rows_are_within_20_percent_of_the_runs_without_core_retention(row):
    """llmsim models no retention, so the like-for-like measurement of a row's configuration
    is the source's run with retention_state=0: DEV-6 8,156 s against 10,023.9 (-18.6 %),
    DEV-10 1,157 s against 1,401.1 (-17.4 %); the rows themselves are -30.5 and -22.3 %."""
    _, model = predicted(row)
    assert model == pytest.approx(RETENTION_OFF_S[row], rel=0.2)


@pytest.mark.parametrize("row", sorted(RETENTION_OFF_S))
def test_retention_explains_part_of_the_gap_and_never_overshoots_it(row):
    """The source's retention difference (1,704 s on the 1.3B node, 88.6 s on the 124M) is
    part of the row's gap, not all of it: the run without retention is still slower than
    llmsim, and the default run slower again."""
    measured, model = predicted(row)
    assert model < RETENTION_OFF_S[row] < measured
    share = (measured - RETENTION_OFF_S[row]) / (measured - model)
    assert 0.2 < share < 0.6, share  # 0.48 (DEV-6), 0.27 (DEV-10)


def test_weights_on_one_cmg_cost_the_gemms_no_ring_bandwidth():
    """The rows' weights are first-touched by the main thread (normal_ on CPU is a serial
    loop in the runs' PyTorch 1.7), so they sit on one CMG. A GEMM of M tokens at R FLOP/s
    reads its K x N FP32 weight at 4KN / (2MKN / R) = 2R/M bytes/s, whatever K and N: at
    the catalog's third of peak 4.0 GB/s, and four times that if each CMG read it whole,
    against one ring segment's 128 GB/s (fugaku-cmg's fabric tier)."""
    chip = load_spec("accelerators", "a64fx")
    rate_flops = chip.peak_flops("fp32") * chip.gemm.peak_fraction
    tokens = 1024  # the rows' micro-batch of one 1,024-token sequence (2,048 at DEV-7's two)
    weight_bytes_per_s = 2.0 * rate_flops / tokens
    assert weight_bytes_per_s == pytest.approx(3.96e9, rel=0.01)
    (ring,) = load_spec("systems", "fugaku-cmg").node.fabric
    ring_bytes_per_s = ring.gbps_per_direction * 1e9
    assert 4 * weight_bytes_per_s < 0.15 * ring_bytes_per_s
    # Even at SSL2's best measured rate (0.90 of peak on 48 threads) the weights take a
    # tenth of a segment.
    assert 2.0 * chip.peak_flops("fp32") * 0.90 / tokens < 0.1 * ring_bytes_per_s
