"""The chain of posted pipeline sends in the estimator (llmsim.search.posted_sends)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

import llmsim
from llmsim.search.estimate import Estimator
from llmsim.search.pipeline import StageTimes, pipeline_s
from llmsim.search.posted_sends import chain_hops_s, first_backward_s, gather_delay_s
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


@given(p=st.integers(2, 8), v=st.integers(2, 6), f_us=st.integers(100, 5000),
       hop_us=st.integers(1, 500))
def test_warm_up_walk_of_equal_stages_is_the_forward_chain(p: int, v: int, f_us: int,
                                                           hop_us: int) -> None:
    """Equal stages, no gathers: every forward waits for the previous one's send, so the
    last stage's first backward starts after v·p − 1 forwards and sends and one forward."""
    f, hop = f_us * 1e-6, hop_us * 1e-6
    start = first_backward_s([[f] * v for _ in range(p)], [hop] * p, None)
    assert start == pytest.approx((v * p - 1) * (f + hop) + f)


@given(p=st.integers(2, 8), v=st.integers(2, 6), f_us=st.integers(100, 5000),
       hop_us=st.integers(1, 500), share=st.floats(0.0, 1.0))
def test_gathers_the_previous_forward_hides_delay_by_the_first(
        p: int, v: int, f_us: int, hop_us: int, share: float) -> None:
    """A one-layer gather no longer than a forward and its send is hidden behind the
    forward before it: only the step's first gathers, issued at the start, delay it."""
    f, hop = f_us * 1e-6, hop_us * 1e-6
    gather = share * (f + hop)
    forward = [[f] * v for _ in range(p)]
    delay = gather_delay_s(forward, [hop] * p, [[(gather, 1)] * v for _ in range(p)])
    assert delay == pytest.approx(gather, abs=1e-12)


def test_a_longer_gather_delays_every_chunk_by_what_the_forward_before_hides() -> None:
    """Two stages of three one-layer chunks, forwards of 1 s, free sends, gathers of 3 s:
    the last stage's first backward at 13 s with the gathers, 6 s without (worked by hand
    from the engine's rules: the first gathers wait 3 s, each later chunk's 3 − 1 s once
    per loop of the pipeline); the per-stage sum of the gathers would count 9 s."""
    forward, hops, gathers = [[1.0] * 3] * 2, [0.0] * 2, [[(3.0, 1)] * 3] * 2
    assert first_backward_s(forward, hops, gathers) == pytest.approx(13.0)
    assert first_backward_s(forward, hops, None) == pytest.approx(6.0)
    assert gather_delay_s(forward, hops, gathers) == pytest.approx(7.0)
