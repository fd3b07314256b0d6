"""Reading user files safely: bounded size, a clear word on encodings, YAML 1.2 scalars.

Every file llmsim reads from the user (scenarios, catalog entries, calibration profiles,
GEMM tables, nccl-tests logs) goes through :func:`read_text`, and every YAML document
through :func:`parse_yaml`, so that no input can run for long, use much memory or end in
a traceback:

* a file is read up to :data:`MAX_FILE_BYTES` (16 MiB), never more (``/dev/zero`` or a
  log of gigabytes is refused after reading that much);
* UTF-8 is expected; a UTF-8, UTF-16 or UTF-32 byte-order mark is honoured (the YAML
  1.2 spec allows those encodings), any other undecodable byte and any NUL byte
  (a binary file) is refused, naming the line;
* YAML nested deeper than :data:`MAX_DEPTH` levels, aliases that refer to their own
  node, and documents whose aliases expand to more than :data:`MAX_NODES` values
  ("billion laughs") are refused before anything is built from them;
* a key given twice in one mapping is refused (PyYAML keeps the last silently);
* plain scalars are read as the YAML 1.2 core schema reads them, not as YAML 1.1:
  ``010`` is 10 (not 8), ``1:20`` is the string ``"1:20"`` (not 80), ``1e9`` is a
  float (YAML 1.1 reads a string), ``yes``/``no``/``on``/``off`` and dates are strings
  (a boolean field still accepts ``yes`` and ``no``).
"""

from __future__ import annotations

import codecs
import copy
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.events import Event, ScalarEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.resolver import Resolver

from llmsim.errors import UserError

MAX_FILE_BYTES = 16 * 2**20
"""Largest file read, bytes (16 MiB): far above any scenario or calibration profile."""
MAX_DEPTH = 64
"""Deepest nesting of YAML collections; a scenario nests four or five levels."""
MAX_NODES = 1_000_000
"""Most values (scalars and collections, every alias expanded) in one YAML document."""
MAX_ECHO_CHARS = 80
"""Longest piece of user input quoted back in an error message, characters."""

_BOMS = (  # longest first: the UTF-32 LE mark starts with the UTF-16 LE one
    (codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF8, "utf-8-sig"), (codecs.BOM_UTF16_LE, "utf-16"),
    (codecs.BOM_UTF16_BE, "utf-16"),
)


def echo(value: object) -> str:
    """``repr(value)`` cut to :data:`MAX_ECHO_CHARS`, for quoting user input in an error."""
    import reprlib

    short = reprlib.Repr()
    short.maxstring = short.maxother = MAX_ECHO_CHARS
    short.maxlist = short.maxtuple = short.maxdict = short.maxset = 6
    short.maxlevel = 3
    text = short.repr(value)
    return text if len(text) <= MAX_ECHO_CHARS else text[: MAX_ECHO_CHARS - 3] + "..."


def read_text(path: str | Path, what: str = "file") -> str:
    """The text of ``path``, decoded; a :class:`UserError` if it cannot be read, is larger
    than :data:`MAX_FILE_BYTES`, is binary or is not UTF-8 (nor UTF-16/32 with a BOM)."""
    path = Path(path)
    try:
        with path.open("rb") as stream:
            data = stream.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise UserError(f"cannot read {what} {echo(str(path))}: file not found; check the "
                        "path") from None
    except OSError as exc:
        raise UserError(f"cannot read {what} {echo(str(path))}: {exc.strerror}; "
                        "check the path") from None
    except ValueError:  # a NUL character in the path
        raise UserError(f"cannot read {what} {echo(str(path))}: a path cannot hold a NUL "
                        "character; check the path") from None
    name = echo(path.name)
    if len(data) > MAX_FILE_BYTES:
        raise UserError(f"{name}: the {what} is larger than {MAX_FILE_BYTES // 2**20} MiB, "
                        "the most llmsim reads; give a smaller file")
    encoding = next((enc for bom, enc in _BOMS if data.startswith(bom)), "utf-8")
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise UserError(f"{name}: line {line}: byte 0x{data[exc.start]:02x} is not {encoding} "
                        "text; save the file as UTF-8") from None
    if "\x00" in text:
        line = text[: text.index("\x00")].count("\n") + 1
        raise UserError(f"{name}: line {line} holds a NUL byte, so this is not a text file; "
                        f"give the YAML or CSV {what} itself")
    return text


class _Checks:
    """What llmsim's loaders add to PyYAML's safe loading: YAML 1.2 core-schema scalars
    (the resolvers set below), a depth limit, no duplicate keys and, with
    :func:`_check_expansion`, a cap on alias expansion. Mixed into a loader ahead of
    PyYAML's ``Composer`` and ``SafeConstructor``."""

    _depth = 0

    def compose_node(self, parent: Node | None, index: object) -> Node:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise yaml.composer.ComposerError(
                    None, None, f"nested deeper than {MAX_DEPTH} levels",
                    self.peek_event().start_mark)
            return super().compose_node(parent, index)  # type: ignore[misc]
        finally:
            self._depth -= 1

    def compose_mapping_node(self, anchor: str | None) -> MappingNode:
        node = super().compose_mapping_node(anchor)
        seen: dict[tuple[str, str], int] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, ScalarNode) or key_node.tag.endswith(":merge"):
                continue
            key = (key_node.tag, key_node.value)
            if key in seen:
                raise yaml.composer.ComposerError(
                    None, None, f"the key {echo(key_node.value)} is given twice (first on "
                    f"line {seen[key] + 1}); keep one of them", key_node.start_mark)
            seen[key] = key_node.start_mark.line
        return node

    def construct_object(self, node: Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep=deep)
        except yaml.YAMLError:
            raise
        except (ValueError, TypeError, LookupError, AttributeError, OverflowError) as exc:
            # An explicit tag on a value it does not fit: !!int abc, !!timestamp x, ...
            raise yaml.constructor.ConstructorError(
                None, None, f"{echo(node.value)} cannot be read as {node.tag.split(':')[-1]} "
                f"({type(exc).__name__})", node.start_mark) from None

    def construct_yaml_int(self, node: ScalarNode) -> int:  # type: ignore[override]
        value = str(self.construct_scalar(node))
        if value.startswith("0o"):
            return int(value[2:], 8)
        if value.startswith("0x"):
            return int(value[2:], 16)
        return int(value, 10)

    def construct_yaml_float(self, node: ScalarNode) -> float:  # type: ignore[override]
        value = str(self.construct_scalar(node)).lower()
        if value.lstrip("+-") == ".inf":
            return float("-inf") if value.startswith("-") else float("inf")
        if value == ".nan":
            return float("nan")
        return float(value)


class _Loader(_Checks, yaml.SafeLoader):  # type: ignore[misc]
    """PyYAML's pure-Python safe loader with llmsim's checks (:class:`_Checks`)."""


_CParser = getattr(getattr(yaml, "_yaml", None), "CParser", None)
"""libyaml's scanner and parser (PyYAML built with it), or None."""

_PURE_PYTHON_ONLY = re.compile("[\t?\ufeff]|[|>][-+0-9]*#")
"""Text that libyaml may read otherwise than PyYAML's pure-Python scanner: a tab inside a
plain scalar and a ``?`` inside a plain scalar in a flow collection (libyaml reads a
string, PyYAML refuses), a comment right after a block scalar's indicator (``>#``) and a
byte-order mark inside the text (libyaml skips it, PyYAML keeps it in a string). Such a
document is read in pure Python, so that llmsim reads and refuses what it always has
(a differential fuzz of the two found no other difference; tests/test_safe_yaml.py)."""

if _CParser is not None and getattr(yaml, "__with_libyaml__", False):
    class _FastLoader(_Checks, _CParser, Composer, SafeConstructor, Resolver):  # type: ignore[misc, valid-type]
        """The same loader on libyaml's events: the scanner and parser, nine tenths of
        the pure-Python loader's time, run in C; the nodes are still composed here in
        Python (PyYAML's ``Composer``, so :class:`_Checks` sees every node as it is made)."""

        get_single_node = Composer.get_single_node  # not CParser's: it composes in C
        check_node = Composer.check_node
        get_node = Composer.get_node

        def __init__(self, stream: str) -> None:
            _CParser.__init__(self, stream)
            Composer.__init__(self)
            SafeConstructor.__init__(self)
            Resolver.__init__(self)

        def get_event(self) -> Event:
            event = _CParser.get_event(self)
            if isinstance(event, ScalarEvent) and event.tag == "!":
                event.implicit = (True, False)  # as PyYAML's parser marks "!": `a: !` is null
            return event

    _LOADERS: tuple[type, ...] = (_FastLoader, _Loader)
else:  # pragma: no cover - PyYAML without libyaml
    _LOADERS = (_Loader,)

_Loader.yaml_implicit_resolvers = {}
for _tag, _pattern, _first in (  # YAML 1.2.2 spec, §10.3.2 (core schema), in this order
    ("bool", r"true|True|TRUE|false|False|FALSE", "tTfF"),
    ("int", r"[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+", "-+0123456789"),
    ("float", r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?"
              r"|[-+]?\.(inf|Inf|INF)|\.(nan|NaN|NAN)", "-+.0123456789"),
    ("null", r"~|null|Null|NULL|", ["~", "n", "N", ""]),
    ("merge", r"<<", "<"),
):
    _Loader.add_implicit_resolver(f"tag:yaml.org,2002:{_tag}", re.compile(f"^(?:{_pattern})$"),
                                  list(_first))
_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_yaml_int)
_Loader.add_constructor("tag:yaml.org,2002:float", _Loader.construct_yaml_float)
for _loader in _LOADERS[:-1]:  # the same resolvers and constructors
    _loader.yaml_implicit_resolvers = _Loader.yaml_implicit_resolvers
    _loader.yaml_constructors = _Loader.yaml_constructors


def _check_expansion(root: Node) -> None:
    """Refuse a node graph that refers to itself or expands to over :data:`MAX_NODES`."""
    size: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        children: list[Node] = []
        if isinstance(node, SequenceNode):
            children = list(node.value)
        elif isinstance(node, MappingNode):
            children = [n for pair in node.value for n in pair]
        if done:
            on_path.discard(key)
            size[key] = 1 + sum(size[id(c)] for c in children)
            if size[key] > MAX_NODES:
                raise yaml.composer.ComposerError(
                    None, None, f"its aliases expand to more than {MAX_NODES:,} values",
                    node.start_mark)
            continue
        if key in size:
            continue
        if key in on_path:
            raise yaml.composer.ComposerError(
                None, None, "an alias refers to the node that holds it", node.start_mark)
        on_path.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in children if id(c) not in size)


def parse_yaml(text: str, loader_class: type | None = None) -> Any:
    """The Python value of one YAML document (YAML 1.2 core scalars, the limits above);
    raises ``yaml.YAMLError`` (often a ``MarkedYAMLError`` with a line) when malformed.

    Read with libyaml's parser where PyYAML has it (about six times faster); a document
    it refuses is read again in pure Python, so that a refusal is worded, and its line
    given, as PyYAML's pure-Python parser gives them, and so is a document that libyaml
    would read where that parser refuses it (:data:`_PURE_PYTHON_ONLY`). ``loader_class``
    picks a loader, for tests.

    A text read before is not parsed again: a copy of its value is returned (the last
    :data:`PARSED_KEPT` texts of up to :data:`PARSED_KEPT_CHARS` characters are kept;
    ``llmsim validate`` reads the same few catalog files some 500 times)."""
    if loader_class is not None:
        return _parse(text, loader_class)
    if len(text) <= PARSED_KEPT_CHARS:
        return copy.deepcopy(_parsed(text))
    return _parse_any(text)


PARSED_KEPT = 128
"""Texts whose values :func:`parse_yaml` keeps."""
PARSED_KEPT_CHARS = 64 * 1024
"""Longest text whose value :func:`parse_yaml` keeps, characters (a catalog entry: 1–10 k)."""


@lru_cache(maxsize=PARSED_KEPT)
def _parsed(text: str) -> Any:
    """:func:`_parse_any`, remembered (a refusal is not: it raises again)."""
    return _parse_any(text)


def _parse_any(text: str) -> Any:
    """:func:`parse_yaml` without the memory: libyaml's events, else pure Python."""
    if len(_LOADERS) > 1 and not _PURE_PYTHON_ONLY.search(text):
        try:
            return _parse(text, _LOADERS[0])
        except (yaml.YAMLError, ValueError):  # ValueError: text libyaml cannot encode
            pass
    return _parse(text, _Loader)


def _parse(text: str, loader_class: type) -> Any:
    """:func:`parse_yaml` with one loader."""
    loader = loader_class(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_expansion(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()
