"""YAML in, validated specs out: catalog resolution, ``--set`` overrides, clear errors."""

from __future__ import annotations

import copy
import difflib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from llmsim import catalog, hf_config, safe_yaml
from llmsim.errors import UserError
from llmsim.specs import Accelerator, CollectiveLibrary, Model, Scenario, System

# Where a scenario may name a catalog entry instead of writing it inline.
_REFERENCES: tuple[tuple[tuple[str, ...], catalog.Kind], ...] = (
    (("system",), "systems"),
    (("system", "node", "accelerator"), "accelerators"),
    (("node", "accelerator"), "accelerators"),  # a system file loaded on its own
    (("system", "network", "collectives"), "collectives"),
    (("network", "collectives"), "collectives"),
    (("model",), "models"),
)
_SPEC_OF_KIND: dict[str, type[BaseModel]] = {
    "accelerators": Accelerator,
    "collectives": CollectiveLibrary,
    "systems": System,
    "models": Model,
    "scenarios": Scenario,
}


def read_yaml(path: Path) -> dict[str, Any]:
    """Parse one YAML file safely into a mapping; errors name the file and line.

    Reading is bounded and the scalars are YAML 1.2's (:mod:`llmsim.safe_yaml`)."""
    text = safe_yaml.read_text(path)
    name = safe_yaml.echo(path.name).strip("'\"")
    try:
        data = safe_yaml.parse_yaml(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = str(exc.problem)[: 2 * safe_yaml.MAX_ECHO_CHARS]
        raise UserError(
            f"{name}:{line}: malformed YAML ({problem}); fix the syntax there"
        ) from None
    except yaml.YAMLError as exc:
        problem = str(exc).splitlines()[0][: 2 * safe_yaml.MAX_ECHO_CHARS]
        raise UserError(f"{name}: malformed YAML ({problem}); fix the syntax") from None
    if not isinstance(data, dict):
        raise UserError(
            f"{name}: expected a mapping of fields at the top level, got "
            f"{type(data).__name__}; write it as `field: value` lines"
        )
    return data


def _resolve(raw: dict[str, Any], base: Path | None = None) -> dict[str, Any]:
    """Replace catalog names at the known reference points by the entries' contents, and
    ``model: {from_hf: config.json}`` by the model it describes (a relative path is taken
    from ``base``, the scenario file's folder, or else the working directory)."""
    for path, kind in _REFERENCES:
        parent = raw
        for key in path[:-1]:
            parent = parent.get(key) if isinstance(parent, dict) else None
        if isinstance(parent, dict) and isinstance(parent.get(path[-1]), str):
            name = parent[path[-1]]
            parent[path[-1]] = read_yaml(catalog.path_of(kind, name, field=".".join(path)))
    system = raw.get("system") if isinstance(raw.get("system"), dict) else raw
    groups = system.get("groups")
    for i, group in enumerate(groups if isinstance(groups, list) else []):  # a hetero system's
        if isinstance(group, dict) and isinstance(group.get("system"), str):
            field = f"system.groups[{i}].system"
            group["system"] = read_yaml(catalog.path_of("systems", group["system"], field=field))
        if isinstance(group, dict) and isinstance(group.get("system"), dict):
            _resolve(group["system"])
    model = raw.get("model")
    if isinstance(model, dict) and "from_hf" in model:
        given = dict(model)
        source = given.pop("from_hf")
        if not isinstance(source, str) or not source:
            raise UserError(f"model.from_hf = {safe_yaml.echo(source)}: give the path of a "
                            "Hugging Face config.json")
        config = Path(source) if base is None else base / source
        raw["model"] = hf_config.model_fields(config) | given  # the fields given win
    return raw


def parse_override(item: str) -> tuple[list[str], Any]:
    """Split ``a.b.c=value`` into its key path and a YAML-typed value."""
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        raise UserError(f"--set {safe_yaml.echo(item)}: expected key=value, e.g. "
                        "--set parallelism.tp=4")
    try:
        parsed = safe_yaml.parse_yaml(value) if value.strip() else ""
    except yaml.YAMLError:
        parsed = value
    return key.strip().split("."), parsed


def apply_override(raw: dict[str, Any], keys: list[str], value: Any,
                   given_by: str = "--set") -> None:
    """Set ``raw[k0][k1]...`` to ``value``, creating mappings on the way; an error names
    the key after ``given_by``, where it was written."""
    node = raw
    for i, key in enumerate(keys[:-1]):
        child = node.get(key)
        if child is None:
            child = node[key] = {}
        if not isinstance(child, dict):
            where = ".".join(keys[: i + 1])
            raise UserError(
                f"{given_by} {'.'.join(keys)}: {where} is {safe_yaml.echo(child)}, not a mapping; "
                f"set {where} itself instead"
            )
        node = child
    node[keys[-1]] = value


def apply_system_set(raw: dict[str, Any], label: str) -> dict[str, Any]:
    """Apply a scenario's ``system_set`` to its resolved system and drop the field.

    ``system_set`` maps dotted fields of the system to values (``{node.accelerator:
    a64fx-boost}``), each applied as ``--set system.<field>=<value>`` would be: a catalog
    system run with a documented change, without a copy of its file. The loaded scenario
    holds the changed system in full, so what writes it back out needs no ``system_set``.
    The changed system is validated on its own, so that an error names the field as
    ``system_set`` gives it."""
    if "system_set" not in raw:
        return raw
    given = raw.pop("system_set")
    example = "e.g. system_set: {node.accelerator: a64fx-boost}"
    if not isinstance(given, dict):
        raise UserError(f"{label}: system_set = {safe_yaml.echo(given)} is not a mapping of "
                        f"system fields to values; write it as {example}, or remove it")
    if not given:
        raise UserError(f"{label}: system_set = {{}} changes nothing; give a field to change, "
                        f"{example}, or remove it")
    if not isinstance(raw.get("system"), dict):
        raise UserError(f"{label}: system_set needs a system to change; add system: (a "
                        "catalog name or a mapping)")
    for key, value in given.items():
        keys = key.split(".") if isinstance(key, str) else [""]
        if not all(part.strip() for part in keys):
            raise UserError(f"{label}: system_set key {safe_yaml.echo(key)} is not a dotted "
                            f"field of the system; write it as {example}")
        apply_override(raw["system"], keys, value, given_by=f"{label}: system_set")
    raw = _resolve(raw)  # a catalog name set as a value (an accelerator) is read now
    validate(System, raw["system"], f"{label}: system_set")
    return raw


def _field_names(model: type[BaseModel]) -> list[str]:
    return list(model.model_fields)


def _describe(value: Any) -> str:
    return safe_yaml.echo(value)


def _locate(loc: tuple[Any, ...], data: Any) -> tuple[str, Any, bool]:
    """Dotted field name (skipping union tags), the offending input, whether it exists."""
    parts: list[str] = []
    node = data
    found = True
    for part in loc:
        if isinstance(node, dict) and part in node:
            node = node[part]
            parts.append(str(part))
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            node = node[part]
            parts.append(f"[{part}]")
        elif isinstance(node, dict) and node.get("kind") == part:
            continue  # discriminated-union tag, not a field the user wrote
        else:
            parts.append(str(part))
            found = False
            node = None
    return ".".join(parts).replace(".[", "["), node, found


def _allowed_fields(spec: type[BaseModel], loc: tuple[Any, ...], data: Any) -> list[str]:
    """Field names allowed at the parent of ``loc`` (best effort, for hints)."""
    model: Any = spec
    node = data
    for part in loc[:-1]:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        if isinstance(node, dict) and node.get("kind") == part:
            continue
        node = node.get(part) if isinstance(node, dict) else None
        if field is None:
            return []
        model = _submodel(field.annotation, node)
        if model is None:
            return []
    return _field_names(model)


def _submodel(annotation: Any, node: Any) -> type[BaseModel] | None:
    from typing import get_args

    candidates = [annotation, *get_args(annotation)]
    for arg in list(candidates):
        candidates.extend(get_args(arg))
    models = [c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)]
    if len(models) > 1 and isinstance(node, dict) and "kind" in node:
        for m in models:
            kind_field = m.model_fields.get("kind")
            if kind_field is not None and kind_field.default == node["kind"]:
                return m
    return models[0] if models else None


def explain(err: ValidationError, spec: type[BaseModel], data: Any, label: str) -> UserError:
    """Turn pydantic's first error into one sentence: field, value, fix."""
    first = err.errors()[0]
    loc = tuple(first["loc"])
    field, value, _ = _locate(loc, data)
    if len(field) > safe_yaml.MAX_ECHO_CHARS:  # a key the user wrote can be of any length
        field = field[: safe_yaml.MAX_ECHO_CHARS - 3] + "..."
    kind = first["type"]
    msg = first["msg"].removeprefix("Value error, ")
    if kind == "extra_forbidden":
        allowed = _allowed_fields(spec, loc, data)
        close = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"allowed: {_listed(allowed)}"
        return UserError(f"{label}: unknown field {field!r}; remove it ({hint})")
    if len(loc) >= 2 and loc[-1] == "[key]":  # a mapping's key, not its value
        parent, _, _ = _locate(loc[:-2], data)
        return UserError(f"{label}: {parent} has the key {loc[-2]!r}, which is not allowed; "
                         f"{msg.lower()}")
    if kind == "missing" and isinstance(loc[-1], int):
        parent, items, _ = _locate(loc[:-1], data)
        return UserError(f"{label}: {parent} = {_describe(items)} has too few items (no item "
                         f"{loc[-1]}, counting from 0); add the missing ones")
    if kind == "missing":
        return UserError(f"{label}: missing field {field!r}; add it")
    if kind == "value_error" and not loc:
        return UserError(f"{label}: {msg}")
    if kind == "value_error" and isinstance(value, dict):  # a whole entry's own rule
        return UserError(f"{label}: {_within(field, msg)}")
    if kind == "value_error":
        return UserError(f"{label}: {field} = {_describe(value)}: {msg}")
    if kind == "model_type":  # a nested entry given as a bare value
        return UserError(f"{label}: {field} = {_describe(value)} is not "
                         f"{_mapping_form(spec, loc, data, field)}; give it as one (see "
                         "docs/catalog.md)")
    if kind == "union_tag_not_found":
        return UserError(f"{label}: {field} has no {first['ctx']['discriminator']}; add "
                         "it (docs/catalog.md lists the kinds)")
    if kind == "union_tag_invalid":
        tag = first["ctx"]["discriminator"].strip("'")
        return UserError(f"{label}: {field}.{tag} = {_describe(first['ctx']['tag'])} is not "
                         f"allowed; use one of {first['ctx']['expected_tags']}")
    if kind == "literal_error":
        return UserError(f"{label}: {field} = {_describe(value)} is not allowed; {msg.lower()}")
    return UserError(
        f"{label}: {field} = {_describe(value)} is invalid ({msg.lower()}); correct the value"
    )


def _within(field: str, msg: str) -> str:
    """A rule's message about a whole entry at ``field``, placed there: a message that
    names its field from the entry's own name (``gemm.framework_share: ...`` at
    ``system.node.accelerator.gemm``) gets the path before it, any other the path as its
    subject, never the entry's contents."""
    head, _, last = field.rpartition(".")
    if msg.startswith("["):  # an item of the field's mapping or list
        return f"{field}{msg}"
    if msg.startswith(f"{last}."):
        return f"{head}.{msg}" if head else msg
    return f"{field}: {msg}"


MAX_LISTED_FIELDS = 8
"""Most field names an error lists where a mapping was expected; the rest are counted."""


def _listed(fields: list[str]) -> str:
    """The first :data:`MAX_LISTED_FIELDS` of ``fields``, and how many more there are."""
    more = len(fields) - MAX_LISTED_FIELDS
    return ", ".join(fields[:MAX_LISTED_FIELDS]) + (
        f" and {more} more" if more > 0 else "")


def _mapping_form(spec: type[BaseModel], loc: tuple[Any, ...], data: Any, field: str) -> str:
    """What belongs at ``loc`` (``field`` as the user wrote it): a mapping of the fields
    (the first few named), or a catalog name where the field takes one."""
    fields = _allowed_fields(spec, (*loc, None), data)
    form = f"a mapping of {_listed(fields)}" if fields else "a mapping"
    path = tuple(field.split("."))
    kinds = [kind for ref, kind in _REFERENCES if path[-len(ref):] == ref]
    if kinds:  # the kind of the reference that ends the path, as _resolve reads it
        form = f"a catalog name (llmsim catalog {kinds[0]}) or {form}"
    return form


def validate(spec: type[BaseModel], data: dict[str, Any], label: str) -> Any:
    """Validate ``data`` as ``spec``; any problem becomes a :class:`UserError`."""
    try:
        return spec.model_validate(data)
    except ValidationError as err:
        raise explain(err, spec, data, label) from None


def load_spec(kind: catalog.Kind, name: str) -> Any:
    """Load one catalog entry by name, validated (names inside it resolved)."""
    if kind == "scenarios":  # its system_set and calibration profile are read there
        return load_scenario(name)
    path = catalog.path_of(kind, name)
    raw = _resolve(read_yaml(path))
    return validate(_SPEC_OF_KIND[kind], raw, path.name)


def scenario_path(source: str | Path) -> Path:
    """A scenario argument is a path if the file exists, otherwise a catalog name; one
    that looks like a path (a folder part, or ``.yaml`` / ``.yml`` and no catalog entry of
    that name) and does not exist is a "file not found"."""
    path = Path(source)
    try:
        if path.is_file():
            return path
        if path.is_dir():
            raise UserError(f"scenario {safe_yaml.echo(str(source))} is a folder; give a "
                            "scenario file in it, or a catalog name")
    except OSError:  # a name too long for the file system, for one
        pass
    looks_like_path = len(path.parts) > 1 or path.suffix in (".yaml", ".yml")
    if looks_like_path and not catalog.is_name(str(source)):
        raise UserError(f"scenario file {safe_yaml.echo(str(source))}: file not found (nor a "
                        "catalog scenario of that name); check the path")
    return catalog.path_of("scenarios", str(source))


def load_scenario(
    source: str | Path | Mapping[str, Any],
    overrides: Iterable[str] | Mapping[str, Any] | None = None,
) -> Scenario:
    """Load, resolve, override and validate a scenario.

    ``source`` is a path, a catalog scenario name (``frontier`` or ``frontier.yaml``) or a
    mapping. ``overrides`` are ``"a.b.c=value"`` strings or a ``{"a.b.c": value}`` mapping,
    applied after the scenario's own ``system_set`` (:func:`apply_system_set`), so they win.
    """
    base = None
    if isinstance(source, Mapping):
        raw, label = copy.deepcopy(dict(source)), "scenario"
    else:
        path = scenario_path(source)
        raw, label, base = read_yaml(path), path.name, path.parent
    raw = apply_system_set(_resolve(raw, base), label)  # before the overrides, which win
    pairs: list[tuple[list[str], Any]]
    if overrides is None:
        pairs = []
    elif isinstance(overrides, Mapping):
        pairs = [(str(k).split("."), v) for k, v in overrides.items()]
    else:
        pairs = [parse_override(item) for item in overrides]
    for keys, value in pairs:
        if keys[0] == "system_set":  # applied already: an override changes the system itself
            raise UserError(f"--set {'.'.join(keys)}: system_set is read before the overrides; "
                            "set the system's field instead, e.g. --set "
                            "system.node.accelerator=a64fx")
        apply_override(raw, keys, value)
        raw = _resolve(raw)  # an override's from_hf path is the working directory's
    scenario = validate(Scenario, raw, label)
    if scenario.calibration:  # read now: a bad profile is a load error, and simulate reuses it
        calibration_profile(scenario.calibration)
    return scenario


_PROFILES: dict[tuple[str, int, int], Any] = {}
"""(resolved path, modification time ns, size) of a calibration profile → it, validated."""


def calibration_profile(path: str | Path) -> Any:
    """The :class:`~llmsim.calibration.Calibration` profile at ``path``, read and validated
    once per version of the file: :func:`load_scenario` reads a scenario's profile when
    it loads it, and the cost model (``HardwareCosts.from_scenario``) takes it from here."""
    from llmsim.calibration.points import Calibration  # the package imports this module

    path = Path(path)
    try:
        stat = path.stat()
    except OSError:
        return validate(Calibration, read_yaml(path), path.name)  # its error names the file
    key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size)
    profile = _PROFILES.get(key)
    if profile is None:
        profile = _PROFILES[key] = validate(Calibration, read_yaml(path), path.name)
    return profile
