"""The bundled catalog of accelerators, collective libraries, systems, models and scenarios
(YAML files).

In a source checkout the files live in the top-level ``hardware/`` and ``workloads/``
folders; an installed wheel carries a copy under ``llmsim/_catalog``.
"""

from __future__ import annotations

import difflib
import re
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
MAX_NAME_BYTES = 100
"""Longest catalog name, bytes (a file name may have 255)."""
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


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


def is_name(name: str) -> bool:
    """Whether ``name`` names an existing catalog scenario (with or without ``.yaml``)."""
    stem = name.removesuffix(".yaml").removesuffix(".yml")
    return _valid_name(stem) and (folder("scenarios") / f"{stem}.yaml").is_file()


def _valid_name(stem: str) -> bool:
    """A name that stays inside its catalog folder: letters, digits, ``.``, ``_``, ``-``,
    at most :data:`MAX_NAME_BYTES` bytes, not starting with a dot."""
    return (len(stem.encode("utf-8", "replace")) <= MAX_NAME_BYTES
            and _NAME.fullmatch(stem) is not None and ".." not in stem)


def path_of(kind: Kind, name: str, field: str | None = None) -> Path:
    """The file of catalog entry ``name``, or a UserError listing close matches."""
    where = f"{field}: " if field else ""
    singular = kind.removesuffix("s")
    stem = name.removesuffix(".yaml").removesuffix(".yml")
    if not _valid_name(stem):
        shown = repr(name) if len(name) <= 40 else repr(name[:37]) + "..."
        raise UserError(
            f"{where}{shown} is not a {singular} name (a catalog name has letters, digits, "
            f"'.', '_' and '-', at most {MAX_NAME_BYTES} bytes); use a name that "
            f"`llmsim catalog {kind}` lists"
        )
    path = folder(kind) / f"{stem}.yaml"
    if path.is_file():
        return path
    known = names(kind)
    close = difflib.get_close_matches(stem, known, n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(repr(c) for c in close)}?" if close else (
        f"known {kind}: {', '.join(known)}"
    )
    raise UserError(
        f"{where}unknown {singular} {name!r}; {hint} (`llmsim catalog {kind}` lists them all)"
    )
