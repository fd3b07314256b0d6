"""The chain of posted pipeline sends in the estimator (llmsim.search.posted_sends)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

import llmsim
from llmsim.search.estimate import Estimator
from llmsim.search.pipeline import StageTimes, pipeline_s
from llmsim.search.posted_sends import chain_hops_s
from llmsim.simulation import simulate


def _stages(p: int, v: int, hop_s: float, f: float = 1.0, b: float = 2.0) -> list[StageTimes]:
    """Equal stages of ``v`` chunks whose every send takes ``hop_s``: v forward sends out
    of each stage but the last (v − 1: its last chunk is the last virtual stage), v
    backward sends out of each but the first."""
    return [StageTimes(f=f * v, b=b * v, w=0.0,
                       sends_f=(v - (s == p - 1)) * hop_s, sends_b=(v - (s == 0)) * hop_s,
                       hop_f=hop_s if s < p - 1 else 0.0, hop_b=hop_s if s > 0 else 0.0)
            for s in range(p)]


@given(p=st.integers(2, 8), v=st.integers(2, 6), hop_us=st.integers(1, 500))
def test_chain_is_every_virtual_stages_send_each_way(p: int, v: int, hop_us: int) -> None:
    """v·p − 1 sends forward and as many backward."""
    hop_s = hop_us * 1e-6
    assert chain_hops_s((s, 1) for s in _stages(p, v, hop_s)) == pytest.approx(
        2 * (v * p - 1) * hop_s)


@given(p=st.integers(2, 8), v=st.integers(2, 6), m_per_p=st.integers(1, 4),
       hop_us=st.integers(1, 500))
def test_posted_interleaved_pipeline_waits_for_the_chain(p: int, v: int, m_per_p: int,
                                                         hop_us: int) -> None:
    """Posting sends one by one adds the chain's sends beyond the batched pipeline's one
    per stage boundary each way."""
    hop_s, m = hop_us * 1e-6, m_per_p * p
    stages = _stages(p, v, hop_s)
    batched, _ = pipeline_s("interleaved-1f1b", stages, m, v, blocking=False,
                            posted_singly=False, zero3=False, prefetch=True)
    posted, _ = pipeline_s("interleaved-1f1b", stages, m, v, blocking=False,
                           posted_singly=True, zero3=False, prefetch=True)
    assert posted - batched == pytest.approx(2 * (v * p - 1) * hop_s - 2 * (p - 1) * hop_s)


def test_estimator_counts_the_posted_chain_as_the_engine_does() -> None:
    """GPT-3 175B on Selene, 8 stages of 12 chunks, sends posted singly, 16 micro-batches:
    0.983 of the engine's step with one send per stage boundary, within 0.5 % with the
    chain."""
    scenario = llmsim.load_scenario("selene-gpt3", overrides=[
        "parallelism.schedule=interleaved-1f1b", "parallelism.virtual_stages=12",
        "parallelism.overlap_pp_comm=true", "training.global_batch=256"])
    assert Estimator().estimate(scenario).step_time_s == pytest.approx(
        simulate(scenario).step_time_s, rel=0.005)
