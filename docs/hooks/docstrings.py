"""Griffe extension: llmsim's reST-flavoured docstrings read well in the API reference.

The docstrings are written for ``help()`` and reST habits: ``:func:`name``` roles and
``>>>`` examples. Markdown shows a role as text and a ``>>>`` line as a quote three
deep, so before mkdocstrings renders a docstring this extension turns each role into
a code span and each run of ``>>>``/``...`` lines into a ``pycon`` code block. The source
is not changed. mkdocs.yml names this file under the python handler's ``extensions``.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:func|class|mod|meth|attr|data|obj|exc|const):`~?([^`]+)`")
PROMPT = re.compile(r"^(>>>|\.\.\.)( |$)")


def markdown_docstring(text: str) -> str:
    """``text`` with reST roles as code spans and doctest lines fenced as ``pycon``."""
    out: list[str] = []
    in_example = False
    for line in ROLE.sub(r"`\1`", text).split("\n"):
        prompt = PROMPT.match(line) is not None
        if prompt and not in_example:
            out.append("```pycon")
        elif not prompt and in_example:
            out.append("```")
        in_example = prompt
        out.append(line)
    if in_example:
        out.append("```")
    return "\n".join(out)


class MarkdownDocstrings(griffe.Extension):
    """Rewrites each object's docstring with :func:`markdown_docstring` as it loads."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown_docstring(obj.docstring.value)
