"""Placement of a heterogeneous job: which node group runs which pipeline stages."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveInt

from llmsim.specs._base import Spec


class StageGroup(Spec):
    """A run of consecutive pipeline stages on one node group."""

    group: str
    """The node group's name in ``system.groups``."""
    stages: PositiveInt
    """Consecutive pipeline stages it runs, after those of the entries before it."""


class Placement(Spec):
    """Pipeline stages on node groups (docs/heterogeneous.md).

    Every stage has the same tensor-, context-, expert- and data-parallel degrees, so each
    runs on ``tp·cp·ep·dp`` devices of its group; the entries, in order, cover the ``pp``
    stages first to last.
    """

    stages: list[StageGroup] = Field(min_length=1)
    """Stage runs in pipeline order, e.g. ``[{group: a100, stages: 15}, {group: v100,
    stages: 68}]``."""
    balance: Literal["throughput", "given"] = "throughput"
    """How the layers are split over the stages: ``throughput`` by the rule of
    :func:`llmsim.hetero.balance_layers` (each stage's share in proportion to its group's
    priced speed on one layer, so stage times equalise); ``given``: as
    ``parallelism.layers_per_stage`` says."""

    def group_of_stage(self) -> list[str]:
        """The node group of each pipeline stage, first to last."""
        return [run.group for run in self.stages for _ in range(run.stages)]

    def stage_counts(self) -> dict[str, int]:
        """Stages per node group, in order of first appearance."""
        out: dict[str, int] = {}
        for run in self.stages:
            out[run.group] = out.get(run.group, 0) + run.stages
        return out
