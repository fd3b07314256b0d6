"""A provable bound that lets a search skip layouts that cannot be among its best.

No device computes faster than its peak, so a layout of ``d`` devices runs a step of
``F`` model FLOPs in at least ``F / (d · peak)`` seconds, and a run of ``R`` FLOPs takes
at least ``R / (d · peak)`` seconds, MFU = 1 (the estimator's MFU is at most 1: its
passes are the engine's kernels, each at most at peak; ``tests/test_search_fast.py``
checks it on the priced samples). With the layouts sorted by devices, most first, the
bound only grows; once it exceeds the ``top``-th best estimate priced so far, no layout
left can enter the estimator's ``top`` best, which are exactly those an unbounded search
would confirm. This holds for the ``days`` objective of a run given in FLOPs
(``training.flops`` without ``training.tokens``: the gpt4 table's); otherwise nothing is
skipped.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence

from llmsim.result import SECONDS_PER_DAY
from llmsim.search.space import Layout
from llmsim.specs import Scenario


def applies(scenario: Scenario, objective: str) -> bool:
    """Whether the bound can prune this search (days of a run given in FLOPs)."""
    training = scenario.training
    return objective == "days" and training.flops is not None and training.tokens is None


class DaysBound:
    """The ``top``-th best estimated days so far, and whether a batch can beat it."""

    def __init__(self, scenario: Scenario, top: int,
                 batches: Mapping[int, list[Layout]]) -> None:
        accel = scenario.system.node.accelerator
        self.run_flops = float(scenario.training.flops or 0.0)
        self.peak_flops = accel.peak_flops(scenario.training.precision)
        self.top = max(1, top)
        self._most = {index: max((c.devices for c in cores), default=1)
                      for index, cores in batches.items()}
        self._best: list[float] = []  # the top smallest days, negated (a max-heap)

    def lower_days(self, devices: int) -> float:
        """The fewest days any layout of ``devices`` devices can take (MFU 1)."""
        return self.run_flops / (devices * self.peak_flops) / SECONDS_PER_DAY

    def add(self, days: Sequence[float | None]) -> None:
        """Record a priced batch's estimated days."""
        for value in days:
            if value is None or value != value:
                continue
            if len(self._best) < self.top:
                heapq.heappush(self._best, -value)
            elif value < -self._best[0]:
                heapq.heapreplace(self._best, -value)

    def keep(self, index: int) -> bool:
        """Whether batch ``index`` may hold a layout among the ``top`` best."""
        if len(self._best) < self.top:
            return True
        return self.lower_days(self._most[index]) <= -self._best[0]
