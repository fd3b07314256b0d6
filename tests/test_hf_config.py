"""Model specs from Hugging Face config.json files (tests/data/hf): the parameter counts
the released weights have, the catalog's own Llama 3 8B, scenarios and the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from test_cli import run_cli as cli

from llmsim import load_scenario, simulate
from llmsim.errors import UserError
from llmsim.hf_config import model_fields
from llmsim.loader import load_spec, read_yaml
from llmsim.specs import Model

HF = Path(__file__).parent / "data" / "hf"
# Published counts (tests/data/hf/README.md). Qwen2's q, k, v biases — hidden + 2·kv_dim
# = 896 + 2·128 per layer, 24 layers — are the part llmsim's all-or-nothing bias leaves out.
PUBLISHED = [("llama3-8b.json", 8_030_261_248, 0), ("mistral-7b-v0.1.json", 7_241_732_096, 0),
             ("gpt2.json", 124_439_808, 0), ("pythia-160m.json", 162_322_944, 0),
             ("qwen2.5-0.5b.json", 494_032_768, 24 * (896 + 2 * 128))]




@pytest.mark.parametrize(("file", "params", "left_out"), PUBLISHED)
def test_imported_models_have_the_published_parameter_count(file, params, left_out):
    model = Model(**model_fields(HF / file))
    assert model.params == params - left_out
    assert model.name == file.removesuffix(".json")
    assert model.sources["architecture"].startswith("Hugging Face config.json")
    assert ("q, k, v biases" in model.notes) == (left_out > 0)


def test_heads_wider_than_hidden_over_heads_are_kv_channels(tmp_path):
    """Qwen3's heads are head_dim wide, not hidden/heads: the query and output projections
    are heads·head_dim, so a layer holds h·(q + 2·kv) + q·h attention weights."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "qwen3", "hidden_size": 1024,
                                "num_attention_heads": 16, "num_key_value_heads": 8,
                                "head_dim": 128, "intermediate_size": 3072,
                                "num_hidden_layers": 2, "vocab_size": 1000}), encoding="utf-8")
    m = Model(**model_fields(path))
    assert (m.kv_channels, m.head_dim, m.q_dim, m.kv_dim) == (128, 128, 2048, 1024)
    h, q, kv = 1024, 2048, 1024
    assert m.params_per_layer == h * (q + 2 * kv) + q * h + 3 * h * 3072 + 2 * h


def test_llama3_8b_matches_the_catalog_entry():
    imported, catalog = Model(**model_fields(HF / "llama3-8b.json")), load_spec("models",
                                                                                 "llama3-8b")
    keep = ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "activation",
            "tied_embeddings", "position_embedding", "norm", "bias", "max_seq_len")
    assert {k: getattr(imported, k) for k in keep} == {k: getattr(catalog, k) for k in keep}


def test_family_details_are_named_in_the_notes():
    assert "sliding-window" in model_fields(HF / "mistral-7b-v0.1.json")["notes"]
    neox = model_fields(HF / "pythia-160m.json")
    assert neox["position_embedding"] == "rope" and "0.25" in neox["notes"]
    gpt2 = model_fields(HF / "gpt2.json")
    assert gpt2["tied_embeddings"] and gpt2["position_embedding"] == "learned"
    assert gpt2["ffn_hidden"] == 4 * 768  # n_inner absent: GPT2Config's 4·n_embd


def test_a_scenario_with_from_hf_relative_to_its_folder(tmp_path):
    (tmp_path / "config.json").write_bytes((HF / "pythia-160m.json").read_bytes())
    raw = {"name": "pythia", "system": "selene", "nodes": 1,
           "model": {"from_hf": "config.json", "max_seq_len": 4096},
           "parallelism": {"tp": 2, "pp": 4},
           "training": {"global_batch": 16, "seq_len": 2048, "tokens": 1e9}}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    scenario = load_scenario(path)
    assert scenario.model.name == tmp_path.name.lower()  # config.json: named by its folder
    assert scenario.model.max_seq_len == 4096 and scenario.model.params == 162_322_944
    assert simulate(scenario).step_time_s > 0


def test_import_hf_prints_or_writes_a_catalog_entry(tmp_path, capsys):
    code, out, err = cli(["catalog", "import-hf", str(HF / "mistral-7b-v0.1.json")], capsys)
    assert code == 0, err
    assert out.startswith("# mistral-7b-v0.1: 7.242 B parameters")
    assert Model(**yaml.safe_load(out)).params == 7_241_732_096
    entry = tmp_path / "m.yaml"
    code, out, err = cli(["catalog", "import-hf", str(HF / "gpt2.json"), "--name", "my-gpt2",
                          "--out", str(entry)], capsys)
    assert code == 0, err
    assert f"wrote {entry} (0.124 B parameters)" in out
    written = Model(**read_yaml(entry))
    assert written.name == "my-gpt2" and written.params == 124_439_808


@pytest.mark.parametrize(("content", "message"), [
    (json.dumps({"model_type": "dbrx", "num_local_experts": 16}), "mixture-of-experts"),
    (json.dumps({"model_type": "deepseek_v2", "q_lora_rank": None}), "q_lora_rank"),
    ("{not json", "not valid JSON"),
    ("[1, 2]", "expected a JSON object"),
    (json.dumps({"model_type": "t5"}), "not one llmsim reads"),
    (json.dumps({"model_type": "llama", "num_hidden_layers": -3}), "num_hidden_layers"),
    (json.dumps({"model_type": "qwen3", "hidden_size": 1024, "num_attention_heads": 16,
                 "head_dim": "wide"}), "head_dim"),
    ("[" * 100_000, "not valid JSON"),
])
def test_configs_llmsim_cannot_read_are_one_line_errors(content, message, tmp_path, capsys):
    path = HF / "mixtral-8x7b-v0.1.json"
    if content is not None:
        path = tmp_path / "config.json"
        path.write_text(content, encoding="utf-8")
    with pytest.raises(UserError, match=message):
        model_fields(path)
    code, _, err = cli(["catalog", "import-hf", str(path)], capsys)
    assert code == 2 and message in err and err.count("\n") == 1


def test_catalog_arguments_that_belong_to_import_hf(capsys):
    code, _, err = cli(["catalog", "models", "extra.json"], capsys)
    assert code == 2 and "import-hf only" in err
    code, _, err = cli(["catalog", "import-hf"], capsys)
    assert code == 2 and "give the config.json" in err


@pytest.mark.parametrize(("config", "catalog_name"), [
    ("mixtral-8x7b-v0.1.json", "mixtral-8x7b"),
    ("deepseek-v3.json", "deepseek-v3"),
])
def test_mixture_of_experts_configs_give_the_catalog_s_model(config, catalog_name):
    """Mixtral 8x7B and DeepSeek-V3 from their config.json: the same parameters, experts
    and latent attention as the catalog entries, whose numbers cite the papers (46.7 B and
    671 B)."""
    from llmsim.loader import validate
    from llmsim.specs import Model

    model = validate(Model, model_fields(HF / config), config)
    reference = load_spec("models", catalog_name)
    assert model.params == reference.params
    assert model.moe == reference.moe
    assert model.mla == reference.mla
