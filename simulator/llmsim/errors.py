"""The one exception type for mistakes in what the user gave us.

A :class:`UserError` carries a single sentence that names the field, the value and
the fix. The CLI prints it and exits with code 2; it never shows a traceback.
"""

from __future__ import annotations


class UserError(Exception):
    """Invalid input: a file, a field value or a command-line option."""

    exit_code = 2

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message
