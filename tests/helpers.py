"""Shared test helpers: small inline scenarios and toy cost models."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

from llmsim import load_scenario
from llmsim.costs.host_issue import HostIssue
from llmsim.specs import Scenario
from llmsim.workload import EXTRA_OP_PREFIXES

TINY_MODEL = {
    "name": "tiny-test",
    "layers": 8,
    "hidden": 512,
    "heads": 8,
    "ffn_hidden": 2048,
    "vocab": 1024,
    "max_seq_len": 1024,
}


def tiny_raw() -> dict[str, Any]:
    """The raw mapping of a tiny GPT on one Selene node, as a scenario file would hold it."""
    return {
        "name": "tiny",
        "system": "selene",
        "nodes": 1,
        "model": dict(TINY_MODEL),
        "parallelism": {"tp": 2, "pp": 4, "dp": "auto", "schedule": "1f1b"},
        "training": {"global_batch": 16, "seq_len": 512, "precision": "bf16", "tokens": 1e9},
    }


def make_scenario(**overrides: Any) -> Scenario:
    """A tiny GPT on ``nodes`` Selene nodes; ``overrides`` are dotted ``--set`` keys."""
    return load_scenario(tiny_raw(), {k.replace("__", "."): v for k, v in overrides.items()})


class LayerOnlyCosts:
    """Prices transformer-block ops by FLOPs and bytes; extras and communication are free.

    With it every stage does the same work, so pipeline bubbles follow the closed forms.
    """

    host_issue = HostIssue(0.0, 0.0)  # no host queue: each op starts when the one before ends

    def __init__(self, flops_per_s: float = 1e14, bytes_per_s: float = 1e12) -> None:
        self.flops_per_s, self.bytes_per_s = flops_per_s, bytes_per_s

    def compute_s(self, op: Any) -> float:
        if op.name.startswith(EXTRA_OP_PREFIXES) or op.phase == "O":
            return 0.0
        return op.flops / self.flops_per_s + op.bytes / self.bytes_per_s

    def comm_s(self, op: Any) -> float:
        return 0.0


ROOT = Path(__file__).parents[1]
"""The repository's root."""


def load_script(relative: str, name: str | None = None) -> ModuleType:
    """A script of the repository that is not part of the package (``benchmarks/x.py``,
    ``docs/hooks/y.py``), imported as a module."""
    path = ROOT / relative
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
