"""Measured collective tables: nccl-tests bus bandwidth by message size, interpolated,
replacing the model for the collectives they cover."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable

import numpy as np

from llmsim.calibration import CollectivePoint, bus_factor
from llmsim.ops import Collective


class _Series:
    """busbw(size) of one (collective, ranks, nodes), sorted by size."""

    def __init__(self, ranks: int, nodes: int, sizes: dict[int, list[float]]) -> None:
        self.ranks, self.nodes = ranks, nodes
        self.sizes = np.array(sorted(sizes), dtype=float)
        self.busbw = np.array([sum(sizes[s]) / len(sizes[s]) for s in sorted(sizes)]) * 1e9
        self.log_sizes = np.log(self.sizes)

    def time_s(self, collective: Collective, ranks: int, nbytes: float) -> float:
        """t = S / algbw, algbw = busbw(S) / factor(n), busbw interpolated in log S.

        Below the smallest measured size the smallest size's time is used (latency
        bound); above the largest, its busbw. Measured times are made monotone by a
        running maximum, so a bigger message never takes less time even when the
        measured busbw jumps (protocol switches).
        """
        factor = bus_factor(collective, ranks)
        measured = np.maximum.accumulate(self.sizes * factor / self.busbw)
        if nbytes <= self.sizes[0]:
            return float(measured[0])
        i = int(np.searchsorted(self.sizes, nbytes, side="right")) - 1
        busbw = float(np.interp(math.log(nbytes), self.log_sizes, self.busbw))
        return max(float(measured[i]), nbytes * factor / busbw)


class CollectiveTable:
    """Measured nccl-tests bus bandwidths, looked up for a group's shape.

    For a group of n ranks on N nodes, the measured series of that collective closest
    in shape is used: smallest |log(k_meas/k)| + |log(N_meas/N)| (k = ranks per node),
    then closest rank count, then fewer ranks. With single-node sweeps this is the
    closest measured rank count.
    """

    def __init__(self, points: Iterable[CollectivePoint]) -> None:
        grouped: dict[tuple[str, int, int], dict[int, list[float]]] = defaultdict(
            lambda: defaultdict(list)
        )
        for p in points:
            grouped[(p.collective, p.ranks, p.nodes)][p.bytes].append(p.busbw_gbps)
        self._series: dict[str, list[_Series]] = defaultdict(list)
        for (collective, ranks, nodes), sizes in sorted(grouped.items()):
            self._series[collective].append(_Series(ranks, nodes, sizes))

    def covers(self, collective: Collective) -> bool:
        """Whether ``collective`` was measured."""
        return bool(self._series.get(collective))

    def series_for(self, collective: Collective, ranks: int, nodes: int) -> _Series:
        """The measured series closest to a group of ``ranks`` on ``nodes``."""
        per_node = ranks / nodes

        def distance(s: _Series) -> tuple[float, float, int]:
            shape = abs(math.log(s.ranks / s.nodes / per_node)) + abs(math.log(s.nodes / nodes))
            return (round(shape, 12), abs(math.log(s.ranks / ranks)), s.ranks)

        return min(self._series[collective], key=distance)

    def time_s(self, collective: Collective, ranks: int, nodes: int, nbytes: float) -> float:
        """Measured time of ``collective`` on ``ranks`` over ``nodes`` (must be covered)."""
        return self.series_for(collective, ranks, nodes).time_s(collective, ranks, nbytes)
