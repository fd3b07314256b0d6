"""The scenario rules of the search's layouts, without a pydantic validation per layout.

The search makes a ``Parallelism`` and a ``Scenario`` for each of hundreds of thousands of
layouts, each the base scenario's with a few fields changed (the layout's degrees,
schedule, switches, nodes). Validating each by pydantic re-checks all of the
parallelism's 47 fields and the scenario's, one Python call per field, although only
the changed ones can differ from the base's, which are valid. :func:`revalidated` makes
the same object without that:

- each changed field's value is checked by pydantic itself the first time it is met (the
  whole object is validated then, as before) and remembered as valid when pydantic kept
  it unchanged: a field's type, bounds and field validators read that field alone, so a
  value that passed once passes again (there are a few dozen such values in a search);
- the object is the base's copy with those fields set (``model_copy``), every field
  counted as set (as ``model_validate`` of every field counts them);
- the class's own rules, its ``mode="after"`` model validators (``Parallelism._check`` →
  :func:`llmsim.specs.parallelism_rules.check_layout_rules`,
  ``Scenario._check_layout``), are called on it: the single source of the rules, not a
  copy of them.

Where a rule refuses the object, the plain validation runs instead, so the exception is
pydantic's own, word for word. A class with other kinds of model validators (before,
wrap) is always validated by pydantic. ``tests/test_search_fast_rules.py`` checks, on
random layouts of several catalog scenarios, valid and not, that the fast path accepts
exactly what pydantic accepts, with equal objects, and refuses with the same message.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from pydantic import BaseModel

M = TypeVar("M", bound=BaseModel)

_VALID: dict[type, set[tuple[str, type, Any]]] = {}
"""Per class, the (field, type, value) triples its field validation kept unchanged (the
type in the key: ``True == 1``, yet pydantic may keep one and convert the other)."""

_NONE: frozenset = frozenset()

_AFTER: dict[type, tuple[str, ...] | None] = {}
"""Per class, the names of its model validators (all ``mode="after"``), or None where it
has others."""

_PLAIN = False
"""Whether every object is validated by pydantic (:func:`plain_validation`)."""


@contextmanager
def plain_validation() -> Iterator[None]:
    """Validate every object by pydantic while in this block (the reference the fast path
    is tested against)."""
    global _PLAIN
    before, _PLAIN = _PLAIN, True
    try:
        yield
    finally:
        _PLAIN = before


def revalidated(obj: M, updates: dict[str, Any], plain: Callable[[], M]) -> M:
    """``plain()`` — the pydantic validation of ``obj``'s fields with ``updates`` — made
    without validating the unchanged fields again: ``obj``'s copy with ``updates``,
    checked by its class's model validators (the rules), where every updated value is one
    pydantic has kept unchanged before; otherwise, or where a rule refuses it, ``plain()``
    itself (which then raises pydantic's error)."""
    cls = type(obj)
    rules = _rules(cls)
    if _PLAIN or rules is None or not _known_valid(cls, obj, updates):
        out = plain()
        _learn(cls, updates, out)
        return out
    out = copied(obj, updates)
    try:
        for name in rules:
            getattr(out, name)()
    except (ValueError, AssertionError):  # pydantic's own error, word for word
        return plain()
    return out


_set = object.__setattr__

_FIELDS: dict[type, frozenset[str]] = {}
"""Per class, its fields' names (the fields set of every object :func:`copied` makes)."""


def copied(obj: M, updates: dict[str, Any]) -> M:
    """``obj.model_copy(update=updates)`` with every field counted as set (as
    ``model_validate`` of every field counts them), made in one step: a new instance
    whose ``__dict__`` is ``obj``'s with ``updates``, its extra fields and private
    attributes ``obj``'s (a frozen spec with ``extra="forbid"`` and no private attributes
    has None for both; others take ``model_copy``). No value is validated: the caller
    checks the rules (``tests/test_search_fast_rules.py``: equal to ``model_copy``'s)."""
    cls = type(obj)
    fields = _FIELDS.get(cls)
    if fields is None:
        fields = _FIELDS[cls] = frozenset(cls.model_fields)
    if obj.__pydantic_extra__ is not None \
            or getattr(obj, "__pydantic_private__", None) is not None:
        out = obj.model_copy(update=updates)
    else:
        out = cls.__new__(cls)
        state = obj.__dict__.copy()
        state.update(updates)
        _set(out, "__dict__", state)
        _set(out, "__pydantic_extra__", None)
        _set(out, "__pydantic_private__", None)
    _set(out, "__pydantic_fields_set__", set(fields))
    return out


def _rules(cls: type) -> tuple[str, ...] | None:
    if cls not in _AFTER:
        decorators = cls.__pydantic_decorators__.model_validators  # type: ignore[attr-defined]
        plain_instances = cls.model_config.get("revalidate_instances", "never") == "never"
        _AFTER[cls] = tuple(decorators) if plain_instances and all(
            d.info.mode == "after" for d in decorators.values()) else None
    return _AFTER[cls]


_SCALARS = frozenset((int, bool, str, float, type(None)))
"""Value types remembered as valid (hashable, compared by value)."""


def _known_valid(cls: type, obj: BaseModel, updates: dict[str, Any]) -> bool:
    """Whether pydantic would keep every updated value unchanged: a scalar it has kept
    before, or an instance of the field's own model class (kept as is: pydantic does not
    validate a model instance again, ``revalidate_instances="never"``)."""
    valid = _VALID.get(cls, _NONE)
    for name, value in updates.items():
        kind = type(value)
        if kind in _SCALARS:
            if (name, kind, value) not in valid:
                return False
        elif not (isinstance(value, BaseModel) and kind is type(getattr(obj, name))):
            return False
    return True


def _learn(cls: type, updates: dict[str, Any], out: BaseModel) -> None:
    """Remember the updated scalars that ``out``'s validation kept unchanged."""
    valid = _VALID.setdefault(cls, set())
    for name, value in updates.items():
        kept = getattr(out, name)
        if type(value) in _SCALARS and type(kept) is type(value) and kept == value:
            valid.add((name, type(value), value))
