"""Common base for every spec: frozen, no unknown fields, docstrings as descriptions."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator

MAX_WHOLE_NUMBER = 2**53
"""Largest whole number a field may hold: above it float arithmetic (IEEE 754 double,
53-bit significand) no longer holds every whole number, and no count llmsim models comes
near it."""


class Spec(BaseModel):
    """A frozen pydantic model that rejects unknown fields.

    Field docstrings become field descriptions, so ``Model.model_fields[name].description``
    documents the unit and meaning of each field. Float fields refuse ``.inf`` and
    ``.nan``, and whole-number fields anything above :data:`MAX_WHOLE_NUMBER`.
    """

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        use_attribute_docstrings=True,
        protected_namespaces=(),
        allow_inf_nan=False,
    )

    @field_validator("*", mode="after")
    @classmethod
    def _whole_numbers_in_range(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool) and (
                abs(value) > MAX_WHOLE_NUMBER):
            raise ValueError(f"above 2^53 = {MAX_WHOLE_NUMBER:,}, past what llmsim's "
                             "arithmetic holds exactly; use a smaller value")
        return value
