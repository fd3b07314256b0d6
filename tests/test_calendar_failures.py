"""A job's interruption rate: the Llama 3 log reproduced, and rates that add by part."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmsim.calendar.failures import job_failures
from llmsim.loader import load_spec
from llmsim.specs import Reliability


def test_default_rates_give_back_the_llama3_log():
    # 16,384 H100 in 2,048 nodes of 8, one NIC per GPU, 419 interruptions in 54 days
    # (Llama 3 paper, Table 5): eos has the same node design.
    eos = load_spec("systems", "eos").model_copy(update={"nodes": 2048})
    job = job_failures(eos, 2048)
    assert (job.devices, job.links) == (16_384, 16_384)
    assert job.rate_per_s * 54 * 86_400 == pytest.approx(419, rel=1e-12)
    assert job.mtbf_s / 3600 == pytest.approx(1296 / 419, rel=1e-12)  # one every 3.1 h


def test_rates_add_over_parts():
    rel = Reliability(device_fit=1e4, node_fit=2e4, link_fit=3e3)
    assert rel.failures_per_s(8, 1, 4) == pytest.approx((8e4 + 2e4 + 12e3) / 1e9 / 3600)


def test_no_failures_means_an_infinite_mtbf():
    selene = load_spec("systems", "selene")
    quiet = selene.model_copy(update={"reliability": Reliability(
        device_fit=0, node_fit=0, link_fit=0)})
    job = job_failures(quiet, 4)
    assert job.rate_per_s == 0 and math.isinf(job.mtbf_s)


@given(st.integers(1, 2000), st.integers(1, 2000))
def test_rate_grows_in_proportion_to_the_nodes(a, b):
    selene = load_spec("systems", "selene")
    ra, rb = job_failures(selene, a).rate_per_s, job_failures(selene, b).rate_per_s
    assert ra * b == pytest.approx(rb * a, rel=1e-12)


def test_fugaku_whole_machine_gives_back_one_board_failure_every_2_5_days():
    # hardware/systems/fugaku.yaml: a CPU board fails every 2-3 days on the whole machine
    fugaku = load_spec("systems", "fugaku")
    job = job_failures(fugaku, fugaku.nodes)
    assert job.mtbf_s / 86_400 == pytest.approx(2.5, rel=1e-3)
    assert job_failures(fugaku, fugaku.nodes // 2).mtbf_s == pytest.approx(2 * job.mtbf_s)


def test_aurora_256_node_job_gives_back_auroragpts_seven_interruptions():
    # hardware/systems/aurora.yaml: 7 interruptions in 195.38 h of 256-node AuroraGPT jobs,
    # all causes counted per node (device and link rates are in it)
    aurora = load_spec("systems", "aurora")
    job = job_failures(aurora, 256)
    assert job.rate_per_s * 195.38 * 3600 == pytest.approx(7, rel=1e-5)
    assert job_failures(aurora, 8192).mtbf_s == pytest.approx(job.mtbf_s * 256 / 8192)

