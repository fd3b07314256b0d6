"""The unfused attention's softmax and dropout as PyTorch's eager CPU kernels run them
(``training.attention_softmax: eager``, :mod:`llmsim.workload.softmax`)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from helpers import make_scenario
from pydantic import ValidationError
from test_cli import run_cli

from llmsim.activations import activation_bytes_per_layer
from llmsim.costs import HardwareCosts
from llmsim.costs.allocator import PageRoundTrip
from llmsim.loader import load_spec
from llmsim.ops import ComputeOp
from llmsim.plan import Plan
from llmsim.specs import Training
from llmsim.workload import build_workload

SEQ, HEADS, MICRO = 256, 4, 2


def _layer(softmax: str, dropout: float = 0.1):
    """The first block's forward and backward ops of a tiny FP32 GPT with unfused attention."""
    sc = make_scenario(**{"training.attention_kernel": "unfused", "training.precision": "fp32",
                          "training.attention_softmax": softmax,
                          "training.attention_dropout": dropout,
                          "training.seq_len": SEQ, "model.heads": HEADS,
                          "parallelism.micro_batch": MICRO})
    chunk = build_workload(sc.model, sc.parallelism, sc.training, sc.dp).chunks[(0, 0)]
    return sc, chunk.forward, chunk.backward


def _between(ops, first: str, last: str):
    """The ops strictly between the first op named ``first`` and the next named ``last``."""
    names = [op.name for op in ops]
    start = names.index(first)
    return list(ops[start + 1:names.index(last, start)])


def _score_bytes(sc) -> float:
    return 4.0 * MICRO * (HEADS // sc.parallelism.tp) * SEQ * SEQ  # FP32


@pytest.mark.parametrize("dropout", [0.1, 0.0])
def test_eager_forward_allocates_the_scaled_copy_and_the_float_noise(dropout):
    """Fused: the probabilities (and the dropout output); eager: also the scaled scores and
    the float noise tensor. Bytes: scale 2, mask 2, softmax 2, noise 1, its scaling 2 and
    the multiply 3 passes over the scores, against 2 + 2 passes and a 1-byte mask."""
    sc, fused_f, _ = _layer("fused", dropout)
    _, eager_f, _ = _layer("eager", dropout)
    s = _score_bytes(sc)
    fused = _between(fused_f, "attn_scores", "attn_context")
    eager = _between(eager_f, "attn_scores", "attn_context")
    new = [op.output_bytes for op in eager if op.output_bytes]
    assert all(b == s for b in new)
    assert len(new) == (4 if dropout else 2)
    assert len([op for op in fused if op.output_bytes]) == (2 if dropout else 1)
    assert sum(op.bytes for op in eager) == pytest.approx(s * (12 if dropout else 6), rel=1e-12)
    assert sum(op.bytes for op in fused) == pytest.approx(
        s * (4.25 if dropout else 2), rel=1e-12)


def test_eager_backward_clones_the_masked_gradient_and_scales_it():
    """The backward adds masked_fill_'s clone and the scale's gradient, two score-sized
    tensors, and reads the float noise (3 passes) instead of a byte mask."""
    sc, _, fused_b = _layer("fused")
    _, _, eager_b = _layer("eager")
    s = _score_bytes(sc)
    fused = _between(fused_b, "attn_context_dw", "attn_scores_dx")
    eager = _between(eager_b, "attn_context_dw", "attn_scores_dx")
    assert [op.name for op in fused] == ["attn_dropout_bwd", "attn_softmax_bwd"]
    assert len([op for op in eager if op.output_bytes == s]) == 4
    assert sum(op.bytes for op in eager) - sum(op.bytes for op in fused) == pytest.approx(
        s * (3 + 3 + 2 + 2 + 2 - 2.25 - 3), rel=1e-12)


def test_under_glibc_each_new_score_tensor_pays_one_page_round_trip():
    """With scores of 32 MiB and more, the eager forward costs its extra kernels' bytes
    at the streaming rate plus one round trip per extra score-sized tensor."""
    sc, fused_f, _ = _layer("fused")
    _, eager_f, _ = _layer("eager")
    fugaku = sc.model_copy(update={"system": load_spec("systems", "fugaku")})
    costs = HardwareCosts(fugaku.system, Plan.from_scenario(fugaku), "fp32",
                          attention_kernel="unfused", allocator="glibc")
    trip = PageRoundTrip(fugaku.system.node.accelerator)
    scale = 64 * 2**20 / _score_bytes(sc)  # the same kernels over 64 MiB of scores
    grow = [replace(op, bytes=op.bytes * scale, output_bytes=op.output_bytes * scale)
            for op in _between(eager_f, "attn_scores", "attn_context")]
    rate = fugaku.system.node.accelerator.sustained_memory_bytes_per_s
    launch = fugaku.system.node.accelerator.kernel_launch_us * 1e-6
    for op in grow:
        expected = op.bytes / rate + launch + (trip.op_s(op) if op.output_bytes else 0.0)
        assert costs.compute_s(op) == pytest.approx(expected, rel=1e-9), op.name
    assert sum(1 for op in grow if trip.op_s(op) > 0) == 4
    assert len(fused_f) < len(eager_f)


def test_eager_softmax_needs_the_unfused_attention(capsys):
    with pytest.raises(ValidationError, match="attention_softmax: eager needs attention_kernel"):
        Training(global_batch=8, seq_len=128, attention_softmax="eager")
    code, out, err = run_cli(["run", "selene-gpt3", "--set", "training.attention_softmax=eager"],
                             capsys)
    assert code == 2
    assert "attention_softmax" in err and "unfused" in err and "Traceback" not in err + out


def test_eager_dropout_keeps_float_noise_for_the_backward():
    """Without recompute the block keeps the dropout's float noise (4 bytes a score
    element in FP32) instead of a 1-byte mask: 3 bytes more per element."""
    sc, _, _ = _layer("fused")
    eager, _, _ = _layer("eager")
    fused_b = activation_bytes_per_layer(sc.model, sc.parallelism, sc.training)
    eager_b = activation_bytes_per_layer(eager.model, eager.parallelism, eager.training)
    assert eager_b - fused_b == pytest.approx(3 * _score_bytes(sc) / 4, rel=1e-12)


def _alibi_layer(position: str, kernel: str = "unfused"):
    """The first block's forward, backward and the step of a tiny BF16 GPT; for RoPE
    without its rotary kernels on q and k (llmsim.workload.rope), which ALiBi does not run."""
    sc = make_scenario(**{"training.attention_kernel": kernel, "training.seq_len": SEQ,
                          "model.heads": HEADS, "parallelism.micro_batch": MICRO,
                          "model.position_embedding": position})
    chunk = build_workload(sc.model, sc.parallelism, sc.training, sc.dp).chunks[(0, 0)]
    def kept(ops):
        return tuple(op for op in ops if getattr(op, "name", "") not in ("rope", "rope_bwd"))
    if position == "rope":
        assert len(kept(chunk.forward)) < len(chunk.forward)  # the rotary kernels were there
    return sc, kept(chunk.forward), kept(chunk.backward)


def test_alibi_copies_its_bias_into_the_scores_which_the_gemm_reads_back():
    """``torch.baddbmm(alibi, q, kᵀ, beta)``: one copy writing the s×s scores (BF16) before
    the scores GEMM, which reads them as C and allocates nothing; everything else, the
    backward included, is RoPE's (no bias), and the parameters are the same."""
    sc, alibi_f, alibi_b = _alibi_layer("alibi")
    _, rope_f, rope_b = _alibi_layer("rope")
    scores_bytes = 2.0 * MICRO * (HEADS // sc.parallelism.tp) * SEQ * SEQ
    names = [op.name for op in alibi_f]
    copy = alibi_f[names.index("attn_alibi_copy")]
    assert names[names.index("attn_alibi_copy") + 1] == "attn_scores"
    assert (copy.kind, copy.bytes, copy.output_bytes) == ("memory", scores_bytes, scores_bytes)
    gemm = next(op for op in alibi_f if op.name == "attn_scores")
    plain = next(op for op in rope_f if op.name == "attn_scores")
    assert gemm.bytes == plain.bytes + scores_bytes and gemm.output_bytes == 0.0
    assert gemm.flops == plain.flops and gemm.mnk == plain.mnk
    assert [op for op in alibi_f if op.name not in ("attn_alibi_copy", "attn_scores")] == \
        [op for op in rope_f if op.name != "attn_scores"]
    assert alibi_b == rope_b
    assert sc.model.params == make_scenario(**{"model.position_embedding": "rope"}).model.params


def test_alibi_costs_nothing_in_a_flash_kernel_and_time_with_unfused_attention():
    """Flash kernels add the bias in registers: the same ops as RoPE. Unfused, the copy
    and the read take time, priced at the memory-bound rate (the GEMM here is
    compute-bound, so only the copy shows)."""
    _, flash_alibi, _ = _alibi_layer("alibi", "flash")
    _, flash_rope, _ = _alibi_layer("rope", "flash")
    assert flash_alibi == flash_rope
    sc, alibi_f, _ = _alibi_layer("alibi")
    _, rope_f, _ = _alibi_layer("rope")
    costs = HardwareCosts.from_scenario(sc, Plan.from_scenario(sc))
    def priced(ops):
        return sum(costs.compute_s(op) for op in ops if isinstance(op, ComputeOp))

    extra = priced(alibi_f) - priced(rope_f)
    copy = next(op for op in alibi_f if op.name == "attn_alibi_copy")
    assert extra >= costs.compute_s(copy) > 0
