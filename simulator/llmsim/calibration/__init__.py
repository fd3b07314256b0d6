"""Calibration profiles: measured GEMM throughput and collective bandwidth tables.

A profile replaces parts of the analytical cost models (see ``docs/calibration.md``):

* ``gemm`` points (M, N, K, dtype, achieved TFLOP/s) replace the GEMM efficiency model;
* ``collectives`` points (collective, ranks, nodes, message bytes, bus bandwidth) replace
  the α–β model of that collective.

Measurements come in as a CSV of GEMM timings and as the plain-text output of
nccl-tests / rccl-tests (``all_reduce_perf``, ``all_gather_perf``, ``reduce_scatter_perf``,
``sendrecv_perf``); a profile is stored as YAML. Every malformed input raises a
:class:`~llmsim.errors.UserError` naming the file and the line. :func:`gemm_shapes` lists
the GEMMs a scenario runs, the shapes worth timing for its GEMM table.

The parts: :mod:`~llmsim.calibration.points` (what a profile holds),
:mod:`~llmsim.calibration.gemm_csv` and :mod:`~llmsim.calibration.nccl_tests` (reading
measurements), :mod:`~llmsim.calibration.profile` (profile files) and
:mod:`~llmsim.calibration.shapes` (the GEMMs to time).
"""

from llmsim.calibration.gemm_csv import GEMM_COLUMNS, parse_gemm_csv
from llmsim.calibration.nccl_tests import NCCL_TESTS, parse_nccl_tests
from llmsim.calibration.points import DTYPES, Calibration, CollectivePoint, GemmPoint, bus_factor
from llmsim.calibration.profile import (
    build_calibration,
    collective_summary,
    gemm_summary,
    load_calibration,
    save_calibration,
    update_profile,
)
from llmsim.calibration.shapes import SHAPE_COLUMNS, gemm_shapes

__all__ = [
    "DTYPES",
    "GEMM_COLUMNS",
    "NCCL_TESTS",
    "SHAPE_COLUMNS",
    "Calibration",
    "CollectivePoint",
    "GemmPoint",
    "build_calibration",
    "bus_factor",
    "collective_summary",
    "gemm_shapes",
    "gemm_summary",
    "load_calibration",
    "parse_gemm_csv",
    "parse_nccl_tests",
    "save_calibration",
    "update_profile",
]
