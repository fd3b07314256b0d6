"""The published runs llmsim is validated on, and the values chosen for each.

``workloads/validation/runs.csv`` holds the published rows; ``choices.yaml`` every value
a source leaves open, with the reason for the choice (:class:`Choice`), by source and by
group of rows.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmsim import catalog
from llmsim.errors import UserError
from llmsim.loader import read_yaml

METRICS = ("iteration_time_s", "tflops_per_gpu", "mfu")
"""Measured metrics the suite compares (``mfu`` in percent, as the sources print it)."""


def validation_dir() -> Path:
    """Folder holding ``runs.csv`` and ``choices.yaml`` (in the catalog, so wheels ship it)."""
    return catalog.catalog_root() / "workloads" / "validation"


@dataclass(frozen=True)
class Choice:
    """A value a source does not state (or states in words), and why it was chosen."""

    value: Any
    why: str


@dataclass(frozen=True)
class Run:
    """One published measurement, its source's row and the values chosen for it."""

    id: str
    source: str
    """Source prefix, e.g. ``NAR21-T1`` (the longest ``sources`` key the id starts with)."""
    row: Mapping[str, str]
    """The published row, as in ``runs.csv``."""
    choices: Mapping[str, Choice]
    target: bool
    """Whether the row belongs to the accuracy target set."""

    @property
    def metric(self) -> str:
        """What was measured: ``iteration_time_s``, ``tflops_per_gpu`` or ``mfu`` (%)."""
        return self.row["measured_metric"]

    @property
    def measured(self) -> float:
        """The published number, in the unit of :attr:`metric`."""
        return float(self.row["measured_value"])

    @property
    def gpus(self) -> int:
        """Devices of the run (A64FX: nodes)."""
        return int(self.row["gpus_total"])

    def value(self, key: str, default: Any = None) -> Any:
        """The chosen value of ``key``, or ``default``."""
        choice = self.choices.get(key)
        return default if choice is None else choice.value


# ---------------------------------------------------------------- loading


def _expand(ids: Iterable[str]) -> set[str]:
    """``["A-01..03", "B-7"]`` → ``{"A-01", "A-02", "A-03", "B-7"}`` (zero padding kept)."""
    out: set[str] = set()
    for item in ids:
        m = re.fullmatch(r"(.*?)(\d+)\.\.(\d+)", item)
        if not m:
            out.add(item)
            continue
        stem, lo, hi = m.group(1), m.group(2), m.group(3)
        out.update(f"{stem}{k:0{len(lo)}d}" for k in range(int(lo), int(hi) + 1))
    return out


def _choices(raw: Mapping[str, Any], where: str) -> dict[str, Choice]:
    out = {}
    for key, item in (raw or {}).items():
        if not isinstance(item, dict) or set(item) != {"value", "why"} or not item["why"]:
            raise UserError(f"{where}: choice {key!r} needs a value and a non-empty why")
        out[key] = Choice(item["value"], str(item["why"]))
    return out


def _read_rows() -> list[dict[str, str]]:
    with (validation_dir() / "runs.csv").open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def load_runs(subset: str | None = None, option: str = "--subset") -> list[Run]:
    """The validation rows (those whose id starts with ``subset``, if given); ``option``
    names the command-line option that gave ``subset`` when none matches."""
    spec = read_yaml(validation_dir() / "choices.yaml")
    sources: dict[str, Any] = spec["sources"]
    runs = []
    for row in _read_rows():
        rid = row["id"]
        if subset and not rid.startswith(subset):
            continue
        prefixes = [p for p in sources if rid.startswith(p)]
        if not prefixes:
            raise UserError(f"validation row {rid}: no source in choices.yaml; add its prefix")
        source = max(prefixes, key=len)
        choices = _choices(sources[source].get("choices"), source)
        target = bool(sources[source].get("target", False))
        for i, group in enumerate(spec.get("groups", [])):
            hit = (
                rid.startswith(group["match"])
                if "match" in group
                else (rid in _expand(group.get("ids", [])))
            )
            if hit:
                choices |= _choices(group.get("choices"), f"groups[{i}]")
                target = bool(group.get("target", target))
        runs.append(Run(rid, source, row, choices, target))
    if subset and not runs:
        known = sorted(spec["sources"])
        raise UserError(
            f"{option} {subset!r} matches no validation row; use a prefix such as "
            f"{', '.join(known)}"
        )
    return runs
