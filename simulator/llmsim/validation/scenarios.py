"""A validation run as an llmsim scenario: its system, model, layout and training."""

from __future__ import annotations

import math
import re
from typing import Any

from llmsim import catalog
from llmsim.errors import UserError
from llmsim.loader import load_scenario, read_yaml
from llmsim.optimizer import grad_bytes_per_param
from llmsim.partition import stage_layers
from llmsim.specs import Model, Parallelism, Scenario
from llmsim.validation.runs import Run


def _int(text: str) -> int | None:
    m = re.match(r"\s*(\d+)", text or "")
    return int(m.group(1)) if m else None


def base_vocab(run: Run) -> int:
    """The vocabulary before padding: the row's (``32K`` = 32·``vocab_k``) or the chosen one."""
    text = run.row["vocab"].strip()
    m = re.fullmatch(r"(\d+)K", text)
    if m:
        return int(m.group(1)) * int(run.value("vocab_k"))
    return _int(text) or int(run.value("model.vocab"))


def padded_vocab(vocab: int, multiple: int, tp: int) -> int:
    """Megatron-LM's padding: up to a multiple of ``multiple·tp``.

    ``_vocab_size_with_padding`` (megatron/tokenizer), ``--make-vocab-size-divisible-by``
    (default 128): e.g. GPT-2's 50,257 → 51,200 at tp 8, BLOOM's 250,680 → 250,880 at tp 4.
    """
    step = multiple * tp
    return -(-vocab // step) * step


def _system(run: Run) -> tuple[str | dict[str, Any], int]:
    """The catalog system (or an inline copy for part of a node or more nodes), and its
    devices per node."""
    name = run.value("system")
    nodes = run.value("system.nodes")
    retention = run.value("system.retention_state")
    raw = read_yaml(catalog.path_of("systems", name))
    dpn = int(raw["node"]["devices_per_node"])
    if run.gpus >= dpn and nodes is None and retention is None:
        return name, dpn
    if retention is not None:
        raw["retention_state"] = retention
    if nodes is not None:
        raw["nodes"] = nodes
    if run.gpus < dpn:
        # A few devices of an all-to-all switched node (NVSwitch) see the same per-device
        # bandwidth as the whole node: keep the tiers below the group, cut the next at it.
        tiers = raw["node"]["fabric"]
        kept = [t for t in tiers if t["devices"] < run.gpus]
        wider = next(t for t in tiers if t["devices"] >= run.gpus)
        raw["node"]["fabric"] = [*kept, {**wider, "devices": run.gpus}] if run.gpus > 1 else []
        raw["node"]["devices_per_node"] = dpn = run.gpus
    return raw, dpn


def _resolve(run: Run, key: str, value: Any, model: dict[str, Any], dp: int, precision: str) -> Any:
    """Turn the special values of choices.yaml into numbers."""
    if key == "parallelism.virtual_stages" and value == "one-layer-per-chunk":
        edges = {k: run.value(f"parallelism.{k}")
                 for k in ("first_stage_layers", "last_stage_layers")}
        return max(stage_layers(model["layers"], Parallelism(pp=int(run.row["pp"]), **edges)))
    if key == "parallelism.dp_bucket_mb" and value == "megatron-core":
        return max(40_000_000, 1_000_000 * dp) * 4 / 1e6
    if key == "parallelism.dp_bucket_mb" and value == "one-buffer":
        # One reduction of the device's whole gradient buffer: its parameters' share.
        per_device = Model.model_validate(model).params / (int(run.row["tp"]) * int(run.row["pp"]))
        grad_bytes = grad_bytes_per_param(precision, run.value("parallelism.grad_reduce_dtype"))
        return math.ceil(per_device * grad_bytes / 1e6)
    return value


def scenario_mapping(run: Run) -> dict[str, Any]:
    """The scenario of ``run`` as a mapping (inline model, system name or inline system)."""
    row = run.row
    tp, pp, dp = int(row["tp"]), int(row["pp"]), int(row["dp"])
    seq = int(row["seq_len"])
    model: dict[str, Any] = {
        "name": run.id.lower(),
        "description": row["model_name"],
        "layers": int(run.value("model.layers", row["layers"])),
        "hidden": int(row["hidden"]),
        "heads": int(row["heads"]),
        "kv_heads": _int(row["kv_heads"]) or int(row["heads"]),
        "ffn_hidden": int(row["ffn_hidden"]),
        "vocab": padded_vocab(base_vocab(run), int(run.value("vocab_pad_multiple")), tp),
        "max_seq_len": seq,
    }
    micro = _int(row["micro_batch"]) or run.value("parallelism.micro_batch")
    if micro is None:
        raise UserError(
            f"validation row {run.id}: micro_batch is neither stated nor chosen; "
            "add parallelism.micro_batch to choices.yaml"
        )
    par: dict[str, Any] = {"tp": tp, "pp": pp, "dp": dp, "micro_batch": int(micro)}
    cp = _int(row.get("cp", ""))
    if cp and cp > 1:  # the row's dp excludes cp, as Megatron-Core counts it
        par["cp"] = cp
    ep = _int(row.get("ep", "")) or 1
    if ep > 1:
        # Megatron-Core's expert-model-parallel size splits its data-parallel ranks (and
        # with expert_tp 1 its TP ranks too); llmsim's ep axis is the part outside TP.
        etp = int(run.value("parallelism.expert_tp") or tp)
        axis = ep * etp // tp
        if axis < 1 or ep * etp % tp or dp % axis:
            raise UserError(
                f"validation row {run.id}: ep {ep} with tp {tp}, expert_tp {etp} and dp {dp} "
                "is not a Megatron-Core layout (ep·expert_tp/tp must divide dp); fix the row"
            )
        par["ep"], par["dp"] = axis, dp // axis
    training: dict[str, Any] = {"global_batch": int(row["global_batch"]), "seq_len": seq}
    parts = {"model": model, "parallelism": par, "training": training}
    system_set: dict[str, Any] = {}
    precision = run.value("training.precision")
    # Model fields first: the special values of the others are derived from the model.
    for key, choice in sorted(run.choices.items(), key=lambda kv: not kv[0].startswith("model")):
        section, _, field = key.partition(".")
        if section in parts and key not in ("model.layers", "model.vocab"):
            parts[section][field] = _resolve(run, key, choice.value, model, dp, precision)
        elif section == "system_set":  # the catalog system with a documented change
            system_set[field] = choice.value
    system, per_node = _system(run)
    return {
        "name": run.id,
        "description": f"{run.source}: {row['model_name']} on {run.gpus} devices",
        "system": system,
        **({"system_set": system_set} if system_set else {}),
        "nodes": math.ceil(run.gpus / per_node),
        **parts,
    }


def scenario_for(run: Run) -> Scenario:
    """The validated llmsim scenario of ``run``."""
    return load_scenario(scenario_mapping(run))
