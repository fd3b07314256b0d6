"""Model specs from a Hugging Face ``config.json`` (the ``transformers`` configuration file).

Dense decoder families are read: ``llama``, ``mistral``, ``qwen2`` (and ``qwen3`` when the
head size is hidden/heads), ``gpt2`` and ``gpt_neox``. The field names are those of each
family's configuration class in ``transformers`` (``LlamaConfig``, ``MistralConfig``,
``Qwen2Config``, ``GPT2Config``, ``GPTNeoXConfig``), whose defaults fill a missing key.
Mixture-of-experts families are read too: ``mixtral`` (``MixtralConfig``: every layer's
MLP is ``num_local_experts`` experts of ``intermediate_size``, top ``num_experts_per_tok``),
``qwen2_moe`` (``Qwen2MoeConfig``: experts of ``moe_intermediate_size``, a shared expert
of ``shared_expert_intermediate_size`` read as that many expert widths, every
``decoder_sparse_step``-th layer) and ``deepseek_v2``/``deepseek_v3`` (``DeepseekV3Config``:
multi-head latent attention from ``q_lora_rank``, ``kv_lora_rank``, ``qk_nope_head_dim``,
``qk_rope_head_dim``, ``v_head_dim``; ``n_routed_experts`` of ``moe_intermediate_size``,
``n_shared_experts``, the first ``first_k_dense_replace`` layers dense, the router's
``scoring_func``). Other MoE families are refused. What llmsim cannot express is named in the
entry's ``notes``: Qwen2's biases on q, k and v only (llmsim's ``bias`` is all linear
layers or none, so they are left out), Mistral's sliding-window attention (priced as full
causal attention), GPT-NeoX's partial rotary embedding and parallel residual (neither
changes a parameter or a FLOP llmsim counts).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from llmsim.errors import UserError
from llmsim.safe_yaml import echo, read_text

_LLAMA_LIKE = ("llama", "mistral", "qwen2", "qwen3")
_MOE_READ = ("mixtral", "qwen2_moe", "deepseek_v2", "deepseek_v3")
_MOE = ("qwen3_moe", "dbrx", "jamba", "olmoe", "phimoe")
"""Mixture-of-experts families llmsim does not read (yet)."""
_GELU = ("gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast")


def read_config(path: str | Path) -> dict[str, Any]:
    """The JSON object of a ``config.json``; a UserError if it is not one."""
    path = Path(path)
    text = read_text(path, "Hugging Face config")
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise UserError(f"{echo(path.name)}: not valid JSON ({str(exc)[:80]}); give the "
                        "model's config.json as Hugging Face publishes it") from None
    if not isinstance(data, dict):
        raise UserError(f"{echo(path.name)}: expected a JSON object of settings, got "
                        f"{type(data).__name__}; give the model's config.json")
    return data


def _get(config: dict[str, Any], key: str, default: Any, where: str) -> Any:
    """``config[key]`` (or ``default``), checked to be a whole number when the default is."""
    value = config.get(key, default)
    if value is None:
        value = default
    if isinstance(default, int) and not isinstance(default, bool) and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise UserError(f"{where}: {key} = {echo(value)} is not a positive whole number; "
                        "correct it in the config")
    return value


def _name(config: dict[str, Any], path: Path) -> str:
    """A catalog-style name: the repository name of ``_name_or_path``, else the file's
    stem, or its folder's name for a file called ``config.json``."""
    stem = path.resolve().parent.name if path.name == "config.json" else path.stem
    raw = str(config.get("_name_or_path") or stem or "hf-model")
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", raw.rstrip("/").split("/")[-1]).strip("-.")
    return (name or "hf-model")[:100].lower()


def model_fields(path: str | Path, name: str | None = None) -> dict[str, Any]:
    """The fields of an llmsim ``Model`` read from the ``config.json`` at ``path``."""
    path = Path(path)
    config = read_config(path)
    where = echo(path.name).strip("'\"")
    kind = config.get("model_type")
    if kind in _MOE or (kind not in _MOE_READ and (config.get("num_local_experts")
                                                   or config.get("n_routed_experts"))):
        raise UserError(f"{where}: model_type {echo(kind)} is a mixture-of-experts family "
                        "llmsim does not read; it reads mixtral, qwen2_moe and deepseek_v2/v3")
    notes: list[str] = []
    if kind in _LLAMA_LIKE or kind in _MOE_READ:
        hidden = _get(config, "hidden_size", 4096, where)
        heads = _get(config, "num_attention_heads", 32, where)
        head_dim = config.get("head_dim")
        if head_dim is not None and not (isinstance(head_dim, int) and head_dim > 0):
            raise UserError(f"{where}: head_dim = {echo(head_dim)} is not a positive whole "
                            "number; fix it or remove it")
        act = str(config.get("hidden_act", "silu"))
        if act not in ("silu", "swish"):
            raise UserError(f"{where}: hidden_act = {echo(act)}; llmsim prices SwiGLU (silu) "
                            "for this family, so give a silu model's config")
        fields = {
            "layers": _get(config, "num_hidden_layers", 32, where),
            "hidden": hidden,
            "heads": heads,
            "kv_heads": _get(config, "num_key_value_heads", heads, where),
            "ffn_hidden": _get(config, "intermediate_size", 11008, where),
            "vocab": _get(config, "vocab_size", 32000, where),
            "activation": "swiglu",
            "tied_embeddings": bool(config.get("tie_word_embeddings", False)),
            "position_embedding": "rope",
            "norm": "rmsnorm",
            "bias": bool(config.get("attention_bias", False) and config.get("mlp_bias", False)),
            "max_seq_len": _get(config, "max_position_embeddings", 2048, where),
        }
        if head_dim is not None and heads * head_dim != hidden:
            fields["kv_channels"] = head_dim  # heads of head_dim, not hidden/heads, wide
        if kind == "qwen2":
            kv = fields["kv_heads"] * hidden // heads
            notes.append(f"q, k, v biases ({hidden + 2 * kv:,} parameters a layer) not "
                         "counted: llmsim's bias switch covers every linear layer")
        elif config.get("attention_bias") and not fields["bias"]:
            notes.append("attention biases (attention_bias: true, mlp_bias: false) not "
                         "counted: llmsim's bias switch covers every linear layer")
        if kind == "qwen3":
            notes.append("the q and k RMSNorms of each head (2·head_dim parameters a layer) "
                         "not counted")
        if kind == "mistral" and config.get("sliding_window"):
            notes.append(f"sliding-window attention ({config['sliding_window']} tokens) "
                         "priced as full causal attention")
    elif kind == "gpt2":
        hidden = _get(config, "n_embd", 768, where)
        act = str(config.get("activation_function", "gelu_new"))
        if act not in _GELU:
            raise UserError(f"{where}: activation_function = {echo(act)}; llmsim prices GeLU "
                            "for GPT-2, so give a GeLU model's config")
        fields = {
            "layers": _get(config, "n_layer", 12, where),
            "hidden": hidden,
            "heads": _get(config, "n_head", 12, where),
            "ffn_hidden": _get(config, "n_inner", 4 * hidden, where),
            "vocab": _get(config, "vocab_size", 50257, where),
            "activation": "gelu",
            "tied_embeddings": bool(config.get("tie_word_embeddings", True)),
            "position_embedding": "learned",
            "norm": "layernorm",
            "bias": True,
            "max_seq_len": _get(config, "n_positions", 1024, where),
        }
    elif kind == "gpt_neox":
        act = str(config.get("hidden_act", "gelu"))
        if act not in _GELU:
            raise UserError(f"{where}: hidden_act = {echo(act)}; llmsim prices GeLU for "
                            "GPT-NeoX, so give a GeLU model's config")
        fields = {
            "layers": _get(config, "num_hidden_layers", 44, where),
            "hidden": _get(config, "hidden_size", 6144, where),
            "heads": _get(config, "num_attention_heads", 64, where),
            "ffn_hidden": _get(config, "intermediate_size", 24576, where),
            "vocab": _get(config, "vocab_size", 50432, where),
            "activation": "gelu",
            "tied_embeddings": bool(config.get("tie_word_embeddings", False)),
            "position_embedding": "rope",
            "norm": "layernorm",
            "bias": bool(config.get("attention_bias", True)),
            "max_seq_len": _get(config, "max_position_embeddings", 2048, where),
        }
        if config.get("rotary_pct", 0.25) != 1:
            notes.append(f"rotary embedding on {config.get('rotary_pct', 0.25):g} of each "
                         "head, priced as rope (no parameters either way)")
    else:
        raise UserError(f"{where}: model_type {echo(kind)} is not one llmsim reads; it reads "
                        "llama, mistral, qwen2, qwen3, gpt2, gpt_neox, mixtral, qwen2_moe "
                        "and deepseek_v2/v3 configs")
    if kind in _MOE_READ:
        fields.update(_experts(config, str(kind), where, notes))
    label = name or _name(config, path)
    return {
        "name": label,
        "description": f"{label} (from a Hugging Face config.json, model_type {kind})",
        **fields,
        "sources": {"architecture": f"Hugging Face config.json read by llmsim "
                                    f"({path.name}, model_type {kind})"},
        "notes": "; ".join(notes),
    }


def _experts(config: dict[str, Any], kind: str, where: str,
             notes: list[str]) -> dict[str, Any]:
    """The ``moe`` (and DeepSeek's ``mla``) fields of an MoE family's config."""
    if kind == "mixtral":
        return {"moe": {"experts": _get(config, "num_local_experts", 8, where),
                        "top_k": _get(config, "num_experts_per_tok", 2, where),
                        "ffn_hidden": _get(config, "intermediate_size", 14336, where),
                        "router": "softmax"}}
    if kind == "qwen2_moe":
        width = _get(config, "moe_intermediate_size", 1408, where)
        shared = int(config.get("shared_expert_intermediate_size") or 0)
        if shared % width:
            raise UserError(f"{where}: shared_expert_intermediate_size = {shared} is not a "
                            f"multiple of moe_intermediate_size = {width}; llmsim's shared "
                            "experts are each one expert wide")
        if config.get("mlp_only_layers"):
            raise UserError(f"{where}: mlp_only_layers = {echo(config['mlp_only_layers'])}; "
                            "llmsim places dense layers first or every n-th only")
        notes.append("the shared expert's sigmoid gate (hidden parameters a layer) not "
                     "counted")
        return {"moe": {"experts": _get(config, "num_experts", 60, where),
                        "top_k": _get(config, "num_experts_per_tok", 4, where),
                        "ffn_hidden": width, "shared_experts": shared // width,
                        "layer_freq": _get(config, "decoder_sparse_step", 1, where),
                        "router": "softmax"}}
    if config.get("q_lora_rank") is None:
        raise UserError(f"{where}: q_lora_rank is null (queries without a low-rank "
                        "projection, as in DeepSeek-V2-Lite); llmsim's latent attention "
                        "needs one")
    mla = {key: _get(config, key, 0, where) for key in
           ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
            "v_head_dim")}
    scoring = str(config.get("scoring_func", "softmax"))
    if scoring not in ("softmax", "sigmoid"):
        raise UserError(f"{where}: scoring_func = {echo(scoring)}; llmsim's routers are "
                        "softmax or sigmoid")
    return {"mla": mla,
            "mtp_depth": int(config.get("num_nextn_predict_layers") or 0),
            "moe": {"experts": _get(config, "n_routed_experts", 256, where),
                    "top_k": _get(config, "num_experts_per_tok", 8, where),
                    "ffn_hidden": _get(config, "moe_intermediate_size", 2048, where),
                    "shared_experts": int(config.get("n_shared_experts") or 0),
                    "layer_freq": _get(config, "moe_layer_freq", 1, where),
                    "first_dense_layers": int(config.get("first_k_dense_replace") or 0),
                    "router": scoring}}
