"""Model spec: a dense decoder-only transformer and the sizes derived from it."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveInt, model_validator

from llmsim.specs._base import Spec


class Model(Spec):
    """A GPT/Llama-style decoder. ``params`` is derived, never typed in."""

    name: str
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
    ffn_hidden: PositiveInt
    """MLP inner width f (per projection for SwiGLU)."""
    vocab: PositiveInt
    """Vocabulary size (as trained, padded if the source pads)."""
    activation: Literal["gelu", "swiglu"] = "gelu"
    """MLP: GeLU (two matrices) or SwiGLU (three)."""
    tied_embeddings: bool = False
    """Whether the LM head shares the input embedding matrix."""
    position_embedding: Literal["learned", "rope"] = "learned"
    """Learned absolute positions (GPT) add max_seq_len·h parameters; RoPE adds none."""
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    """Normalisation: LayerNorm (scale and bias) or RMSNorm (scale only)."""
    bias: bool = True
    """Whether linear layers carry biases (GPT-3 yes, Llama no)."""
    max_seq_len: PositiveInt = 2048
    """Longest trained context, tokens."""
    moe_experts: PositiveInt | None = None
    """Experts per MoE layer (not supported yet)."""
    moe_top_k: PositiveInt | None = None
    """Experts per token (not supported yet)."""
    moe_ffn_hidden: PositiveInt | None = None
    """Expert MLP width (not supported yet)."""
    sources: dict[str, str] = Field(default_factory=dict)
    """Where the architecture comes from."""
    notes: str = ""
    """Caveats, in prose."""

    @model_validator(mode="after")
    def _check(self) -> Model:
        moe = {"moe_experts": self.moe_experts, "moe_top_k": self.moe_top_k,
               "moe_ffn_hidden": self.moe_ffn_hidden}
        given = [k for k, v in moe.items() if v is not None]
        if given:
            raise ValueError(
                f"model.{given[0]}: mixture-of-experts models are not supported yet; "
                "remove the moe_* fields to simulate the dense model"
            )
        if self.hidden % self.heads:
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
        """Size of one attention head."""
        return self.hidden // self.heads

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
        """Parameters of one block: attention, MLP, norms (and biases)."""
        h, f, kv = self.hidden, self.ffn_hidden, self.kv_dim
        attn = h * (h + 2 * kv) + h * h
        mlp = self.mlp_matrices * h * f
        norms = 2 * h * (2 if self.norm == "layernorm" else 1)
        biases = (h + 2 * kv) + h + (self.mlp_matrices - 1) * f + h if self.bias else 0
        return attn + mlp + norms + biases

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
        return self.layers * self.params_per_layer + self.embedding_params + self.head_params
