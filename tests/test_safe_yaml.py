"""llmsim's YAML reading on libyaml's parser reads and refuses what the pure-Python one does.

:func:`llmsim.safe_yaml.parse_yaml` takes libyaml's events where PyYAML has them and
composes the nodes in Python with llmsim's checks; what libyaml refuses, or might read
otherwise, goes through PyYAML's pure-Python parser. These tests compare the two.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from llmsim import safe_yaml
from llmsim.safe_yaml import parse_yaml

ROOT = Path(__file__).resolve().parents[1]
FAST = getattr(safe_yaml, "_FastLoader", None)
needs_libyaml = pytest.mark.skipif(FAST is None, reason="PyYAML built without libyaml")


def _outcome(text: str, loader_class: type | None = None) -> tuple[str, str]:
    """("ok", repr of the value) or ("refused", the error's text); repr makes NaN equal."""
    try:
        return "ok", repr(parse_yaml(text, loader_class))
    except yaml.YAMLError as exc:
        return "refused", str(exc)


@needs_libyaml
def test_libyaml_reads_every_shipped_yaml_file_as_the_pure_python_parser_does():
    files = sorted(p for d in ("hardware", "workloads") for p in (ROOT / d).rglob("*.yaml"))
    assert len(files) > 40
    for path in files:
        text = safe_yaml.read_text(path)
        assert not safe_yaml._PURE_PYTHON_ONLY.search(text), path  # the fast path reads it
        assert _outcome(text, FAST) == _outcome(text, safe_yaml._Loader), path


FRAGMENTS = ["a", "key", ": ", ":", "- ", "\n", "\n  ", "\n    ", " ", "[", "]", "{", "}",
             ", ", "'", '"', "\\n", "é", "#", " # c", "&a ", "*a", "<<: *a", "!!str ",
             "!!int ", "!!float ", "!!bool ", "!!seq ", "!", "---", "...", "%YAML 1.2\n",
             "|", ">", "|-", ">+", "1", "-1", "1.5", "1e3", "0x1F", "0o7", ".inf", ".nan",
             "true", "null", "~", "yes", "2024-01-01", "1:20", "010", "?", "\t", "\ufeff",
             "\r\n", "\x85", "\u2028", "`", "@", "%"]
"""Pieces of YAML syntax that random documents are made of."""


@needs_libyaml
@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=30).map("".join))
def test_a_random_document_is_read_or_refused_as_the_pure_python_parser_does(text):
    assert _outcome(text) == _outcome(text, safe_yaml._Loader)


@needs_libyaml
@settings(max_examples=100, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=12)
                    | st.floats(allow_nan=False),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=20),
       st.booleans())
def test_a_dumped_value_reads_back_the_same_with_both_parsers(value, flow):
    text = yaml.safe_dump({"v": value}, default_flow_style=flow, allow_unicode=True)
    assert _outcome(text) == _outcome(text, safe_yaml._Loader)


@pytest.mark.parametrize("text, problem", [
    ("a: b: c", "mapping values are not allowed here"),  # libyaml: "... in this context"
    ("a: [1, 2", "expected ',' or ']', but got '<stream end>'"),
])
def test_a_refusal_is_worded_as_pyyaml_words_it(text, problem):
    with pytest.raises(yaml.MarkedYAMLError) as info:
        parse_yaml(text)
    assert info.value.problem == problem


def test_text_libyaml_cannot_encode_is_a_yaml_error_not_a_crash():
    """A lone surrogate (an undecodable byte of a ``--set`` value, as Python passes it
    in sys.argv) is refused by the reader, as in pure Python."""
    with pytest.raises(yaml.reader.ReaderError):
        parse_yaml("a: \udcff")


@needs_libyaml
def test_the_checks_hold_on_libyaml_events_too():
    with pytest.raises(yaml.YAMLError, match="given twice"):
        parse_yaml("{tp: 1, tp: 2}", FAST)
    with pytest.raises(yaml.YAMLError, match="nested deeper than"):
        parse_yaml("a: " + "[" * 70 + "]" * 70, FAST)
    with pytest.raises(yaml.YAMLError, match="refers to the node that holds it"):
        parse_yaml("name: &n [1, *n]", FAST)
    assert parse_yaml("a: 010\nb: 1:20\nc: 1e9\nd: yes\ne: !\nf: 0x1f", FAST) == {
        "a": 10, "b": "1:20", "c": 1e9, "d": "yes", "e": None, "f": 31}


def test_a_text_read_again_gives_a_fresh_copy_of_its_value():
    """The parsed values are kept by text; each caller gets its own copy to change."""
    text = "system: {nodes: 4, groups: [a, b]}\nshared: &s [1]\nagain: *s\n"
    first = parse_yaml(text)
    first["system"]["groups"].append("c")
    first["shared"].append(2)
    second = parse_yaml(text)
    assert second == {"system": {"nodes": 4, "groups": ["a", "b"]}, "shared": [1],
                      "again": [1]}
    assert second["shared"] is second["again"]  # an alias still names one value
    for _ in range(2):  # a refusal is not kept: it is refused again
        with pytest.raises(yaml.YAMLError, match="given twice"):
            parse_yaml("{tp: 1, tp: 2}")
