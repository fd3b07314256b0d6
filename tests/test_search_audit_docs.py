"""docs/gpt4.md's reading of the table against the table it reads (docs/audits/issue-35.md): each
machine's "(×R)" in "Reading it" is the ratio the last ``llmsim gpt4`` block prints, so a
rerun that moves a ratio cannot leave the prose behind (Aurora's ×1.37 did)."""

from __future__ import annotations

import re

from test_gpt4_docs import DOC, ROWS

from llmsim import gpt4_sources


def _reading_ratios() -> dict[str, str]:
    text = DOC.read_text()
    reading = text[text.index("## Reading it"):text.index("## Limits")]
    return {name.lower(): ratio
            for name, ratio in re.findall(r"\*\*(\w+)\*\* \(×([\d.]+)\)", reading)}


def test_the_reading_names_every_machine_with_the_table_s_ratio() -> None:
    ratios = _reading_ratios()
    assert set(ratios) == set(gpt4_sources.SYSTEMS)
    for system, ratio in ratios.items():
        assert ROWS[system][9] == ratio, system  # the "llmsim / source" cell
