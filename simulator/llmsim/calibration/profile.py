"""Calibration profiles as files: built from measurement files, updated in place, summarised,
loaded and saved as YAML."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import yaml

from llmsim.calibration.gemm_csv import parse_gemm_csv
from llmsim.calibration.nccl_tests import parse_nccl_tests
from llmsim.calibration.points import Calibration, CollectivePoint, GemmPoint
from llmsim.errors import UserError
from llmsim.loader import read_yaml, validate


def build_calibration(
    gemm_csvs: Iterable[str | Path] = (),
    nccl_outputs: Iterable[str | Path] = (),
    source: str = "",
) -> Calibration:
    """A profile from measurement files: GEMM CSVs and nccl-tests outputs."""
    gemm = [p for f in gemm_csvs for p in parse_gemm_csv(f)]
    collectives = [p for f in nccl_outputs for p in parse_nccl_tests(f)]
    return Calibration(source=source, gemm=gemm, collectives=collectives)


def update_profile(
    path: str | Path,
    gemm: list[GemmPoint] | None = None,
    collectives: list[CollectivePoint] | None = None,
    source: str | None = None,
) -> Calibration:
    """Write the profile at ``path``, replacing the parts given and keeping the others.

    ``llmsim calibrate gemm`` and ``llmsim calibrate nccl`` build one profile this way: each
    rewrites its own table of an existing profile (or starts a new one), so re-running a
    command does not duplicate points.
    """
    path = Path(path)
    cal = load_calibration(path) if path.exists() else Calibration()
    update: dict[str, object] = {}
    if gemm is not None:
        update["gemm"] = gemm
    if collectives is not None:
        update["collectives"] = collectives
    if source is not None:
        update["source"] = source
    cal = cal.model_copy(update=update)
    try:
        save_calibration(cal, path)
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror}; check the --out path") from None
    return cal


def gemm_summary(points: Iterable[GemmPoint]) -> list[dict[str, object]]:
    """Per dtype: how many shapes were measured and their achieved TFLOP/s range."""
    by_dtype: dict[str, list[float]] = {}
    for p in points:
        by_dtype.setdefault(p.dtype, []).append(p.tflops)
    return [{"dtype": dtype, "shapes": len(values), "min_tflops": min(values),
             "max_tflops": max(values)} for dtype, values in by_dtype.items()]


def collective_summary(points: Iterable[CollectivePoint]) -> list[dict[str, object]]:
    """Per (collective, ranks, nodes): the sizes measured and the best bus bandwidth."""
    groups: dict[tuple[str, int, int], list[CollectivePoint]] = {}
    for p in points:
        groups.setdefault((p.collective, p.ranks, p.nodes), []).append(p)
    return [{"collective": c, "ranks": r, "nodes": n, "sizes": len(g),
             "min_bytes": min(p.bytes for p in g), "max_bytes": max(p.bytes for p in g),
             "max_busbw_gbps": max(p.busbw_gbps for p in g)} for (c, r, n), g in groups.items()]


def load_calibration(path: str | Path) -> Calibration:
    """Load a YAML calibration profile (as written by :func:`save_calibration`)."""
    path = Path(path)
    return validate(Calibration, read_yaml(path), path.name)


def save_calibration(cal: Calibration, path: str | Path) -> None:
    """Write a profile as YAML, one flow-style mapping per point."""
    data = cal.model_dump(mode="json")
    Path(path).write_text(
        yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=120),
        encoding="utf-8",
    )
