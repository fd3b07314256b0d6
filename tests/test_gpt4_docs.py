"""docs/gpt4.md's table against today's code: what is deterministic in each row (the
source's days, its method recomputed from the catalog's peaks, the ratio, the devices)
must be what ``llmsim gpt4`` computes now; the searched columns are checked by rerunning
the table (docs/gpt4.md says when)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from llmsim import gpt4, gpt4_sources

DOC = Path(__file__).resolve().parents[1] / "docs" / "gpt4.md"


def _rows() -> dict[str, list[str]]:
    """Each machine's row of the last ``llmsim gpt4`` console block, its wrapped lines
    joined cell by cell."""
    text = DOC.read_text()
    block = text[text.rindex("$ llmsim gpt4"):]
    block = block[: block.index("```")]
    rows: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in block.splitlines():
        if not line.startswith("│"):
            current = None
            continue
        cells = [c.strip() for c in line.strip()[1:-1].split("│")]
        if cells[0] in gpt4_sources.SYSTEMS:
            current = rows[cells[0]] = cells
        elif current is not None:
            current[:] = [f"{a} {b}".strip() for a, b in zip(current, cells, strict=True)]
    return rows


def _number(text: str) -> float:
    return float(re.match(r"[\d,.]+", text).group(0).replace(",", ""))  # type: ignore[union-attr]


ROWS = _rows()


def test_the_doc_s_table_has_every_machine() -> None:
    assert list(ROWS) == list(gpt4_sources.SYSTEMS)


@pytest.mark.parametrize("row", gpt4_sources.SOURCE_TABLE, ids=lambda r: r.system)
def test_the_doc_s_source_columns_are_today_s(row: gpt4_sources.SourceRow) -> None:
    cells = ROWS[row.system]
    devices, source, method, days, ratio = cells[1], cells[2], cells[3], cells[8], cells[9]
    assert _number(source) == row.source_days
    assert ("(?)" in source) == row.source_doubtful
    peak = sum(gpt4_sources.part_peak_flops(p) for p in row.parts)
    expected = gpt4.source_method_days(3e25, peak, row.factor)
    assert _number(method) == round(expected)
    assert f"{peak / 1e18:.2f} EFLOP/s ×{row.factor:g}" in method
    assert ("assumed" in method) == (not row.factor_stated)
    # both printed rounded: the days to a whole day, the ratio to two decimals
    assert _number(ratio) == pytest.approx(_number(days) / row.source_days,
                                           abs=0.005 + 0.5 / row.source_days)
    used, idle = (int(x.replace(",", "")) for x in re.findall(r"[\d,]+", devices))
    _, base, source_devices = gpt4.whole_machine(row) if not row.hand_layout else (
        None, None, sum(p.packages * p.devices_per_package for p in row.parts))
    assert used + idle == (min(source_devices, base.devices) if base else source_devices)
