"""Parameter counts of the catalog models against published sizes and closed forms."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmsim.loader import load_spec
from llmsim.params import param_tensors
from llmsim.specs import Model

# Published sizes (billions) with a tolerance band for vocabulary padding and rounding.
PUBLISHED_RANGES_B = {
    "gpt3-175b": (174.0, 176.0),  # Brown et al. 2020
    "llama3-405b": (403.0, 407.0),  # Llama 3 paper, Table 3
    "llama3-70b": (69.5, 71.5),
    "llama3-8b": (7.9, 8.1),
    "llama2-70b": (68.5, 69.5),  # Touvron et al. 2023
    "megatron-1t": (1000.0, 1016.0),  # Narayanan et al. 2021, Table 1: 1,008 B
    "gpt2-1.5b": (1.5, 1.6),  # Radford et al. 2019: 1,542 M (1,558 M with the 50,257 vocab)
}
GPT3_SHAPED = ["gpt3-175b", "megatron-1t", "gpt2-1.5b", "tiny-gpt"]


def gpt3_closed_form(m: Model) -> int:
    """12·L·h²·(1 + 13/(12h) + (V+s)/(12·L·h)), in integers (Narayanan et al. 2021, Sec. 5.1).

    Per block: 12h² weights (QKV, output, two MLP matrices of 4h) + 13h (biases 9h, two
    LayerNorms 4h); plus the token (V·h) and learned position (s·h) embeddings, tied head.
    """
    L, h, V, s = m.layers, m.hidden, m.vocab, m.max_seq_len
    return 12 * L * h * h + 13 * L * h + (V + s) * h


@pytest.mark.parametrize(("name", "bounds"), PUBLISHED_RANGES_B.items())
def test_params_match_the_published_size(name: str, bounds: tuple[float, float]) -> None:
    low, high = bounds
    assert low <= load_spec("models", name).params / 1e9 <= high


@pytest.mark.parametrize("name", GPT3_SHAPED)
def test_gpt3_shaped_params_equal_the_closed_form(name: str) -> None:
    model = load_spec("models", name)
    closed = gpt3_closed_form(model)
    # The closed form leaves out the final LayerNorm (2h): that is the whole difference.
    assert model.params == closed + 2 * model.hidden
    assert abs(model.params - closed) / closed < 1e-3


@given(
    layers=st.integers(1, 128),
    head_dim=st.sampled_from([32, 64, 128]),
    heads=st.integers(1, 64),
    vocab=st.integers(1, 256_000),
    seq=st.integers(1, 32_768),
)
def test_closed_form_holds_for_any_gpt3_shape(
    layers: int, head_dim: int, heads: int, vocab: int, seq: int
) -> None:
    h = head_dim * heads
    model = Model(
        name="g",
        layers=layers,
        hidden=h,
        heads=heads,
        ffn_hidden=4 * h,
        vocab=vocab,
        max_seq_len=seq,
        tied_embeddings=True,
    )
    assert model.params == gpt3_closed_form(model) + 2 * h


@given(
    layers=st.integers(1, 128),
    kv_heads=st.sampled_from([1, 2, 4, 8]),
    group=st.integers(1, 16),
    ffn=st.integers(1, 60_000),
    vocab=st.integers(1, 256_000),
)
def test_llama_shape_counts_gqa_swiglu_untied(
    layers: int, kv_heads: int, group: int, ffn: int, vocab: int
) -> None:
    """Llama block: Q and O h², K and V h·kv_dim each, 3 SwiGLU matrices, 2 RMSNorms."""
    heads, head_dim = kv_heads * group, 128
    h, kv_dim = heads * head_dim, kv_heads * head_dim
    model = Model(
        name="l",
        layers=layers,
        hidden=h,
        heads=heads,
        kv_heads=kv_heads,
        ffn_hidden=ffn,
        vocab=vocab,
        activation="swiglu",
        tied_embeddings=False,
        position_embedding="rope",
        norm="rmsnorm",
        bias=False,
    )
    per_layer = 2 * h * h + 2 * h * kv_dim + 3 * h * ffn + 2 * h
    assert model.params == layers * per_layer + 2 * vocab * h + h


def test_gpt4_proxy_spends_3e25_flops_on_10t_tokens() -> None:
    """6·N·D (Kaplan et al. 2020) at ~10T tokens is the source documents' GPT-4 budget."""
    proxy = load_spec("models", "gpt4-proxy-dense")
    assert 6 * proxy.params * 10e12 == pytest.approx(3e25, rel=0.02)


def test_swiglu_proxy_matches_a_gelu_4h_model() -> None:
    """SwiGLU with f = 8h/3 has exactly the MLP parameters of GeLU with f = 4h."""
    proxy = load_spec("models", "gpt4-proxy-dense")
    gelu = proxy.model_copy(update={"activation": "gelu", "ffn_hidden": 4 * proxy.hidden})
    assert gelu.params == proxy.params


def test_parameter_tensors_in_megatron_layout() -> None:
    """What a per-tensor optimizer loops over: GPT-2 has 12 tensors a layer (four matrices
    and their biases, two layernorms of weight and bias), Llama 6 (no biases, RMSNorm);
    the first stage adds the embeddings, the last the final norm and its head."""
    gpt2 = load_spec("models", "gpt2-1.5b")
    assert param_tensors(gpt2, 48, True, True, stages=1) == 12 * 48 + 2 + 2  # tied head
    assert param_tensors(gpt2, 24, False, True, stages=2) == 12 * 24 + 2 + 1  # head copy
    llama = load_spec("models", "llama3-8b")
    assert param_tensors(llama, 32, True, True, stages=1) == 6 * 32 + 1 + 1 + 1


def test_qwen3_moe_heads_wider_than_hidden_over_heads():
    """Qwen3 Technical Report (arXiv:2505.09388, its MoE architecture table):
    Qwen3-235B-A22B holds 235 B
    parameters, 22 B activated; its 64 query heads are 128 wide on a 4,096-wide model
    (``kv_channels``), so each layer's attention holds h·(64·128 + 2·4·128) + 64·128·h
    weights. The per-head q/k RMSNorms (256 weights a layer) are not counted."""
    m = Model(name="qwen3-235b-a22b", layers=94, hidden=4096, heads=64, kv_heads=4,
              kv_channels=128, ffn_hidden=12288, vocab=151936, activation="swiglu",
              position_embedding="rope", norm="rmsnorm", bias=False,
              moe={"experts": 128, "top_k": 8, "ffn_hidden": 1536})
    assert (m.head_dim, m.q_dim, m.kv_dim) == (128, 8192, 512)
    assert m.params == pytest.approx(235e9, rel=1e-3)
    assert m.active_params_per_token == pytest.approx(22e9, rel=1e-2)
