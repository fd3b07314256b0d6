"""Model specs from a Hugging Face ``config.json`` (the ``transformers`` configuration file).

Dense decoder families are read: ``llama``, ``mistral``, ``qwen2`` (and ``qwen3`` when the
head size is hidden/heads), ``gpt2`` and ``gpt_neox``. The field names are those of each
family's configuration class in ``transformers`` (``LlamaConfig``, ``MistralConfig``,
``Qwen2Config``, ``GPT2Config``, ``GPTNeoXConfig``), whose defaults fill a missing key.
Mixture-of-experts families (``mixtral``, ``qwen2_moe``, ``deepseek_v2``/``v3``) are refused,
as llmsim does not simulate experts yet. What llmsim cannot express is named in the
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
_MOE = ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3", "dbrx",
        "jamba", "olmoe", "phimoe")
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
    if kind in _MOE or config.get("num_local_experts") or config.get("n_routed_experts"):
        raise UserError(f"{where}: model_type {echo(kind)} is a mixture-of-experts model, "
                        "which llmsim does not simulate yet; give a dense model's config")
    notes: list[str] = []
    if kind in _LLAMA_LIKE:
        hidden = _get(config, "hidden_size", 4096, where)
        heads = _get(config, "num_attention_heads", 32, where)
        head_dim = config.get("head_dim")
        if head_dim is not None and heads * head_dim != hidden:
            raise UserError(f"{where}: head_dim = {echo(head_dim)} × num_attention_heads = "
                            f"{heads} ≠ hidden_size = {hidden}; llmsim's heads are "
                            "hidden/heads wide, so this model cannot be expressed yet")
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
                        "llama, mistral, qwen2, qwen3, gpt2 and gpt_neox configs")
    label = name or _name(config, path)
    return {
        "name": label,
        "description": f"{label} (from a Hugging Face config.json, model_type {kind})",
        **fields,
        "sources": {"architecture": f"Hugging Face config.json read by llmsim "
                                    f"({path.name}, model_type {kind})"},
        "notes": "; ".join(notes),
    }
