"""Where a search keeps its results as they are made, so that a killed one can resume.

A search directory holds ``search.json`` (what was searched: the scenario and the
options, so that ``--resume`` refuses a different search) and ``priced.jsonl``, one JSON
object per finished batch: ``{"batch": i, "invalid": n, "out_of_memory": n, "columns":
{name: [value per priced layout]}}`` (keyed by :attr:`Layout.key`). A line is appended
and flushed per batch; a line cut short by a kill is ignored on resume, and its batch
priced again. In memory the rows stay as those columns, batch by batch (a few bytes a
value, not a dict a row), and become one table at the end (:meth:`Store.table`).
"""

from __future__ import annotations

import importlib
import json
import math
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmsim.errors import UserError
from llmsim.search.price import packed

if TYPE_CHECKING:
    import pandas as pd

MANIFEST = "search.json"
PRICED = "priced.jsonl"


class Store:
    """An append-only record of a search's priced layouts and finished batches."""

    def __init__(self, directory: Path | None, manifest: dict[str, Any],
                 resume: bool = False) -> None:
        self.directory = directory
        self._batches: list[dict[str, list[Any]]] = []
        self.priced = 0
        """Layouts priced so far (resumed ones included)."""
        self.done_batches: set[int] = set()
        self.invalid = self.out_of_memory = 0
        self._file = None
        self._pandas: threading.Thread | None = None
        if directory is None:
            return
        directory.mkdir(parents=True, exist_ok=True)
        manifest_path, priced = directory / MANIFEST, directory / PRICED
        if resume:
            if not manifest_path.exists():
                raise UserError(f"--resume: {directory} holds no search ({MANIFEST} missing); "
                                "start it with --out DIR")
            before = json.loads(manifest_path.read_text())
            if before != manifest:
                raise UserError(f"--resume: {directory} holds a different search (scenario or "
                                "options differ); use the same ones or another directory")
            self._read(priced)
        else:
            if priced.exists() and priced.stat().st_size:
                raise UserError(f"--out: {directory} already holds a search; continue it with "
                                f"--resume {directory}, or choose an empty directory")
            manifest_path.write_text(json.dumps(manifest, indent=2, sort_keys=True))
        self._file = priced.open("a", encoding="utf-8")

    def _read(self, path: Path) -> None:
        if not path.exists():
            return
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # cut short by a kill: its batch is redone
            if record["batch"] in self.done_batches:
                continue
            self._keep(record["batch"], packed(record["columns"]), record["invalid"],
                       record["out_of_memory"])

    def _keep(self, index: int, columns: dict[str, Any], invalid: int,
              out_of_memory: int) -> None:
        self.done_batches.add(index)
        self.invalid += invalid
        self.out_of_memory += out_of_memory
        if columns and len(columns["key"]):
            self._batches.append(columns)
            self.priced += len(columns["key"])

    def add(self, index: int, columns: dict[str, Any], invalid: int,
            out_of_memory: int) -> None:
        """Record one finished batch: its priced layouts by column, and its counts.

        The first also starts pandas' import in a thread, for :meth:`table`: serial
        between the pricing and the engine's runs it held a core idle (0.3 s of CPU, a
        second or more of wall on a loaded machine); now it runs while the workers price
        (a pool's workers are forked by then, and the table joins the thread before the
        confirmation forks again)."""
        if self._pandas is None:
            self._pandas = threading.Thread(target=importlib.import_module,
                                            args=("pandas",), daemon=True)
            self._pandas.start()
        self._keep(index, columns, invalid, out_of_memory)
        if self._file is not None:
            self._file.write(json.dumps({"batch": index, "invalid": invalid,
                                         "out_of_memory": out_of_memory,
                                         "columns": _plain(columns)}) + "\n")
            self._file.flush()

    def column(self, name: str) -> list[Any]:
        """One column of every priced layout so far."""
        return [v for batch in self._batches for v in batch.get(name, ())]

    def table(self) -> pd.DataFrame:
        """Every priced layout, one row each (the batches' columns joined); the store lets
        go of its batches, so that they are not held twice."""
        if self._pandas is not None:
            self._pandas.join()
        import pandas as pd

        if not self._batches:
            return pd.DataFrame(columns=["key"])
        names = list(self._batches[0])
        batches, self._batches = self._batches, []
        return pd.DataFrame({name: _joined([batch[name] for batch in batches])
                             for name in names})

    def close(self) -> None:
        """Close the file (the record stays on disk)."""
        if self._file is not None:
            self._file.close()
            self._file = None


def arrow_text(columns: dict[str, Any]) -> dict[str, Any]:
    """``columns`` (:func:`~.price.packed`'s) with each text column as an Arrow string
    array, where pyarrow is installed: UTF-8, a quarter of numpy's UCS-4 to send from a
    worker (selene-gpt3's keys: 24.5 against 97 MB), and taken as it is by
    :meth:`Store.table` where pandas keeps its text in Arrow (pandas 3 with pyarrow)."""
    try:
        import pyarrow as pa
    except ImportError:  # pragma: no cover - pandas' optional dependency
        return columns
    return {name: pa.array(values, type=pa.string())
            if getattr(values, "dtype", None) is not None and values.dtype.kind == "U"
            else values for name, values in columns.items()}


def _joined(chunks: list[Any]) -> Any:
    """One column of the table from its batches' (numpy arrays, or :func:`arrow_text`'s
    Arrow strings): the same values and the same pandas dtype either way (tested)."""
    import numpy as np

    if all(isinstance(chunk, np.ndarray) for chunk in chunks):
        return np.concatenate(chunks)
    import pandas as pd
    import pyarrow as pa

    text = pa.concat_arrays([chunk if isinstance(chunk, pa.Array)
                             else pa.array(chunk, type=pa.string()) for chunk in chunks])
    numpy_text = pd.Series(np.array([""])).dtype  # what pandas makes of numpy's text
    if getattr(numpy_text, "storage", None) == "pyarrow":
        return pd.array(text, dtype=numpy_text)
    return text.to_numpy(zero_copy_only=False)


def _plain(columns: dict[str, Any]) -> dict[str, list[Any]]:
    """Plain lists; JSON has no infinity: a non-finite number is stored as null."""
    return {k: [None if isinstance(v, float) and not math.isfinite(v) else v
                for v in (values.tolist() if hasattr(values, "tolist") else values)]
            for k, values in columns.items()}
