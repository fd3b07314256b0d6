"""Model spec: a decoder-only transformer (dense, or mixture-of-experts) and the sizes
derived from it."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, NonNegativeInt, PositiveFloat, PositiveInt, model_validator

from llmsim.specs._base import Name, Spec


class MoE(Spec):
    """Mixture-of-experts MLP: which layers route their tokens to experts, and how.

    A MoE layer replaces the dense MLP by ``experts`` routed expert MLPs (each of the
    model's ``activation``, width ``ffn_hidden``), of which a learned router picks
    ``top_k`` per token, plus ``shared_experts`` MLPs every token passes through
    (Shazeer et al. 2017; Lepikhin et al. 2021, GShard; Fedus et al. 2022, Switch;
    DeepSeek-AI 2024, DeepSeekMoE). Field names follow Megatron-Core's ``--num-experts``,
    ``--moe-router-topk``, ``--moe-ffn-hidden-size``, ``--moe-layer-freq`` and
    ``--moe-expert-capacity-factor``.
    """

    experts: PositiveInt
    """Routed experts per MoE layer."""
    top_k: PositiveInt
    """Routed experts each token is sent to."""
    ffn_hidden: PositiveInt
    """Inner width of one routed expert's MLP (per projection for SwiGLU)."""
    shared_experts: NonNegativeInt = 0
    """Experts every token passes through, each of ``ffn_hidden`` width (DeepSeekMoE)."""
    layer_freq: PositiveInt = 1
    """Every ``layer_freq``-th layer (after ``first_dense_layers``), from the first, is a
    MoE layer; 1: all of them (Megatron-Core ``--moe-layer-freq``)."""
    first_dense_layers: NonNegativeInt = 0
    """Leading layers that keep the dense MLP of ``model.ffn_hidden`` (DeepSeek-V3: 3)."""
    capacity_factor: PositiveFloat | None = None
    """Tokens an expert takes at most, as a multiple of its mean load; the excess is
    dropped and every expert's input padded to that capacity (Megatron-Core
    ``--moe-expert-capacity-factor`` with ``--moe-pad-expert-input-to-capacity``). None:
    dropless, every expert takes what it is routed, the busiest setting the pace."""
    router: Literal["softmax", "sigmoid"] = "softmax"
    """Router score function: softmax over the experts then top-k (Mixtral), or a sigmoid
    per expert with a per-expert selection bias (DeepSeek-V3's auxiliary-loss-free
    balancing, which adds ``experts`` bias parameters)."""

    def is_moe_layer(self, layer: int) -> bool:
        """Whether transformer layer ``layer`` (0-based) has a MoE MLP."""
        after = layer - self.first_dense_layers
        return after >= 0 and after % self.layer_freq == 0

    def moe_layers(self, layers: int) -> int:
        """MoE layers among the first ``layers`` layers: every ``layer_freq``-th from
        ``first_dense_layers`` on, ⌈(layers − first_dense_layers) / layer_freq⌉ (counted,
        not looped: a model may declare up to 2^53 layers before the scenario refuses it)."""
        return max(-(-(layers - self.first_dense_layers) // self.layer_freq), 0)


class MLA(Spec):
    """Multi-head latent attention (DeepSeek-AI 2024, DeepSeek-V2 §2.1): queries and
    keys/values pass through low-rank latents, and part of each query/key head carries
    the rotary position (decoupled RoPE). Names follow the Hugging Face configuration."""

    q_lora_rank: PositiveInt
    """Width of the query latent."""
    kv_lora_rank: PositiveInt
    """Width of the joint key/value latent."""
    qk_nope_head_dim: PositiveInt
    """Per-head query/key width without position."""
    qk_rope_head_dim: PositiveInt
    """Per-head query/key width with the rotary position (the key's part shared by all
    heads)."""
    v_head_dim: PositiveInt
    """Per-head value width."""


class Model(Spec):
    """A GPT/Llama-style decoder. ``params`` is derived, never typed in."""

    name: Name
    """Catalog name, e.g. ``gpt3-175b``."""
    description: str = ""
    """Human-readable name."""
    layers: PositiveInt
    """Transformer blocks."""
    hidden: PositiveInt
    """Model width h."""
    heads: PositiveInt
    """Attention (query) heads."""
    kv_heads: PositiveInt | None = None
    """Key/value heads (grouped-query attention); defaults to ``heads``."""
    kv_channels: PositiveInt | None = None
    """Width of one attention head when it is not ``hidden / heads`` (Megatron-Core
    ``--kv-channels``, Hugging Face ``head_dim``; Qwen3: 128 with hidden 4,096 and 64
    heads): the query and output projections are then ``heads·kv_channels`` wide. None:
    ``hidden / heads``."""
    ffn_hidden: PositiveInt
    """MLP inner width f (per projection for SwiGLU)."""
    vocab: PositiveInt
    """Vocabulary size (as trained, padded if the source pads)."""
    activation: Literal["gelu", "swiglu"] = "gelu"
    """MLP: GeLU (two matrices) or SwiGLU (three)."""
    tied_embeddings: bool = False
    """Whether the LM head shares the input embedding matrix."""
    position_embedding: Literal["learned", "rope", "alibi"] = "learned"
    """Learned absolute positions (GPT) add max_seq_len·h parameters; RoPE and ALiBi (BLOOM)
    add none. With unfused attention ALiBi's bias is copied into the scores before their
    GEMM adds to them (:func:`llmsim.workload.softmax.alibi_scores`); a flash kernel adds
    it in registers, at no priced cost."""
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    """Normalisation: LayerNorm (scale and bias) or RMSNorm (scale only)."""
    bias: bool = True
    """Whether linear layers carry biases (GPT-3 yes, Llama no)."""
    max_seq_len: PositiveInt = 2048
    """Longest trained context, tokens."""
    moe: MoE | None = None
    """Mixture-of-experts MLP (None: every layer dense)."""
    mla: MLA | None = None
    """Multi-head latent attention instead of (grouped-query) multi-head attention."""
    mtp_depth: NonNegativeInt = 0
    """Multi-token prediction modules trained beside the model (DeepSeek-V3 report
    §2.2, its ``D``; Megatron-Core ``--mtp-num-layers``; Hugging Face
    ``num_nextn_predict_layers``): module ``k`` predicts token ``i + k + 1`` from the
    previous depth's hidden state and the embedding of token ``i + k`` through two
    RMSNorms, a ``2h → h`` projection and one more transformer block, then the shared
    LM head and a second cross-entropy (:mod:`llmsim.mtp`). 0: none. DeepSeek-V3: 1."""
    sources: dict[str, str] = Field(default_factory=dict)
    """Where the architecture comes from."""
    notes: str = ""
    """Caveats, in prose."""

    @model_validator(mode="after")
    def _check(self) -> Model:
        if self.moe is not None and self.moe.top_k > self.moe.experts:
            raise ValueError(
                f"model.moe.top_k: {self.moe.top_k} is more than the {self.moe.experts} "
                "experts; choose at most moe.experts"
            )
        if self.moe is not None and self.moe.moe_layers(self.layers) == 0:
            raise ValueError(
                f"model.moe.first_dense_layers: {self.moe.first_dense_layers} leaves no MoE "
                f"layer among the {self.layers}; lower it or remove model.moe"
            )
        if self.kv_channels is None and self.hidden % self.heads:
            raise ValueError(
                f"model.heads: {self.heads} does not divide hidden={self.hidden}; "
                "choose heads so that hidden/heads is a whole head size"
            )
        if self.heads % self.n_kv_heads:
            raise ValueError(
                f"model.kv_heads: {self.n_kv_heads} does not divide heads={self.heads}; "
                "use a divisor of heads"
            )
        return self

    @property
    def n_kv_heads(self) -> int:
        """Key/value heads, resolved."""
        return self.kv_heads or self.heads

    @property
    def head_dim(self) -> int:
        """Size of one attention head: ``kv_channels``, else ``hidden / heads``."""
        return self.kv_channels or self.hidden // self.heads

    @property
    def q_dim(self) -> int:
        """Width of the query projection and of the attention output, ``heads·head_dim``
        (``hidden`` unless ``kv_channels`` says otherwise)."""
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of the key (or value) projection."""
        return self.n_kv_heads * self.head_dim

    @property
    def mlp_matrices(self) -> int:
        """Weight matrices in the MLP: 2 for GeLU, 3 for SwiGLU."""
        return 3 if self.activation == "swiglu" else 2

    @property
    def params_per_layer(self) -> int:
        """Parameters of one dense block: attention, MLP, norms (and biases)."""
        h, f, kv, q = self.hidden, self.ffn_hidden, self.kv_dim, self.q_dim
        attn = h * (q + 2 * kv) + q * h if self.mla is None else self.mla_params
        mlp = self.mlp_matrices * h * f
        norms = 2 * h * (2 if self.norm == "layernorm" else 1)
        biases = (q + 2 * kv) + h + (self.mlp_matrices - 1) * f + h if self.bias else 0
        return attn + mlp + norms + biases

    @property
    def mla_params(self) -> int:
        """Weights of one MLA block (0 without MLA): query down and up projections, the
        joint key/value down projection with the shared rotary key, the key/value up
        projection, the two latents' RMSNorms and the output projection (DeepSeek-V2
        §2.1.2–2.1.3, eqs. 9–14; ``modeling_deepseek.py`` ``DeepseekV3Attention``)."""
        a = self.mla
        if a is None:
            return 0
        h, n = self.hidden, self.heads
        q_head = a.qk_nope_head_dim + a.qk_rope_head_dim
        return (h * a.q_lora_rank + a.q_lora_rank + a.q_lora_rank * n * q_head
                + h * (a.kv_lora_rank + a.qk_rope_head_dim) + a.kv_lora_rank
                + a.kv_lora_rank * n * (a.qk_nope_head_dim + a.v_head_dim)
                + n * a.v_head_dim * h)

    @property
    def expert_params(self) -> int:
        """Weights of one expert MLP (routed or shared; 0 for a dense model)."""
        if self.moe is None:
            return 0
        f = self.moe.ffn_hidden
        return self.mlp_matrices * self.hidden * f + (
            ((self.mlp_matrices - 1) * f + self.hidden) if self.bias else 0)

    @property
    def router_params(self) -> int:
        """Router of one MoE layer: an h × experts matrix, and with the sigmoid router the
        experts' selection biases (0 for a dense model, and for one expert, which every
        token takes with weight 1: there is nothing to route)."""
        if self.moe is None or self.moe.experts == 1:
            return 0
        e = self.moe.experts
        return self.hidden * e + (e if self.moe.router == "sigmoid" else 0)

    @property
    def params_per_moe_layer(self) -> int:
        """Parameters of one MoE block: the dense block's attention and norms, the router,
        every routed expert and the shared ones (0 for a dense model)."""
        if self.moe is None:
            return 0
        dense_mlp = self.mlp_matrices * self.hidden * self.ffn_hidden + (
            ((self.mlp_matrices - 1) * self.ffn_hidden + self.hidden) if self.bias else 0)
        experts = self.moe.experts + self.moe.shared_experts
        return self.params_per_layer - dense_mlp + self.router_params + experts * self.expert_params

    @property
    def moe_layer_count(self) -> int:
        """MoE layers (0 for a dense model)."""
        return self.moe.moe_layers(self.layers) if self.moe is not None else 0

    @property
    def active_params_per_token(self) -> int:
        """Parameters one token's forward pass uses: every weight except the routed
        experts it is not sent to (``top_k`` of ``experts``), embedding and head included.
        Equals :attr:`params` for a dense model."""
        if self.moe is None:
            return self.params
        idle = (self.moe.experts - self.moe.top_k) * self.expert_params
        return self.params - self.moe_layer_count * idle

    def mtp_is_moe(self, module: int) -> bool:
        """Whether multi-token prediction module ``module`` (0-based) has a MoE MLP: the
        block is the model's layer ``layers + module`` (DeepSeek-V3's weights hold it as
        ``model.layers.61``, a MoE layer like every layer after the first three)."""
        return self.moe is not None and self.moe.is_moe_layer(self.layers + module)

    @property
    def mtp_module_extra_params(self) -> int:
        """Weights of one multi-token prediction module besides its transformer block:
        the ``2h × h`` projection (``eh_proj``) and three norms, of the hidden state, of
        the embedding and before the shared head (``hnorm``, ``enorm``,
        ``shared_head.norm`` of DeepSeek-V3's ``README_WEIGHTS.md``); the embedding and
        the LM head are the model's own."""
        return 2 * self.hidden * self.hidden + 3 * self.hidden * (
            2 if self.norm == "layernorm" else 1)

    @property
    def mtp_params(self) -> int:
        """Weights of the ``mtp_depth`` multi-token prediction modules, not counted in
        :attr:`params` (DeepSeek-V3's 671 B are the main model's; its weights'
        ``README_WEIGHTS.md`` gives the module 11.5 B unique parameters, which is its
        block, 11.51 B here, the projection's 0.10 B left out)."""
        return sum((self.params_per_moe_layer if self.mtp_is_moe(k) else self.params_per_layer)
                   + self.mtp_module_extra_params for k in range(self.mtp_depth))

    @property
    def embedding_params(self) -> int:
        """Input embedding (and learned positions)."""
        pos = self.max_seq_len * self.hidden if self.position_embedding == "learned" else 0
        return self.vocab * self.hidden + pos

    @property
    def head_params(self) -> int:
        """Final norm plus LM head (zero extra matrix if tied)."""
        final_norm = self.hidden * (2 if self.norm == "layernorm" else 1)
        return final_norm + (0 if self.tied_embeddings else self.vocab * self.hidden)

    @property
    def params(self) -> int:
        """Total parameters."""
        moe = self.moe_layer_count
        return ((self.layers - moe) * self.params_per_layer + moe * self.params_per_moe_layer
                + self.embedding_params + self.head_params)
