"""The bundled catalog of accelerators, collective libraries, systems, models and scenarios
(YAML files).

In a source checkout the files live in the top-level ``hardware/`` and ``workloads/``
folders; an installed wheel carries a copy under ``llmsim/_catalog``.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Literal

from llmsim.errors import UserError

Kind = Literal["accelerators", "collectives", "systems", "models", "scenarios"]
KINDS: dict[str, tuple[str, str]] = {
    "accelerators": ("hardware", "accelerators"),
    "collectives": ("hardware", "collectives"),
    "systems": ("hardware", "systems"),
    "models": ("workloads", "models"),
    "scenarios": ("workloads", "scenarios"),
}


def catalog_root() -> Path:
    """The folder holding ``hardware/`` and ``workloads/``."""
    bundled = Path(__file__).parent / "_catalog"
    if (bundled / "hardware").is_dir():
        return bundled
    return Path(__file__).resolve().parents[2]


def folder(kind: Kind) -> Path:
    """The folder of one kind of catalog entry."""
    top, sub = KINDS[kind]
    return catalog_root() / top / sub


def names(kind: Kind) -> list[str]:
    """Sorted names of the entries of one kind (file stems)."""
    return sorted(p.stem for p in folder(kind).glob("*.yaml"))


def path_of(kind: Kind, name: str, field: str | None = None) -> Path:
    """The file of catalog entry ``name``, or a UserError listing close matches."""
    stem = name.removesuffix(".yaml").removesuffix(".yml")
    path = folder(kind) / f"{stem}.yaml"
    if path.is_file():
        return path
    known = names(kind)
    close = difflib.get_close_matches(stem, known, n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(repr(c) for c in close)}?" if close else (
        f"known {kind}: {', '.join(known)}"
    )
    where = f"{field}: " if field else ""
    singular = kind.removesuffix("s")
    raise UserError(
        f"{where}unknown {singular} {name!r}; {hint} (`llmsim catalog {kind}` lists them all)"
    )
