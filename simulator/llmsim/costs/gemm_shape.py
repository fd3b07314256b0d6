"""Tile and wave quantisation of a GEMM on a device's compute units (NVIDIA, "Matrix
Multiplication Background User's Guide", DU-09799-001, 2023, §3.1–3.2);
:mod:`llmsim.costs.compute` prices GEMMs on it."""

from __future__ import annotations

import math
from dataclasses import dataclass

from llmsim.specs import GemmModel


@dataclass(frozen=True, slots=True)
class GemmShape:
    """How a GEMM of M×N×K (``batch`` of them) maps onto output tiles and waves.

    NVIDIA, "Matrix Multiplication Background User's Guide" (DU-09799-001, 2023),
    §3.1 tile quantisation and §3.2 wave quantisation: the output is cut into
    ``tile_m × tile_n`` tiles, one thread block each; partial tiles still cost a whole
    tile, and the last wave of tiles over the ``compute_units`` idles the units it
    does not fill.
    """

    tiles: int
    """Output tiles: batch · ⌈M/tile_m⌉ · ⌈N/tile_n⌉."""
    waves: int
    """⌈tiles / units⌉ over the compute units the GEMM runs on."""
    wave_efficiency: float
    """tiles / (waves · compute_units): busy share of all the device's units over the waves."""
    padded_flops: float
    """2 · batch · (⌈M/tile_m⌉·tile_m) · (⌈N/tile_n⌉·tile_n) · K: work of the padded tiles."""
    k_efficiency: float
    """K / (K + k_fill): per-tile main-loop fill and drain."""


def gemm_shape(
    m: int, n: int, k: int, batch: int, gemm: GemmModel, units: int | None = None
) -> GemmShape:
    """Tile and wave quantisation of one (batched) GEMM run on ``units`` of the device's
    compute units (all of them by default); see :class:`GemmShape`. The wave efficiency
    is the busy share of *all* the device's units, so units held by other kernels cost
    whole waves."""
    units = gemm.compute_units if units is None else units
    tiles_m = math.ceil(m / gemm.tile_m)
    tiles_n = math.ceil(n / gemm.tile_n)
    tiles = batch * tiles_m * tiles_n
    waves = math.ceil(tiles / units)
    return GemmShape(
        tiles=tiles,
        waves=waves,
        wave_efficiency=tiles / (waves * gemm.compute_units),
        padded_flops=2.0 * batch * (tiles_m * gemm.tile_m) * (tiles_n * gemm.tile_n) * k,
        k_efficiency=k / (k + gemm.k_fill),
    )
