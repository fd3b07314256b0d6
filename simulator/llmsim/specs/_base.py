"""Common base for every spec: frozen, no unknown fields, docstrings as descriptions."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Spec(BaseModel):
    """A frozen pydantic model that rejects unknown fields.

    Field docstrings become field descriptions, so ``Model.model_fields[name].description``
    documents the unit and meaning of each field.
    """

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        use_attribute_docstrings=True,
        protected_namespaces=(),
    )
