"""The consoles the command-line modules print on."""

from __future__ import annotations

from rich.console import Console

PIPED_WIDTH = 200
"""Columns of a console whose output is piped or redirected: wide, so that tables keep
their headers and columns whole instead of fitting 80 columns."""


def console(stderr: bool = False, piped_width: int = PIPED_WIDTH) -> Console:
    """Standard output (or error); ``piped_width`` columns wide when not a terminal."""
    terminal = Console(stderr=stderr)
    return terminal if terminal.is_terminal else Console(stderr=stderr, width=piped_width)
