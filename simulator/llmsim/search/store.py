"""Where a search keeps its results as they are made, so that a killed one can resume.

A search directory holds ``search.json`` (what was searched: the scenario and the
options, so that ``--resume`` refuses a different search) and ``priced.jsonl``, one JSON
object per line: a priced layout (keyed by :attr:`Layout.key`) or a finished batch
(``{"batch": i, "invalid": n, "out_of_memory": n}``). Lines are appended and flushed
per batch; a line cut short by a kill is ignored on resume, and its batch priced again.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from llmsim.errors import UserError

MANIFEST = "search.json"
PRICED = "priced.jsonl"


class Store:
    """An append-only record of a search's priced layouts and finished batches."""

    def __init__(self, directory: Path | None, manifest: dict[str, Any],
                 resume: bool = False) -> None:
        self.directory = directory
        self.rows: dict[str, dict[str, Any]] = {}
        self.done_batches: set[int] = set()
        self.invalid = self.out_of_memory = 0
        self._file = None
        if directory is None:
            return
        directory.mkdir(parents=True, exist_ok=True)
        manifest_path, priced = directory / MANIFEST, directory / PRICED
        if resume:
            if not manifest_path.exists():
                raise UserError(f"--resume: {directory} holds no search ({MANIFEST} missing); "
                                "start it without --resume")
            before = json.loads(manifest_path.read_text())
            if before != manifest:
                raise UserError(f"--resume: {directory} holds a different search (scenario or "
                                "options differ); use the same ones or another directory")
            self._read(priced)
        else:
            if priced.exists() and priced.stat().st_size:
                raise UserError(f"--out: {directory} already holds a search; add --resume to "
                                "continue it, or choose an empty directory")
            manifest_path.write_text(json.dumps(manifest, indent=2, sort_keys=True))
        self._file = priced.open("a", encoding="utf-8")

    def _read(self, path: Path) -> None:
        if not path.exists():
            return
        batches: dict[int, dict[str, Any]] = {}
        pending: list[dict[str, Any]] = []
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # cut short by a kill: its batch has no end line and is redone
            if "batch" in record:
                batches[record["batch"]] = record
                for r in pending:
                    self.rows[r["key"]] = r
                pending = []
            else:
                pending.append(record)
        for index, record in batches.items():
            self.done_batches.add(index)
            self.invalid += record["invalid"]
            self.out_of_memory += record["out_of_memory"]

    def add(self, index: int, rows: list[dict[str, Any]], invalid: int,
            out_of_memory: int) -> None:
        """Record one finished batch (its rows, then its end line)."""
        self.done_batches.add(index)
        self.invalid += invalid
        self.out_of_memory += out_of_memory
        for r in rows:
            self.rows[r["key"]] = r
        if self._file is not None:
            for r in rows:
                self._file.write(json.dumps(_plain(r)) + "\n")
            self._file.write(json.dumps({"batch": index, "invalid": invalid,
                                         "out_of_memory": out_of_memory}) + "\n")
            self._file.flush()

    def close(self) -> None:
        """Close the file (the record stays on disk)."""
        if self._file is not None:
            self._file.close()
            self._file = None


def _plain(r: dict[str, Any]) -> dict[str, Any]:
    """JSON has no infinity: a non-finite number is stored as null."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
            for k, v in r.items()}
