"""``parallelism.recompute: full_keep_attention``: every op of a block recomputed in the
backward but the fused attention kernel (DistFlashAttn's rematerialization-aware
checkpointing, Li et al. 2024 §3.3; ``checkpoint_end_with_flash_attention`` in
RulinShao/LightSeq lightseq_ckpt_monkey_patch.py at 135d8d2): the recompute pass is the
forward less its attention kernel, the memory keeps the attention output and its
log-sum-exp, and a step sits between ``full`` and ``none``."""

from __future__ import annotations

import pytest
from helpers import make_scenario

from llmsim.activations import activation_bytes_per_layer
from llmsim.errors import UserError
from llmsim.ops import ComputeOp
from llmsim.simulation import simulate
from llmsim.workload import LayerBuilder

BLOCK = {"parallelism.tp": 1, "training.seq_len": 4096, "model.max_seq_len": 4096}


def _passes(recompute: str):
    sc = make_scenario(**BLOCK, **{"parallelism.recompute": recompute})
    return sc, LayerBuilder(sc.model, sc.parallelism, sc.training).layer()


def test_the_recompute_is_the_forward_less_its_attention_kernel():
    _, (fwd, rec, _, _) = _passes("full_keep_attention")
    _, (_, full_rec, _, _) = _passes("full")
    assert [op.name for op in rec] == [op.name for op in fwd
                                       if not (isinstance(op, ComputeOp)
                                               and op.kind == "attention")]
    assert all(op.phase == "R" for op in rec)
    assert [op for op in full_rec if getattr(op, "kind", "") != "attention"] == rec


def test_the_memory_keeps_the_attention_output_and_its_log_sum_exp():
    sc, _ = _passes("full_keep_attention")
    full = make_scenario(**BLOCK, **{"parallelism.recompute": "full"})
    m, s = sc.model, sc.training.seq_len
    b = sc.parallelism.micro_batch
    kept = activation_bytes_per_layer(m, sc.parallelism, sc.training)
    base = activation_bytes_per_layer(full.model, full.parallelism, full.training)
    assert kept - base == pytest.approx(2 * s * b * m.q_dim + 4 * m.heads * s * b)


def test_a_step_sits_between_full_and_none():
    steps = {rc: simulate(make_scenario(**BLOCK, **{"parallelism.recompute": rc})).step_time_s
             for rc in ("none", "full_keep_attention", "full")}
    assert steps["none"] < steps["full_keep_attention"] < steps["full"]


def test_unfused_attention_is_refused_in_one_sentence():
    with pytest.raises(UserError, match="recompute: full_keep_attention keeps a fused "
                                        "attention kernel's output"):
        make_scenario(**BLOCK, **{"parallelism.recompute": "full_keep_attention",
                                  "training.attention_kernel": "unfused"})
