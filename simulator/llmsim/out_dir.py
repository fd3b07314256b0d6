"""The ``--out`` folder of a command, checked before any work starts."""

from __future__ import annotations

from pathlib import Path

from llmsim.errors import UserError


def check_out_dir(path: Path) -> None:
    """Refuse an ``--out`` folder that cannot be written, before any simulation runs."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".llmsim-write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise UserError(f"--out {str(path)!r}: cannot write there ({exc.strerror}); give a "
                        "folder you can write to") from None
