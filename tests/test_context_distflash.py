"""DistFlashAttn's load-balanced context-parallel schedule (``parallelism.cp_schedule:
distflash``, llmsim.context_distflash): its steps, balance, exposed exchange, bytes and
bookkeeping in closed form, and the block ops it builds (Li et al. 2024, Algorithm 2;
RulinShao/LightSeq async_communication.py and lightseq_async_attn.py at 135d8d2)."""

from __future__ import annotations

import pytest
from helpers import make_scenario
from hypothesis import given
from hypothesis import strategies as st
from test_cli import run_cli

from llmsim.context_distflash import (
    balance_factor,
    bookkeeping_ops,
    distflash_exposed_s,
    step_bytes,
    steps,
)
from llmsim.errors import UserError
from llmsim.host_syncs import HOST_SYNC_GAP_S
from llmsim.ops import CommOp, ComputeOp
from llmsim.workload import LayerBuilder
from llmsim.workload.build import pass_ops

LLAMA = {"model.hidden": 4096, "model.heads": 32, "model.kv_heads": 32, "model.layers": 4,
         "model.ffn_hidden": 11008, "model.max_seq_len": 65536, "training.seq_len": 65536,
         "training.global_batch": 1, "parallelism.micro_batch": 1, "parallelism.tp": 1,
         "parallelism.pp": 1, "parallelism.dp": 1, "parallelism.cp": 8, "nodes": 1}


def _simulate_rank_blocks(p: int) -> list[float]:
    """Blocks each rank computes in the code's schedule (is_compute_for_local_query,
    is_idle of async_communication.py): half a block at step 0, then one whole block a
    step unless idle."""
    work = []
    for r in range(p):
        blocks = 0.5
        for t in range(1, p // 2 + 1):
            idle = r < p // 2 and t == p // 2
            blocks += 0 if idle else 1
        work.append(blocks)
    return work


@pytest.mark.parametrize("p", [2, 4, 6, 8, 16])
def test_steps_and_balance_are_the_codes(p):
    work = _simulate_rank_blocks(p)
    assert steps(p) == p // 2 + 1
    # the ranks together compute the causal square: P half blocks and P(P-1)/2 whole ones
    assert sum(work) == pytest.approx(p / 2 + p * (p - 1) / 2)
    assert balance_factor(p) == pytest.approx(max(work) / (sum(work) / p))
    assert balance_factor(8) == pytest.approx(9 / 8)


@given(half=st.integers(min_value=1, max_value=2048))
def test_the_busiest_rank_does_one_half_block_more_than_the_mean(half):
    p = 2 * half
    assert balance_factor(p) == pytest.approx((p + 1) / p)
    assert balance_factor(p) > 1


def test_an_odd_cp_is_refused_in_one_sentence():
    with pytest.raises(UserError, match=r"parallelism\.cp: 3 is odd, and DistFlashAttn's "
                       "schedule covers the causal attention only over an even number"):
        make_scenario(**{"parallelism.tp": 8, "parallelism.pp": 1, "parallelism.cp": 3,
                         "parallelism.dp": "auto", "nodes": 3, "training.seq_len": 6144,
                         "model.max_seq_len": 6144, "parallelism.cp_schedule": "distflash"})


def test_the_exchange_hides_behind_whole_blocks_and_the_first_half_block():
    # P = 8: five steps, 4.5 blocks of 1 s; a fetch of 0.4 s hides everywhere
    assert distflash_exposed_s(0.4, 4.5, 5) == 0.0
    # 0.8 s: exposed only beside the half block of step 0
    assert distflash_exposed_s(0.8, 4.5, 5) == pytest.approx(0.3)
    # 1.5 s: 1.0 beside the half block, 0.5 beside each of the three whole blocks fetched
    assert distflash_exposed_s(1.5, 4.5, 5) == pytest.approx(1.0 + 3 * 0.5)
    assert distflash_exposed_s(5.0, 4.5, 1) == 0.0


@given(c=st.floats(0, 10), g=st.floats(0.1, 100), p=st.integers(2, 64))
def test_more_transfer_never_hides_more(c, g, p):
    n = steps(p)
    assert distflash_exposed_s(c, g, n) <= distflash_exposed_s(c * 1.5, g, n) + 1e-12
    assert distflash_exposed_s(c, g * 1.5, n) <= distflash_exposed_s(c, g, n) + 1e-12


def test_step_bytes_and_bookkeeping_in_closed_form():
    sc = make_scenario(**LLAMA)
    b = LayerBuilder(sc.model, sc.parallelism, sc.training)
    c = 65536 // 8
    q = 2 * c * 32 * 128          # a query block of the scenario's 16-bit dtype
    kv = 2 * q                     # MHA: keys and values
    assert step_bytes(b, backward=False) == kv + q + 8 * c * 32
    assert step_bytes(b, backward=True) == 3 * q + 4 * c * 32 + kv
    fwd = bookkeeping_ops(b, "F", 8)
    assert [op.name for op in fwd] == ["distflash_rescale"]
    assert fwd[0].bytes == 3 * 3 * q and fwd[0].splits == 3
    bwd = bookkeeping_ops(b, "B", 8)
    assert [op.bytes for op in bwd] == [2 * (3 * q + kv), 7 * 3 * q]


def test_the_block_ops_are_the_busiest_ranks():
    te = make_scenario(**LLAMA)
    dfa = make_scenario(**LLAMA, **{"parallelism.cp_schedule": "distflash"})
    te_f = pass_ops(te.model, te.parallelism, te.training).dense[0]
    dfa_f = pass_ops(dfa.model, dfa.parallelism, dfa.training).dense[0]
    te_attn = next(op for op in te_f if isinstance(op, ComputeOp) and op.kind == "attention")
    attn = next(op for op in dfa_f if isinstance(op, ComputeOp) and op.kind == "attention")
    assert attn.flops == pytest.approx(te_attn.flops * 9 / 8)
    assert attn.host_s == pytest.approx(5 * HOST_SYNC_GAP_S)
    assert attn.host_held and not te_attn.host_held  # its syncs hold the host to its end
    fetch = next(op for op in dfa_f if isinstance(op, CommOp) and op.axis == "cp")
    assert (fetch.ring_steps, fetch.ring_schedule, fetch.name) == (5, "distflash",
                                                                   "cp_distflash")
    others = [op for op in dfa_f if not (isinstance(op, CommOp) and op.axis == "cp")
              and op is not attn and getattr(op, "name", "") != "distflash_rescale"]
    assert others == [op for op in te_f if not (isinstance(op, CommOp) and op.axis == "cp")
                      and op is not te_attn]


def test_cp_one_has_no_schedule_to_set():
    # at cp 1 there is no context-parallel attention: the schedule would be ignored, so a
    # scenario that sets it is refused (the search drops it where it tries cp 1)
    base = {**LLAMA, "parallelism.cp": 1, "parallelism.dp": 8, "training.seq_len": 8192,
            "training.global_batch": 8}
    assert make_scenario(**base).parallelism.cp_schedule == "te_ring"  # valid without it
    with pytest.raises(UserError, match=r"parallelism\.cp_schedule: distflash schedules "
                       "context-parallel attention, and cp is 1"):
        make_scenario(**base, **{"parallelism.cp_schedule": "distflash"})


def test_an_mla_model_is_refused_in_one_sentence(capsys):
    code, _, err = run_cli(["run", "deepseek-v3", "--set", "parallelism.cp=2",
                            "--set", "parallelism.dp=1",
                            "--set", "parallelism.cp_schedule=distflash"], capsys)
    assert code == 2 and "Traceback" not in err
    assert "cp_schedule: distflash exchanges key/value blocks" in " ".join(err.split())
