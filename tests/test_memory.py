"""Memory model (design §8): ZeRO closed forms, Korthikanti activations, in-flight counts."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmsim.errors import UserError
from llmsim.in_flight import in_flight_chunks, in_flight_microbatches
from llmsim.loader import load_scenario, load_spec
from llmsim.memory import (
    FRAGMENTATION_FRACTION,
    RUNTIME_CONTEXT_BYTES,
    StageMemory,
    activation_bytes_per_layer,
    layer_params_per_device,
    memory_per_stage,
    output_activation_bytes,
    peak_stage,
    stage_params,
)
from llmsim.params import embedding_params_per_device, head_params_per_device
from llmsim.specs import Accelerator, Model, Parallelism, Training

GPT2_XL = Model(
    name="gpt2-xl",
    layers=48,
    hidden=1600,
    heads=25,
    ffn_hidden=6400,
    vocab=50257,
    tied_embeddings=True,
    max_seq_len=1024,
)
"""GPT-2 1.5B (Radford et al. 2019, Table 2: 48 layers, d_model 1600)."""


@pytest.fixture(scope="module")
def gpt3() -> Model:
    return load_spec("models", "gpt3-175b")


@pytest.fixture(scope="module")
def a100() -> Accelerator:
    return load_spec("accelerators", "a100-sxm4-80gb")


def training(**kw: object) -> Training:
    return Training(**{"global_batch": 64, "seq_len": 2048, **kw})


def model_state(model: Model, a100: Accelerator, dp: int, **par: object) -> float:
    stages = memory_per_stage(model, Parallelism(**par), training(), dp, a100)
    return stages[0].model_state_bytes


# ---------------------------------------------------------------- parameters and ZeRO


def test_stage_params_add_up_to_the_model(gpt3: Model) -> None:
    assert layer_params_per_device(gpt3, 1) == gpt3.params_per_layer
    assert stage_params(gpt3, 1, 1, 0) == gpt3.params
    # pp > 1 with tied embeddings: the last stage holds a copy of the word embedding.
    total = sum(stage_params(gpt3, 1, 8, i) for i in range(8))
    assert total == gpt3.params + gpt3.vocab * gpt3.hidden
    untied = gpt3.model_copy(update={"tied_embeddings": False})
    assert sum(stage_params(untied, 1, 8, i) for i in range(8)) == untied.params


def test_tp_splits_matrices_and_replicates_norms(gpt3: Model) -> None:
    h, t = gpt3.hidden, 8
    replicated = 4 * h + 2 * h  # two LayerNorms (scale + bias), two row-parallel biases
    expected = (gpt3.params_per_layer - replicated) / t + replicated
    assert layer_params_per_device(gpt3, t) == expected


def test_gpt2_xl_with_mixed_precision_adam_needs_about_24_gb(a100: Accelerator) -> None:
    psi = GPT2_XL.params
    assert 1.5e9 < psi < 1.6e9
    state = model_state(GPT2_XL, a100, dp=1)
    assert state == 16 * psi
    assert 24e9 <= state < 26e9  # ZeRO paper §3: "at least 24 GB" for 1.5B parameters


@pytest.mark.parametrize("n", [1, 4, 64])
def test_zero_stages_follow_the_closed_forms(a100: Accelerator, n: int) -> None:
    """Rajbhandari et al. 2020 Fig. 1: 16Ψ, 4Ψ+12Ψ/N, 2Ψ+14Ψ/N, 16Ψ/N."""
    psi = GPT2_XL.params
    expected = [16 * psi, 4 * psi + 12 * psi / n, 2 * psi + 14 * psi / n, 16 * psi / n]
    for zero, want in enumerate(expected):
        assert model_state(GPT2_XL, a100, dp=n, zero=zero) == pytest.approx(want, rel=1e-12)


def test_fp32_training_keeps_4_4_8_bytes(a100: Accelerator) -> None:
    stages = memory_per_stage(GPT2_XL, Parallelism(), training(precision="fp32"), 1, a100)
    psi = GPT2_XL.params
    assert (stages[0].weights_bytes, stages[0].grads_bytes, stages[0].optimizer_bytes) == (
        4 * psi,
        4 * psi,
        8 * psi,
    )


# ---------------------------------------------------------------- activations (Korthikanti)

S, B = 2048, 1


def per_layer(model: Model, kernel: str = "unfused", **par: object) -> float:
    return activation_bytes_per_layer(
        model, Parallelism(micro_batch=B, **par), training(seq_len=S, attention_kernel=kernel)
    )


@pytest.mark.parametrize(
    ("t", "sp", "recompute", "formula"),
    [
        # Korthikanti et al. 2022 eq. 1, eq. 2 and Table 2.
        (1, False, "none", lambda s, b, h, a, t: s * b * h * (34 + 5 * a * s / h)),
        (8, False, "none", lambda s, b, h, a, t: s * b * h * (10 + 24 / t + 5 * a * s / (h * t))),
        (8, True, "none", lambda s, b, h, a, t: s * b * h / t * (34 + 5 * a * s / h)),
        (8, False, "selective", lambda s, b, h, a, t: s * b * h * (10 + 24 / t)),
        (8, True, "selective", lambda s, b, h, a, t: s * b * h / t * 34),
        (8, False, "full", lambda s, b, h, a, t: 2 * s * b * h),
        (8, True, "full", lambda s, b, h, a, t: 2 * s * b * h / t),
    ],
)
def test_activations_per_layer_match_korthikanti(
    gpt3: Model, t: int, sp: bool, recompute: str, formula
) -> None:
    got = per_layer(gpt3, tp=t, sequence_parallel=sp, recompute=recompute)
    assert got == pytest.approx(formula(S, B, gpt3.hidden, gpt3.heads, t), rel=1e-12)


@pytest.mark.parametrize(
    ("hidden", "attention", "formula"),
    [
        # Without hidden dropout the two 1-byte masks go (10 → 8 outside the TP region);
        # without attention dropout only the softmax output stays of the core (5 → 2).
        (0.0, 0.1, lambda s, b, h, a: s * b * h * (32 + 5 * a * s / h)),
        (0.1, 0.0, lambda s, b, h, a: s * b * h * (34 + 2 * a * s / h)),
        (0.0, 0.0, lambda s, b, h, a: s * b * h * (32 + 2 * a * s / h)),
    ],
)
def test_activations_without_dropout_keep_no_masks(gpt3: Model, hidden: float, attention: float,
                                                   formula) -> None:
    got = activation_bytes_per_layer(
        gpt3, Parallelism(micro_batch=B),
        training(seq_len=S, attention_kernel="unfused", hidden_dropout=hidden,
                 attention_dropout=attention))
    assert got == pytest.approx(formula(S, B, gpt3.hidden, gpt3.heads), rel=1e-12)


@pytest.mark.parametrize("kernel", ["flash", "cudnn"])
def test_fused_attention_stores_no_s_by_s_matrix(gpt3: Model, kernel: str) -> None:
    selective = per_layer(gpt3, tp=8, sequence_parallel=True, recompute="selective")
    fused = per_layer(gpt3, kernel, tp=8, sequence_parallel=True)
    assert fused == pytest.approx(selective + 4 * gpt3.heads / 8 * S * B)  # fp32 log-sum-exp
    assert per_layer(gpt3, "flash", tp=8, recompute="selective") == per_layer(
        gpt3, tp=8, recompute="selective"
    )


def test_gqa_and_swiglu_terms(gpt3: Model) -> None:
    h, t = gpt3.hidden, 8
    base = per_layer(gpt3, tp=t, recompute="selective")
    gqa = gpt3.model_copy(update={"kv_heads": 8})  # K, V shrink from h to h/12 wide
    assert base - per_layer(gqa, tp=t, recompute="selective") == pytest.approx(
        2 * 2 * S * B * (h - h // 12) / t
    )
    swiglu = gpt3.model_copy(update={"activation": "swiglu"})  # gate and up both stored
    assert per_layer(swiglu, tp=t, recompute="selective") - base == pytest.approx(
        2 * S * B * gpt3.ffn_hidden / t
    )


def test_output_layer_matches_korthikanti_with_sp(gpt3: Model) -> None:
    v = 50264  # a vocabulary divisible by t = 8, so ⌈V/t⌉ = V/t
    model = gpt3.model_copy(update={"vocab": v})
    par, trn = Parallelism(tp=8, sequence_parallel=True), training(seq_len=S)
    h = gpt3.hidden
    assert output_activation_bytes(model, par, trn) == 4 * S * B * h / 8 * (1 + v / h)


# ---------------------------------------------------------------- micro-batches in flight


def test_in_flight_gpipe_holds_every_microbatch() -> None:
    assert in_flight_microbatches("gpipe", 4, 16) == [16] * 4


@pytest.mark.parametrize("schedule", ["1f1b", "zb-h1"])
def test_in_flight_1f1b_is_p_minus_i(schedule: str) -> None:
    assert in_flight_microbatches(schedule, 4, 16) == [4, 3, 2, 1]
    assert in_flight_microbatches(schedule, 4, 2) == [2, 2, 2, 1]


@pytest.mark.parametrize(("p", "v"), [(4, 2), (8, 3), (8, 4)])
def test_in_flight_interleaved_matches_korthikanti(p: int, v: int) -> None:
    chunks = in_flight_chunks("interleaved-1f1b", p, 4 * p, v)
    first = in_flight_microbatches("interleaved-1f1b", p, 4 * p, v)[0]
    assert first == pytest.approx(p * (1 + (p - 1) / (p * v)))  # Korthikanti §4.2.3
    assert sum(chunks[0]) == v * p + p - 1
    assert chunks[0][0] == 2 * p - 1  # chunk 0 runs its group of p twice before a backward
    assert chunks[-1] == [p] * (v - 1) + [1]  # the loss chunk holds one micro-batch
    assert in_flight_chunks("interleaved-1f1b", p, p, v) == [[p] * v] * p  # m = p: all


def test_in_flight_matches_the_schedules_when_available() -> None:
    schedules = pytest.importorskip("llmsim.schedules")
    for name, p, m, v in [("gpipe", 4, 8, 1), ("1f1b", 4, 8, 1), ("interleaved-1f1b", 4, 8, 2),
                          ("zb-h2", 4, 8, 1), ("zb-v", 4, 8, 2)]:
        peaks = schedules.peak_in_flight(schedules.build(name, p, m, v))
        assert [sum(c) for c in in_flight_chunks(name, p, m, v)] == peaks


def test_unknown_schedule_is_a_user_error() -> None:
    with pytest.raises(UserError, match="schedule"):
        in_flight_chunks("hanayo", 4, 8)


# ---------------------------------------------------------------- the whole device


def test_stage_activations_compose_the_parts(gpt3: Model, a100: Accelerator) -> None:
    par = Parallelism(tp=8, pp=8, sequence_parallel=True, recompute="selective")
    trn = training(global_batch=64, attention_kernel="unfused")
    stages = memory_per_stage(gpt3, par, trn, 1, a100)
    layer = per_layer(gpt3, tp=8, sequence_parallel=True, recompute="selective")
    core = 5 * gpt3.heads * S * S * B / 8  # one block's attention core, re-materialised
    mask = S * B * gpt3.hidden / 8  # embedding dropout mask
    assert stages[0].activations_bytes == pytest.approx(8 * 12 * layer + core + 8 * mask)
    last = 12 * layer + core + output_activation_bytes(gpt3, par, trn)
    assert stages[-1].activations_bytes == pytest.approx(last)
    assert [s.in_flight_microbatches for s in stages] == list(range(8, 0, -1))


@pytest.mark.parametrize("pp", [2, 4, 8])
def test_pipedream_stage_i_holds_p_minus_i_weight_versions(gpt3: Model, a100: Accelerator,
                                                           pp: int) -> None:
    """Weight stashing (Narayanan et al. 2019 §3.3): stage i holds p − i versions of its
    weights, against one for 1F1B; gradients, optimizer state and (with m ≥ p) the
    activations of its p − i micro-batches in flight are 1F1B's. The engine does not
    replay PipeDream, so the layout is built without the spec's check."""
    flush = Parallelism(tp=8, pp=pp)
    stash = flush.model_copy(update={"schedule": "pipedream"})
    one = memory_per_stage(gpt3, flush, training(), 1, a100)
    many = memory_per_stage(gpt3, stash, training(), 1, a100)
    for i, (a, b) in enumerate(zip(one, many, strict=True)):
        assert b.weight_versions == pp - i and a.weight_versions == 1
        assert b.weights_bytes == pytest.approx((pp - i) * a.weights_bytes)
        assert (b.grads_bytes, b.optimizer_bytes, b.activations_bytes) == pytest.approx(
            (a.grads_bytes, a.optimizer_bytes, a.activations_bytes))
        assert b.total_bytes > a.total_bytes or i == pp - 1


def test_full_recompute_adds_one_rematerialised_block(gpt3: Model, a100: Accelerator) -> None:
    par = Parallelism(tp=8, recompute="full", sequence_parallel=True)
    trn = training(attention_kernel="unfused")
    got = memory_per_stage(gpt3, par, trn, 1, a100)[0].activations_bytes
    block_input = 2 * S * B * gpt3.hidden / 8  # the checkpoint kept per block
    block = per_layer(gpt3, tp=8, sequence_parallel=True)  # everything, while recomputed
    edges = output_activation_bytes(gpt3, par, trn) + S * B * gpt3.hidden / 8
    assert got == pytest.approx(96 * block_input + (block - block_input) + edges)


def test_buffers_and_reserve(gpt3: Model, a100: Accelerator) -> None:
    par = Parallelism(tp=8, pp=8, dp_bucket_mb=25)
    stages = memory_per_stage(gpt3, par, training(global_batch=64), 4, a100)
    act = 2 * S * B * gpt3.hidden  # one micro-batch sent or received, 16-bit
    assert stages[0].buffers_bytes == 2 * 25e6 + 2 * act
    assert stages[3].buffers_bytes == 2 * 25e6 + 4 * act
    s = stages[3]
    tensors = s.model_state_bytes + s.activations_bytes + s.buffers_bytes
    assert s.reserve_bytes == pytest.approx(
        RUNTIME_CONTEXT_BYTES + FRAGMENTATION_FRACTION * tensors
    )


def test_zero3_buffers_hold_two_gathered_blocks_or_one_without_prefetch(
    gpt3: Model, a100: Accelerator
) -> None:
    def buffers(prefetch: bool | str) -> float:
        par = Parallelism(tp=8, pp=1, zero=3, dp_bucket_mb=25, prefetch_weights=prefetch)
        return memory_per_stage(gpt3, par, training(), 8, a100)[0].buffers_bytes

    # The largest unit (a block, the embedding or the LM head) in 16-bit weights.
    unit = 2 * max(layer_params_per_device(gpt3, 8), embedding_params_per_device(gpt3, 8),
                   head_params_per_device(gpt3, 8, 1))
    assert buffers(False) == pytest.approx(2 * 25e6 + unit, rel=1e-12)
    assert buffers(True) == pytest.approx(2 * 25e6 + 2 * unit, rel=1e-12)
    assert buffers("forward") == buffers(True)  # the forward holds two


def test_selene_gpt3_template_fits_and_stage_0_is_the_peak() -> None:
    sc = load_scenario("selene-gpt3")
    stages = memory_per_stage(
        sc.model, sc.parallelism, sc.training, sc.dp, sc.system.node.accelerator
    )
    assert len(stages) == 8 and all(s.fits for s in stages)
    assert peak_stage(stages).stage == 0
    gb = stages[0].as_gb()
    assert gb["capacity_gb"] == 80 and gb["fits"] is True
    parts = ["weights", "grads", "optimizer", "activations", "buffers", "reserve"]
    assert gb["total_gb"] == pytest.approx(sum(gb[f"{p}_gb"] for p in parts))


def test_a_model_that_does_not_fit_is_a_result(gpt3: Model, a100: Accelerator) -> None:
    stages = memory_per_stage(gpt3, Parallelism(), training(global_batch=8), 1, a100)
    assert stages[0].fits is False
    assert stages[0].as_gb()["total_gb"] > 16 * 175


def test_a_layout_that_cannot_split_is_a_user_error(gpt3: Model, a100: Accelerator) -> None:
    with pytest.raises(UserError, match="global_batch"):
        memory_per_stage(gpt3, Parallelism(micro_batch=3), training(global_batch=64), 1, a100)
    with pytest.raises(UserError, match="layers"):
        memory_per_stage(gpt3, Parallelism(pp=5), training(), 1, a100)


# ---------------------------------------------------------------- properties

DIVISORS = [1, 2, 4, 8]


@settings(max_examples=40, deadline=None)
@given(
    heads=st.sampled_from([8, 16, 32]),
    head_dim=st.sampled_from([64, 128]),
    kv_heads=st.sampled_from([1, 2, 8]),
    swiglu=st.booleans(),
    tied=st.booleans(),
    vocab=st.integers(1000, 60000),
    t_low=st.sampled_from(DIVISORS),
    factor=st.sampled_from([1, 2, 4]),
    pp=st.sampled_from([1, 2, 4]),
    stage_pick=st.integers(0, 3),
)
def test_more_tp_never_increases_model_state(
    heads, head_dim, kv_heads, swiglu, tied, vocab, t_low, factor, pp, stage_pick
) -> None:
    hidden = heads * head_dim
    model = Model(
        name="m",
        layers=8,
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        ffn_hidden=4 * hidden,
        vocab=vocab,
        activation="swiglu" if swiglu else "gelu",
        tied_embeddings=tied,
    )
    stage = stage_pick % pp
    assert stage_params(model, t_low * factor, pp, stage) <= stage_params(model, t_low, pp, stage)


@settings(max_examples=40, deadline=None)
@given(
    zero=st.integers(0, 2),
    dp=st.sampled_from([1, 2, 8, 64]),
    tp=st.sampled_from([1, 5, 25]),
    precision=st.sampled_from(["bf16", "fp32"]),
)
def test_higher_zero_stage_never_increases_model_state(zero, dp, tp, precision) -> None:
    accel = load_spec("accelerators", "a100-sxm4-80gb")
    trn = Training(global_batch=64 * 64, seq_len=1024, precision=precision)

    def state(z: int) -> float:
        par = Parallelism(tp=tp, pp=2, zero=z)
        return sum(s.model_state_bytes for s in memory_per_stage(GPT2_XL, par, trn, dp, accel))

    assert state(zero + 1) <= state(zero)


@settings(max_examples=60, deadline=None)
@given(
    parts=st.lists(st.floats(0, 1e11), min_size=6, max_size=6),
    capacity=st.floats(1, 1e12),
)
def test_fits_is_total_within_capacity(parts: list[float], capacity: float) -> None:
    mem = StageMemory(0, 1, 1, *parts, in_flight_microbatches=1, capacity_bytes=capacity)
    assert mem.total_bytes == pytest.approx(sum(parts))
    assert mem.fits == (mem.total_bytes <= capacity)
