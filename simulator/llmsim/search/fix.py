"""The search's ``--fix FIELD=VALUE`` options, read and checked against the layout's
fields: a value no layout can take is one sentence naming it, before any enumeration."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from llmsim.errors import UserError
from llmsim.search.layout import LAYOUT_FIELDS, Layout
from llmsim.search.space import ASYNCHRONOUS, RECOMPUTE_VALUES, SCHEDULES

__all__ = ["parse_fix"]


def parse_fix(items: list[str]) -> dict[str, Any]:
    """``["parallelism.tp=8", "nodes=64"]`` → ``{"tp": 8, "nodes": 64}``, checked against
    the layout's fields."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        name = key.strip().removeprefix("parallelism.").removeprefix("training.")
        if not sep or name not in LAYOUT_FIELDS:
            raise UserError(
                f"--fix: {item!r} is not FIELD=VALUE with FIELD one of "
                f"{', '.join(LAYOUT_FIELDS)}; e.g. --fix parallelism.tp=8")
        out[name] = _parse_value(name, raw.strip())
    return out


def _parse_value(name: str, raw: str) -> Any:
    kind = {f.name: f.type for f in fields(Layout)}[name]
    if kind == "bool":
        if raw.lower() not in ("true", "false", "1", "0"):
            raise UserError(f"--fix: {name}={raw!r} must be true or false")
        return raw.lower() in ("true", "1")
    if kind == "int":
        try:
            value = int(raw)
        except ValueError:
            raise UserError(f"--fix: {name}={raw!r} must be a whole number") from None
        least = 0 if name in ("zero", "parameter_servers") else 1
        if value < least:
            raise UserError(f"--fix: {name}={value} must be {least} or more")
        if name == "zero" and value > 3:
            raise UserError(f"--fix: zero={value} is not a ZeRO stage; use 0, 1, 2 or 3")
        return value
    allowed = SCHEDULES + ASYNCHRONOUS if name == "schedule" else RECOMPUTE_VALUES
    if raw not in allowed:
        raise UserError(f"--fix: {name}={raw!r} must be one of {', '.join(allowed)}")
    return raw
