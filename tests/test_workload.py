"""Workload graph: FLOP closed forms (Narayanan et al. 2021 eq. 3) and op structure."""

from __future__ import annotations

import pytest
from helpers import make_scenario

from llmsim.specs import Scenario
from llmsim.workload import build_workload

GPT3 = {"name": "gpt3-shape", "layers": 96, "hidden": 12288, "heads": 96, "ffn_hidden": 49152,
        "vocab": 51200, "max_seq_len": 2048}


def _gpt3(recompute: str, **extra):
    s = make_scenario(nodes=128, model=GPT3, parallelism__tp=8, parallelism__pp=8,
                      parallelism__recompute=recompute, training__global_batch=1536,
                      training__seq_len=2048, **extra)
    return s, build_workload(s.model, s.parallelism, s.training, s.dp)


def closed_form(B, s, L, h, V, factor, v_div):
    return factor * B * s * L * h * h * (1 + s / (6 * h) + V / (v_div * L * h))


@pytest.mark.parametrize("kernel", ["flash", "cudnn", "unfused"])
def test_model_flops_match_narayanan_72_form(kernel):
    # The graph counts every GEMM and attention product; the closed form counts the same
    # terms (24·B·s·h² per block per pass, 4·B·s²·h attention, 2·B·s·h·V head, ×3 for
    # forward+backward). It omits biases, norms and softmax (not FLOPs in the graph
    # either), so the match is exact up to float rounding — well inside 1 %.
    _s, work = _gpt3("none", training__attention_kernel=kernel)
    expected = closed_form(1536, 2048, 96, 12288, 51200, 72, 12)
    assert work.model_flops() == pytest.approx(expected, rel=1e-6)


def test_hardware_flops_with_full_recompute_match_96_form():
    # Full recompute repeats every block's forward (not the LM head): 96 = 4 passes × 24.
    _s, work = _gpt3("full")
    expected = closed_form(1536, 2048, 96, 12288, 51200, 96, 16)
    assert work.hardware_flops() == pytest.approx(expected, rel=1e-6)
    assert work.model_flops() == pytest.approx(closed_form(1536, 2048, 96, 12288, 51200, 72, 12),
                                               rel=1e-6)


def test_fused_attention_kernels_carry_their_sequence_length_and_head_dim():
    # The kernel's efficiency depends on both (FlashAttention-2 curve of the catalog).
    _s, work = _gpt3("selective")
    attention = [op for chunk in work.chunks.values()
                 for op in (*chunk.forward, *chunk.backward)
                 if getattr(op, "kind", None) == "attention"]
    assert attention and {op.attention_shape for op in attention} == {(2048, 128)}


def test_selective_recompute_adds_only_the_attention_core():
    _, none = _gpt3("none")
    _, sel = _gpt3("selective")
    B, s, L, h = 1536, 2048, 96, 12288
    assert sel.hardware_flops() - none.hardware_flops() == pytest.approx(4 * B * s * s * h * L,
                                                                         rel=1e-9)


def test_tensor_parallel_collectives_follow_sequence_parallelism():
    s = make_scenario(parallelism__tp=2, parallelism__pp=1, parallelism__sequence_parallel=False)
    df = build_workload(s.model, s.parallelism, s.training, s.dp).to_dataframe()
    block = df[(df.phase == "F") & (df.axis == "tp") & ~df.op.str.startswith(("embed", "loss"))]
    assert set(block.kind) == {"all_reduce"}
    assert len(block) == 2 * 8  # two all-reduces per layer in the forward
    s = make_scenario(parallelism__tp=2, parallelism__pp=1, parallelism__sequence_parallel=True)
    df = build_workload(s.model, s.parallelism, s.training, s.dp).to_dataframe()
    block = df[(df.phase == "F") & (df.axis == "tp") & ~df.op.str.startswith(("embed", "loss",
                                                                            "head"))]
    assert sorted(set(block.kind)) == ["all_gather", "reduce_scatter"]
    assert len(block) == 4 * 8


@pytest.mark.parametrize(("tp", "sp", "sliced", "gathered"), [
    (4, False, True, True),    # 1/tp on each rank, all-gathered on receipt
    (4, True, True, False),    # sequence parallel: already 1/tp, nothing to rebuild
    (1, False, False, False),  # nothing to split
])
@pytest.mark.parametrize("framework", ["megatron", "deepspeed"])
def test_scatter_gather_sends_a_slice_and_gathers_the_activation(tp, sp, sliced, gathered,
                                                                  framework):
    b, s, h = 2, 1024, 1024
    scenario = make_scenario(nodes=2, parallelism__tp=tp, parallelism__pp=2,
                             parallelism__micro_batch=b, training__seq_len=s,
                             model__hidden=h, parallelism__sequence_parallel=sp,
                             parallelism__pp_scatter_gather=framework)
    work = build_workload(scenario.model, scenario.parallelism, scenario.training, scenario.dp)
    activation = b * s * h * 2  # bf16
    assert work.pp_message_bytes == (activation / tp if sliced else activation)
    assert work.pp_gather_bytes == (activation if gathered else 0.0)
    assert work.pp_regather_output == (gathered and framework == "deepspeed")


@pytest.mark.parametrize("zero", [0, 1])
@pytest.mark.parametrize("staged", [False, True])
def test_gradients_through_a_flattened_copy_add_three_passes(zero, staged):
    s = make_scenario(nodes=2, parallelism__tp=8, parallelism__pp=1, parallelism__zero=zero,
                      parallelism__grad_all_reduce=staged)
    work = build_workload(s.model, s.parallelism, s.training, s.dp)
    ops = work.dp_grad_ops(work.chunks[(0, 0)])
    assert ops and {op.staging_passes for op in ops} == {3 if staged else 0}
    # ZeRO-0 all-reduces either way; ZeRO-1 reduce-scatters unless it goes through the copy.
    assert {op.collective for op in ops} == {
        "all_reduce" if zero == 0 or staged else "reduce_scatter"}


@pytest.mark.parametrize(("check", "prescale"), [(False, False), (True, False),
                                                (False, True), (True, True)])
def test_bucket_checks_read_the_bucket_and_scaling_rewrites_it(check, prescale):
    s = make_scenario(nodes=2, parallelism__tp=8, parallelism__pp=1, parallelism__zero=1,
                      parallelism__grad_bucket_nan_check=check,
                      parallelism__grad_bucket_prescale=prescale)
    work = build_workload(s.model, s.parallelism, s.training, s.dp)
    bucket = work.dp_grad_ops(work.chunks[(0, 0)])[0]
    ops = {op.name: op for op in work.grad_sync_prep(bucket)}
    expected = {"dp_grad_nan_check": (bucket.bytes, 3)} if check else {}
    if prescale:
        expected["dp_grad_prescale"] = (2 * bucket.bytes, 1)  # read and write, one kernel
    assert {name: (op.bytes, op.splits) for name, op in ops.items()} == expected
    assert all(op.kind == "memory" and op.flops == 0 for op in ops.values())


def test_no_tp_collectives_without_tensor_parallelism():
    s = make_scenario(nodes=1, parallelism__tp=1, parallelism__pp=1)
    df = build_workload(s.model, s.parallelism, s.training, s.dp).to_dataframe()
    assert (df.axis == "tp").sum() == 0


def test_backward_keeps_input_and_weight_gradients_apart():
    s = make_scenario()
    work = build_workload(s.model, s.parallelism, s.training, s.dp)
    for chunk in work.chunks.values():
        assert {op.phase for op in chunk.weight} == {"W"}
        assert {op.phase for op in chunk.backward} <= {"B", "R"}
        assert sum(op.flops for op in chunk.weight) > 0


def test_embedding_on_first_stage_head_on_last():
    s = make_scenario(parallelism__pp=4)
    work = build_workload(s.model, s.parallelism, s.training, s.dp)
    names = {st: {op.name for op in c.forward} for (st, _), c in work.chunks.items()}
    assert "embed" in names[0] and "lm_head" not in names[0]
    assert "lm_head" in names[3] and "embed" not in names[3]
    assert not ({"embed", "lm_head"} & names[1])


def test_dp_buckets_cover_the_gradients():
    s = make_scenario(nodes=2, parallelism__tp=1, parallelism__pp=1, parallelism__dp_bucket_mb=1)
    work = build_workload(s.model, s.parallelism, s.training, s.dp)
    chunk = work.chunks[(0, 0)]
    ops = work.dp_grad_ops(chunk)
    assert sum(op.bytes for op in ops) == pytest.approx(chunk.params * 4)
    assert all(op.bytes <= 1e6 for op in ops)
    assert {op.collective for op in ops} == {"all_reduce"}


@pytest.mark.parametrize(("bucket_mb", "per_bucket"), [
    (1e9, None),  # every matrix of the chunk fits: one bucket
    (1.99, 1),    # a matrix is more than half a bucket: reduced alone
    (2.01, 2),    # two matrices fit, a third would overflow it
    (0.01, 1),    # a matrix larger than the bucket is a bucket of its own, not split
])
def test_whole_matrix_buckets_follow_deepspeeds_fill_rule(bucket_mb, per_bucket):
    """DeepSpeed ZeRO's ipg buckets take whole matrices and close before the one that would
    overflow them: ceil(L·m / floor(bucket / matrix)) buckets, each the same share."""
    s = make_scenario(nodes=2, parallelism__tp=1, parallelism__pp=1, parallelism__zero=3,
                      parallelism__grad_buckets_whole_matrices=True)
    work = build_workload(s.model, s.parallelism, s.training, s.dp)
    chunk = work.chunks[(0, 0)]
    matrices = chunk.layers * (s.model.mlp_matrices + 2)
    total = chunk.params * work.grad_bytes_per_param
    matrix_mb = total / matrices / 1e6
    s = make_scenario(nodes=2, parallelism__tp=1, parallelism__pp=1, parallelism__zero=3,
                      parallelism__grad_buckets_whole_matrices=True,
                      parallelism__dp_bucket_mb=bucket_mb * matrix_mb)
    work = build_workload(s.model, s.parallelism, s.training, s.dp)
    ops = work.dp_grad_ops(chunk)
    expected = 1 if per_bucket is None else -(-matrices // per_bucket)
    assert len(ops) == expected
    assert sum(op.bytes for op in ops) == pytest.approx(total)
    # Without whole matrices the same bucket size splits by bytes: never above it.
    split = build_workload(s.model, s.parallelism.model_copy(
        update={"grad_buckets_whole_matrices": False}), s.training, s.dp).dp_grad_ops(chunk)
    assert all(op.bytes <= bucket_mb * matrix_mb * 1e6 * (1 + 1e-9) for op in split)


@pytest.mark.parametrize(("precision", "reduce_dtype", "bytes_per_grad"), [
    ("bf16", None, 4),     # Megatron-LM: --bf16 forces FP32 gradient reduction
    ("fp16", None, 2),
    ("fp32", None, 4),
    ("bf16", "bf16", 2),   # NeMo's distributed Adam with grad_sync_dtype: bf16
    ("fp16", "fp32", 4),
])
def test_dp_gradient_reduction_dtype(precision, reduce_dtype, bytes_per_grad):
    s = make_scenario(nodes=2, parallelism__tp=2, parallelism__pp=2,
                      parallelism__grad_reduce_dtype=reduce_dtype,
                      training__precision=precision, model__tied_embeddings=True)
    work = build_workload(s.model, s.parallelism, s.training, s.dp)
    for chunk in work.chunks.values():
        assert sum(op.bytes for op in work.dp_grad_ops(chunk)) == pytest.approx(
            chunk.params * bytes_per_grad)
    # The tied embedding's gradient between the first and last stage goes the same way.
    assert work.embedding_grad_allreduce.bytes == pytest.approx(
        -(-s.model.vocab // 2) * s.model.hidden * bytes_per_grad)


@pytest.mark.parametrize(("precision", "reduce_dtype", "bytes_per_element"), [
    ("bf16", None, 12),    # zero-fill 2, read 2, FP32 buffer read + write 8
    ("fp16", None, 8),     # FP16 buffer: 2 + 2 + 2 + 2
    ("bf16", "bf16", 8),   # a BF16 accumulation buffer
    ("fp32", None, 16),
])
def test_embedding_gradient_is_dense(precision, reduce_dtype, bytes_per_element):
    # PyTorch's embedding backward zero-fills the whole gradient of each table and the
    # data-parallel hook adds it to the accumulation buffer: once per micro-batch, on the
    # first stage only, whatever the micro-batch's token count.
    sizes = []
    for micro_batch in (1, 4):
        s = make_scenario(nodes=2, parallelism__tp=2, parallelism__pp=2,
                          parallelism__micro_batch=micro_batch,
                          parallelism__grad_reduce_dtype=reduce_dtype,
                          training__precision=precision)
        work = build_workload(s.model, s.parallelism, s.training, s.dp)
        dense = {st: [op for op in (*c.weight, *c.accumulate)
                      if op.name in ("embed_dense_grad", "embed_grad_accum")]
                 for (st, _), c in work.chunks.items()}
        assert not dense[1]
        fill, add = dense[0]
        assert fill.kind == add.kind == "memory"
        words = -(-s.model.vocab // 2) * s.model.hidden
        positions = s.model.max_seq_len * s.model.hidden   # learned, not split over TP
        assert fill.bytes + add.bytes == pytest.approx((words + positions) * bytes_per_element)
        sizes.append(fill.bytes + add.bytes)
    assert sizes[0] == sizes[1]


@pytest.mark.parametrize(("mode", "precision", "bytes_per_param"), [
    ("autograd", "fp16", 6),        # param.grad += new: read 2, read 2, write 2
    ("autograd", "bf16", 6),
    ("fp32_cast_add", "bf16", 18),  # .to(fp32): read 2, write 4; add_: read 4 + 4, write 4
])
def test_gradient_accumulation_outside_the_gemms(mode, precision, bytes_per_param):
    # Without fused accumulation every weight's gradient is added to the buffer by a kernel
    # of its own: the layers', the LM head's and the embeddings' (the embeddings' after
    # their dense zero-fill), with their parameter counts.
    s = make_scenario(nodes=2, parallelism__tp=2, parallelism__pp=2,
                      training__precision=precision, training__grad_accumulation=mode)
    work = build_workload(s.model, s.parallelism, s.training, s.dp)
    fused = make_scenario(nodes=2, parallelism__tp=2, parallelism__pp=2,
                          training__precision=precision)
    fused_work = build_workload(fused.model, fused.parallelism, fused.training, fused.dp)
    for key, chunk in work.chunks.items():
        assert sum(op.bytes for op in chunk.accumulate) == chunk.params * bytes_per_param
        # fused: only the embeddings' gradients, which no GEMM produces
        assert [op.name for op in fused_work.chunks[key].accumulate] == (
            ["embed_grad_accum"] if chunk.first else [])
        assert chunk.weight == fused_work.chunks[key].weight
    assert work.accumulate_from_microbatch == (1 if mode == "autograd" else 0)
    assert fused_work.accumulate_from_microbatch == 0


@pytest.mark.parametrize(("precision", "fwd_bytes", "bwd_bytes"),
                         [("bf16", 38, 14), ("fp16", 38, 14), ("fp32", 32, 8)])
def test_cross_entropy_traffic_follows_megatrons_kernels(precision, fwd_bytes, bwd_bytes):
    # Megatron's vocab-parallel cross-entropy, one kernel per line: cast to FP32 (2 + 4
    # bytes per logit), max (4), subtract (8), exp (8), sum (4), divide (8); backward: mul_
    # (8) and the cast of the gradient back (4 + 2). FP32 logits need no casts.
    s = make_scenario(parallelism__tp=2, parallelism__pp=2, training__precision=precision)
    work = build_workload(s.model, s.parallelism, s.training, s.dp)
    logits = s.parallelism.micro_batch * s.training.seq_len * -(-s.model.vocab // 2)
    last = work.chunks[(1, 0)]
    loss_f = [op for op in last.forward if op.name == "loss"]
    loss_b = [op for op in last.backward if op.name == "loss"]
    assert [op.bytes for op in loss_f] == [logits * fwd_bytes]
    assert [op.bytes for op in loss_b] == [logits * bwd_bytes]


@pytest.mark.parametrize(("dropout", "names", "per_element"), [
    # two of each: dropout backward (read the gradient and the 1-byte mask, write the
    # gradient: 2·2 + 1), norm backward (4 passes), gradient sum (read 2, write 1)
    (0.1, {"residual2_bwd", "ln2_bwd", "residual1_bwd", "ln1_bwd", "input_grad_sum"},
     2 * (2 * 2 + 1) + 2 * 4 * 2 + 2 * 3 * 2),
    # no dropout: the residual adds hand their gradient on, only the norms and sums remain
    (0.0, {"ln2_bwd", "residual1_bwd", "ln1_bwd", "input_grad_sum"}, 2 * 4 * 2 + 2 * 3 * 2),
])
def test_residual_stream_backward_traffic(dropout, names, per_element):
    # Per layer, on the b·s·h residual stream: the dropout backward of each residual branch,
    # each norm's backward, and autograd's out-of-place sum where a tensor feeds two ops
    # (the layer input and the attention block's output each feed a norm and a residual
    # add). residual1_bwd holds the attention branch's dropout backward and one sum.
    s = make_scenario(nodes=1, parallelism__tp=1, parallelism__pp=1, training__precision="bf16",
                      training__hidden_dropout=dropout)
    work = build_workload(s.model, s.parallelism, s.training, s.dp)
    stream = {"residual2_bwd", "ln2_bwd", "residual1_bwd", "ln1_bwd", "input_grad_sum"}
    ops = [op for op in work.chunks[(0, 0)].backward if op.name in stream]
    T = s.parallelism.micro_batch * s.training.seq_len
    assert {op.name for op in ops} == names
    assert len(ops) == len(names) * s.model.layers
    assert sum(op.bytes for op in ops) == s.model.layers * per_element * T * s.model.hidden


def test_hidden_dropout_writes_masks_in_the_forward():
    # Bias-dropout-add reads the branch and the residual and writes the sum (3 passes of
    # 2 bytes) and, with dropout, a 1-byte mask; the embedding output gets its own dropout.
    def forward(dropout: float) -> tuple[dict[str, float], Scenario]:
        s = make_scenario(nodes=1, parallelism__tp=1, parallelism__pp=1,
                          training__precision="bf16", training__hidden_dropout=dropout)
        work = build_workload(s.model, s.parallelism, s.training, s.dp)
        return {op.name: op.bytes for op in work.chunks[(0, 0)].forward}, s

    on, s = forward(0.1)
    off, _ = forward(0.0)
    T = s.parallelism.micro_batch * s.training.seq_len
    stream = T * s.model.hidden
    assert on["residual1"] == on["residual2"] == stream * (3 * 2 + 1)
    assert off["residual1"] == off["residual2"] == stream * 3 * 2
    assert on["embed_dropout"] == stream * (2 * 2 + 1)
    assert "embed_dropout" not in off


def test_attention_dropout_is_a_kernel_only_for_unfused_attention():
    # Unfused: the dropout reads and writes the s×s probabilities and a 1-byte mask, forward
    # and backward; without it the softmax output goes straight to the context GEMM.
    def names(dropout: float) -> set[str]:
        s = make_scenario(parallelism__tp=1, parallelism__pp=1,
                          training__attention_kernel="unfused",
                          training__attention_dropout=dropout)
        chunk = build_workload(s.model, s.parallelism, s.training, s.dp).chunks[(0, 0)]
        return {op.name for op in chunk.ops}

    assert {"attn_dropout", "attn_dropout_bwd"} <= names(0.1)
    assert not {"attn_dropout", "attn_dropout_bwd"} & names(0.0)


@pytest.mark.parametrize(("bias", "kernels", "expect"), [
    (True, "separate", True), (True, "fused", False), (False, "separate", False)])
def test_separate_bias_kernels_add_the_qkv_bias_and_reduce_every_bias_gradient(bias, kernels,
                                                                               expect):
    # Megatron-LM's own linear layers: output = output + bias after the QKV GEMM (read and
    # write its output), grad_output.sum(dim=0) for its gradient, and autograd's sum over
    # the tokens for the biases folded into bias-GeLU and the two bias-dropout-adds.
    s = make_scenario(parallelism__tp=2, parallelism__pp=1, parallelism__sequence_parallel=False,
                      model__bias=bias, training__bias_kernels=kernels)
    work = build_workload(s.model, s.parallelism, s.training, s.dp)
    chunk = work.chunks[(0, 0)]
    adds = [op for op in chunk.forward if op.name == "qkv_bias"]
    grads = [op for op in chunk.backward if op.name == "bias_grads"]
    if not expect:
        assert adds == [] and grads == []
        return
    m, T = s.model, s.parallelism.micro_batch * s.training.seq_len
    qkv, up, e = 3 * m.hidden // 2, m.ffn_hidden // 2, 2
    assert len(adds) == len(grads) == m.layers
    assert adds[0].bytes == T * qkv * 2 * e
    assert grads[0].bytes == (T * (qkv + up) + 2 * T * m.hidden) * e


@pytest.mark.parametrize(("micro_batch", "copies", "passes"), [(1, True, 6), (2, True, 8),
                                                                 (2, False, 0)])
def test_legacy_flash_attention_copies_q_k_v_and_the_output(micro_batch, copies, passes):
    # rearrange(x, 's b ... -> b s ...').contiguous() for q, k and v (read and write
    # 3·b·s·h/t), the output back for b > 1 (2·b·s·h/t); the backward mirrors them.
    s = make_scenario(parallelism__tp=2, parallelism__pp=1, parallelism__micro_batch=micro_batch,
                      training__attention_layout_copies=copies)
    work = build_workload(s.model, s.parallelism, s.training, s.dp)
    chunk = work.chunks[(0, 0)]
    ops = [op for op in chunk.forward + chunk.backward if op.name.startswith("attn_layout")]
    if not passes:
        assert ops == []
        return
    T, h = micro_batch * s.training.seq_len, s.model.hidden
    assert len(ops) == 2 * s.model.layers
    assert {op.bytes for op in ops} == {passes * T * h / 2 * 2}


@pytest.mark.parametrize(("zero", "all_reduce", "kind"), [
    (0, False, "all_reduce"), (1, False, "reduce_scatter"), (1, True, "all_reduce"),
    (2, True, "all_reduce"), (3, False, "reduce_scatter"), (3, True, "all_reduce")])
def test_gradient_collective_follows_zero_stage_and_grad_all_reduce(zero, all_reduce, kind):
    s = make_scenario(nodes=2, parallelism__tp=1, parallelism__pp=1, parallelism__zero=zero,
                      parallelism__grad_all_reduce=all_reduce)
    work = build_workload(s.model, s.parallelism, s.training, s.dp)
    chunk = work.chunks[(0, 0)]
    ops = work.dp_grad_ops(chunk)
    assert {op.collective for op in ops} == {kind}
    assert sum(op.bytes for op in ops) == pytest.approx(chunk.params * 4)  # same buffer
    # DeepSpeed's fallback flattens, scales and copies back each bucket; NCCL does not.
    assert {op.staging_passes for op in ops} == {3 if zero and all_reduce else 0}


def test_tp_overlap_gemms_replace_transformer_engine_defaults_per_gemm():
    # A userbuffers configuration (MLPerf v3.0's h100tp4pp8mbs1 file): the bulk transfers
    # beside the QKV gradients on 4 and 8 SMs, the attention output's reduce-scatter
    # pipelined in 2 chunks on 24, MLP-down's input gradient by ring exchange in tp/2
    # aggregated chunks; every other GEMM keeps TE's defaults.
    gemms = {"qkv_dgrad": {"method": "bulk", "num_sm": 4},
             "qkv_wgrad": {"method": "bulk", "num_sm": 8},
             "proj_fprop": {"method": "pipeline", "num_sm": 24, "num_splits": 2},
             "fc2_dgrad": {"method": "ring_exchange", "aggregate": True}}
    s = make_scenario(parallelism__tp=4, parallelism__pp=1, parallelism__sequence_parallel=True,
                      parallelism__overlap_tp_comm=True, parallelism__tp_overlap_gemms=gemms)
    ops = {op.name: op for op in build_workload(s.model, s.parallelism, s.training,
                                                s.dp).chunks[(0, 0)].ops}
    assert (ops["qkv_dx"].reserved_units, ops["qkv_dw"].reserved_units) == (4, 8)
    assert (ops["attn_proj"].splits, ops["attn_proj"].reserved_units) == (2, 24)
    assert (ops["mlp_down_dx"].splits, ops["mlp_down_dx"].reserved_units) == (2, 0)
    # defaults: MLP-down's reduce-scatter in 4 chunks on 16 SMs, QKV by ring exchange in tp
    assert (ops["mlp_down"].splits, ops["mlp_down"].reserved_units) == (4, 16)
    assert (ops["qkv"].splits, ops["mlp_up_dw"].reserved_units) == (4, 16)


# Bytes per parameter of the optimizer step, by what the framework runs (optimizer_step):
# Adam 28 (read weight, gradient, m, v; write weight, m, v), the norm 4, the 16-bit weight
# copy 6; 16-bit gradients add their FP32 cast (6), fp16 the unscale and check (8).
@pytest.mark.parametrize(("precision", "accumulation", "kernels", "per_param", "reset"), [
    ("bf16", "fused", "multi_tensor", 4 + 28 + 6, 4),           # Megatron-Core, FP32 grads
    ("fp16", "autograd", "multi_tensor", 6 + 8 + 4 + 28 + 6, 0),  # Megatron-LM 2021
    ("fp16", "autograd", "per_tensor", 10 + 6 + 8 + 4 + 28 + 6, 0),  # Megatron-LM 2020
    ("fp32", "fused", "multi_tensor", 4 + 28, 4),               # no 16-bit copy, no cast
])
def test_optimizer_step_bytes_follow_the_framework_passes(precision, accumulation, kernels,
                                                          per_param, reset):
    s = make_scenario(parallelism__pp=1, training__precision=precision,
                      training__grad_accumulation=accumulation,
                      training__optimizer_kernels=kernels)
    work = build_workload(s.model, s.parallelism, s.training, s.dp)
    params = work.stage_params(0)
    assert work.optimizer[0].bytes == pytest.approx((per_param + reset) * params)


def test_fused_adam_reads_the_reduced_gradient_once_more_for_the_norm():
    # apex DistributedFusedAdam (MLPerf): the norm over the BF16 shard, then one kernel
    # reading gradient, FP32 weight, m, v and writing them and the BF16 weight.
    s = make_scenario(nodes=2, parallelism__pp=1, parallelism__zero=1,
                      parallelism__grad_reduce_dtype="bf16", training__optimizer_kernels="fused")
    work = build_workload(s.model, s.parallelism, s.training, s.dp)
    params = work.stage_params(0)
    shard = params / s.dp
    assert work.optimizer[0].bytes == pytest.approx((2 + 2 + 24 + 2) * shard + 2 * params)


def test_per_tensor_optimizer_launches_six_kernels_per_parameter_tensor():
    # Megatron-LM 2020: per tensor the overflow check's cast, sum and host copy, the norm
    # and its host copy, and the weight copy. A GPT layer holds 12 tensors (QKV, attention
    # output, MLP in and out with biases, two layernorms); the first stage adds the word
    # and position embeddings, the last the final norm and its copy of the tied head.
    s = make_scenario(parallelism__pp=2, training__precision="fp16",
                      training__optimizer_kernels="per_tensor")
    work = build_workload(s.model, s.parallelism, s.training, s.dp)
    layers = s.model.layers // 2
    assert work.optimizer[0].splits == 6 * (12 * layers + 2)
    assert work.optimizer[1].splits == 6 * (12 * layers + 2 + 1)
    multi = build_workload(s.model, s.parallelism,
                           s.training.model_copy(update={"optimizer_kernels": "multi_tensor"}),
                           s.dp)
    assert multi.optimizer[0].splits == 1


@pytest.mark.parametrize("name", ["selene-gpt3", "frontier", "lumi", "frontier-moe",
                                  "deepseek-v3", "fugaku"])
@pytest.mark.parametrize("settings", [
    [], ["parallelism.sequence_parallel=false"], ["parallelism.pp_scatter_gather=megatron"],
    ["parallelism.sequence_parallel=false", "parallelism.pp_scatter_gather=deepspeed"],
    ["parallelism.micro_batch=3"]])
def test_pp_message_bytes_is_step_traffics(name, settings):
    """:func:`pp_message_bytes` (what ``simulation.check_posted_units`` reads) is the
    message :func:`step_traffic` carries, bit for bit."""
    import llmsim
    from llmsim.workload import pp_message_bytes, step_traffic

    try:
        sc = llmsim.load_scenario(name, settings)
    except llmsim.UserError:
        pytest.skip("the setting does not apply to this scenario")
    par = sc.parallelism
    expected = step_traffic(sc.model, par, sc.training, sc.dp).pp_message_bytes
    assert pp_message_bytes(sc.model, par, sc.training) == expected
    assert isinstance(pp_message_bytes(sc.model, par, sc.training), float)
