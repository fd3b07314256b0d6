"""Common base for every spec: frozen, no unknown fields, docstrings as descriptions."""

from __future__ import annotations

import ast
import inspect
import textwrap
from functools import cache
from itertools import pairwise
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_WHOLE_NUMBER = 2**53
"""Largest whole number a field may hold: above it float arithmetic (IEEE 754 double,
53-bit significand) no longer holds every whole number, and no count llmsim models comes
near it."""

FLOAT_RANGE = (1e-100, 1e100)
"""Smallest and largest magnitude of a non-zero float a field may hold (in a mapping or
a list too): a double overflows past about 1.8·10³⁰⁸ and underflows below 5·10⁻³²⁴, and
llmsim multiplies a few inputs and unit factors together (a 10³⁰⁰ GB/s link is infinite
bytes a second, a 10⁻³⁰⁰ MHz clock cubed is zero); no quantity it models comes near
either end (a run's FLOPs are below 10³⁰, its shortest time above 10⁻¹⁵ s)."""

MAX_NAME_CHARS = 200
"""Longest name a spec may carry (a scenario's, a model's, a system's, an accelerator's,
...): a label in reports, where rich's highlighting of a line grows with the square of
its length (a 100,000-character model name held ``llmsim run`` over a minute); the
catalog's own names are at most 100 bytes (:data:`llmsim.catalog.MAX_NAME_BYTES`)."""

Name = Annotated[str, Field(max_length=MAX_NAME_CHARS)]
"""A spec's name, at most :data:`MAX_NAME_CHARS` characters."""


class Spec(BaseModel):
    """A frozen pydantic model that rejects unknown fields.

    Field docstrings are the field descriptions: ``Model.field_descriptions()[name]``
    documents the unit and meaning of each field. Float fields refuse ``.inf`` and
    ``.nan``, and whole-number fields anything above :data:`MAX_WHOLE_NUMBER`.
    """

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        protected_namespaces=(),
        allow_inf_nan=False,
    )

    @classmethod
    def field_descriptions(cls) -> dict[str, str]:
        """Each field's docstring (its unit and meaning) by field name, "" for a field
        without one. Read from the source when first asked, not when the class is made:
        pydantic's ``use_attribute_docstrings`` parses every spec's source at import,
        about a third of the specs' import time and a tenth of ``llmsim run``'s."""
        docs: dict[str, str] = {}
        for base in reversed(cls.__mro__):
            if isinstance(base, type) and issubclass(base, Spec) and base is not Spec:
                docs |= _attribute_docstrings(base)
        return {name: docs.get(name, "") for name in cls.model_fields}

    @field_validator("*", mode="after")
    @classmethod
    def _whole_numbers_in_range(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool) and (
                abs(value) > MAX_WHOLE_NUMBER):
            raise ValueError(f"above 2^53 = {MAX_WHOLE_NUMBER:,}, past what llmsim's "
                             "arithmetic holds exactly; use a smaller value")
        _check_float_range(value)
        return value


def _check_float_range(value: Any, where: str = "") -> None:
    """Refuse a float, or one in a mapping or list (``where`` in it), outside
    :data:`FLOAT_RANGE`."""
    if isinstance(value, float):
        if value and not FLOAT_RANGE[0] <= abs(value) <= FLOAT_RANGE[1]:
            at = f"{where} = " if where else ""
            raise ValueError(f"{at}{value:g} is outside ±[{FLOAT_RANGE[0]:g}, "
                             f"{FLOAT_RANGE[1]:g}], past what llmsim's arithmetic holds "
                             "without over- or underflow; use a value of a physical size")
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_float_range(item, f"{where}[{key}]")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_float_range(item, f"{where}[{i}]")


@cache
def _attribute_docstrings(cls: type) -> dict[str, str]:
    """The docstrings under the annotated attributes of ``cls``'s own body (a string
    literal right after ``name: type [= value]``), cleaned as ``inspect.cleandoc`` does."""
    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0]
    docs: dict[str, str] = {}
    statements = body.body if isinstance(body, ast.ClassDef) else []
    for node, after in pairwise(statements):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)):
            docs[node.target.id] = inspect.cleandoc(after.value.value)
    return docs
