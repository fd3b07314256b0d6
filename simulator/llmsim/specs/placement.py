"""Placement of a heterogeneous job: which node group runs which pipeline stages, or which
data-parallel replicas (whole pipelines)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveInt, model_validator

from llmsim.specs._base import Spec
from llmsim.specs.parallelism import Parallelism
from llmsim.specs.system import System
from llmsim.specs.training import Training


class StageGroup(Spec):
    """A run of consecutive pipeline stages on one node group."""

    group: str
    """The node group's name in ``system.groups``."""
    stages: PositiveInt
    """Consecutive pipeline stages it runs, after those of the entries before it."""


class ReplicaGroup(Spec):
    """Data-parallel replicas (whole pipelines) on one node group."""

    group: str
    """The node group's name in ``system.groups``."""
    replicas: PositiveInt
    """Data-parallel replicas it runs, each a whole pipeline of ``tp·pp·cp·ep`` devices."""
    micro_batches: PositiveInt | None = None
    """Micro-batches each of these replicas runs per step, with ``balance: given``; None:
    computed by ``balance: throughput``."""


class Placement(Spec):
    """Pipeline stages, or data-parallel replicas, on node groups (docs/heterogeneous.md).

    With ``stages``, every stage has the same tensor-, context-, expert- and data-parallel
    degrees, so each runs on ``tp·cp·ep·dp`` devices of its group; the entries, in order,
    cover the ``pp`` stages first to last. With ``replicas``, each group runs whole
    pipelines of the same layout, the entries' replicas adding up to ``dp``, and the
    global batch is split between them (:mod:`llmsim.hetero_replicas`).
    """

    stages: list[StageGroup] = Field(default_factory=list)
    """Stage runs in pipeline order, e.g. ``[{group: a100, stages: 15}, {group: v100,
    stages: 68}]``; empty with ``replicas``."""
    replicas: list[ReplicaGroup] = Field(default_factory=list)
    """Data-parallel replicas per group, e.g. ``[{group: a100, replicas: 2}, {group: v100,
    replicas: 17}]``; empty with ``stages``."""
    balance: Literal["throughput", "given"] = "throughput"
    """With ``stages``, how the layers are split over the stages: ``throughput`` by the rule
    of :func:`llmsim.hetero.balance_layers` (each stage's share in proportion to its
    group's priced speed on one layer, so stage times equalise); ``given``: as
    ``parallelism.layers_per_stage`` says. With ``replicas``, how the micro-batches are
    split over the replicas: ``throughput`` by the same rule on each replica's priced time
    per micro-batch (:func:`llmsim.hetero_replicas.balance_micro_batches`); ``given``: as
    each entry's ``micro_batches`` says."""
    memory_headroom: float = Field(default=0.1, ge=0, lt=1)
    """Share of each device's memory, 0–1, that ``balance: throughput`` leaves free: a
    stage takes no more layers, a replica no more micro-batches, than fit in its capacity
    less this share (:func:`llmsim.hetero.most_layers_that_fit`); where the model does not
    fit with it, the balance fills the memory. 0.1 by default, the layout search's
    ``--memory-headroom``."""

    @model_validator(mode="after")
    def _one_kind(self) -> Placement:
        if bool(self.stages) == bool(self.replicas):
            raise ValueError(
                "placement: give either stages (pipeline stages on groups) or replicas "
                "(data-parallel replicas on groups), exactly one of the two")
        return self

    @property
    def by_replicas(self) -> bool:
        """Whether the placement puts data-parallel replicas (not stages) on groups."""
        return bool(self.replicas)

    def group_names(self) -> list[str]:
        """The node groups the placement uses, in order of first appearance."""
        return list(dict.fromkeys(run.group for run in (*self.stages, *self.replicas)))

    def replica_counts(self) -> dict[str, int]:
        """Data-parallel replicas per node group, in order of first appearance."""
        out: dict[str, int] = {}
        for run in self.replicas:
            out[run.group] = out.get(run.group, 0) + run.replicas
        return out

    def group_of_replica(self) -> list[str]:
        """The node group of each data-parallel replica, in placement order."""
        return [run.group for run in self.replicas for _ in range(run.replicas)]

    def group_of_stage(self) -> list[str]:
        """The node group of each pipeline stage, first to last."""
        return [run.group for run in self.stages for _ in range(run.stages)]

    def stage_counts(self) -> dict[str, int]:
        """Stages per node group, in order of first appearance."""
        out: dict[str, int] = {}
        for run in self.stages:
            out[run.group] = out.get(run.group, 0) + run.stages
        return out


def check_placement(placement: Placement, system: System, par: Parallelism,
                    nodes: int | None) -> None:
    """A heterogeneous placement names known groups, covers the stages and fits
    (docs/heterogeneous.md); a ValueError naming the field and the fix otherwise."""
    if nodes is not None:
        raise ValueError(
            f"nodes: {nodes} with a placement; the placement's stages say how many "
            "nodes of each group the job uses — remove nodes"
        )
    if par.dp == "auto":
        raise ValueError(
            "parallelism.dp: auto with a placement; give the data-parallel degree "
            "(every stage runs on tp·cp·ep·dp devices of its group)"
        )
    if placement.by_replicas:
        check_replicas(placement, system, par)
        return
    staged = sum(run.stages for run in placement.stages)
    if staged != par.pp:
        raise ValueError(
            f"placement.stages: the runs hold {staged} stages but parallelism.pp is "
            f"{par.pp}; make the stages add up to pp"
        )
    if par.rank_order[-1] != "pp":
        raise ValueError(
            f"parallelism.rank_order: {par.rank_order} with a placement; pp must come "
            "last (each stage on whole nodes of one group)"
        )
    if par.pp_scatter_gather != "none":
        raise ValueError(
            f"parallelism.pp_scatter_gather: {par.pp_scatter_gather} with a placement is "
            "not modelled (the sliced messages' gather would run on two groups); set none"
        )
    if placement.balance == "given" and par.layers_per_stage is None:
        raise ValueError(
            "placement.balance: given needs parallelism.layers_per_stage; give the "
            "layers of each stage, or use balance: throughput"
        )
    if placement.balance == "throughput" and (
            par.layers_per_stage is not None or par.first_stage_layers is not None
            or par.last_stage_layers is not None):
        raise ValueError(
            "placement.balance: throughput computes parallelism.layers_per_stage; "
            "remove that field and first_stage_layers / last_stage_layers, or set "
            "balance: given"
        )
    if placement.balance == "throughput" and par.virtual_stages > 1:
        raise ValueError(
            f"parallelism.virtual_stages: {par.virtual_stages} with placement.balance: "
            "throughput, which splits layers per stage only; use 1, or balance: given"
        )
    per_stage = par.tp * par.cp * par.ep * par.dp
    for i, (name, stages) in enumerate(placement.stage_counts().items()):
        try:
            group = system.group(name)
        except ValueError as exc:
            raise ValueError(f"placement.stages[{i}].group: {exc}") from None
        dpn = group.node.devices_per_node
        if per_stage % dpn:
            raise ValueError(
                f"placement.stages: a stage's tp·cp·ep·dp = {per_stage} devices do not "
                f"fill whole nodes of group {name!r} ({dpn} devices each); change tp or dp"
            )
        if stages * per_stage > group.devices:
            raise ValueError(
                f"placement.stages: {stages} stages × {per_stage} devices = "
                f"{stages * per_stage} on group {name!r}, which has {group.devices}; "
                f"use at most {group.devices // per_stage} stages there"
            )


def check_replicas(placement: Placement, system: System, par: Parallelism) -> None:
    """Data-parallel replicas on node groups: known groups, replicas adding up to dp, each
    group's share on whole nodes it has (docs/heterogeneous.md); a ValueError naming the
    field and the fix otherwise."""
    assert isinstance(par.dp, int)
    counts = placement.replica_counts()
    if sum(counts.values()) != par.dp:
        raise ValueError(
            f"placement.replicas: the groups hold {sum(counts.values())} replicas but "
            f"parallelism.dp is {par.dp}; make the replicas add up to dp")
    pipeline = par.tp * par.pp * par.cp * par.ep
    for i, (name, replicas) in enumerate(counts.items()):
        try:
            group = system.group(name)
        except ValueError as exc:
            raise ValueError(f"placement.replicas[{i}].group: {exc}") from None
        dpn = group.node.devices_per_node
        if replicas * pipeline % dpn or pipeline * par.dp % dpn:
            bad = replicas if replicas * pipeline % dpn else par.dp
            raise ValueError(
                f"placement.replicas: {bad} replicas × tp·pp·cp·ep = {pipeline} devices "
                f"do not fill whole nodes of group {name!r} ({dpn} devices each); "
                "change the replicas or tp·pp so that they do")
        if replicas * pipeline > group.devices:
            raise ValueError(
                f"placement.replicas: {replicas} replicas × {pipeline} devices = "
                f"{replicas * pipeline} on group {name!r}, which has {group.devices}; "
                f"use at most {group.devices // pipeline} replicas there")
    if placement.balance == "given" and any(r.micro_batches is None
                                            for r in placement.replicas):
        raise ValueError(
            "placement.balance: given needs micro_batches on every placement.replicas "
            "entry; give them, or use balance: throughput")
    if placement.balance == "throughput" and any(r.micro_batches is not None
                                                 for r in placement.replicas):
        raise ValueError(
            "placement.balance: throughput computes each replica's micro_batches; "
            "remove micro_batches from placement.replicas, or set balance: given")
    if par.schedule == "interleaved-1f1b":
        raise ValueError(
            "parallelism.schedule: interleaved-1f1b with placement.replicas is not "
            "modelled (each replica's micro-batches would have to be a multiple of pp); "
            "use 1f1b or another schedule")


def check_replica_batch(placement: Placement, par: Parallelism, trn: Training,
                        dp: int) -> None:
    """The global batch of a job with replicas on groups: whole micro-batches, at least one
    per replica, and with ``balance: given`` the replicas' micro-batches in all."""
    per = par.micro_batch * par.ep
    total = trn.global_batch // per
    if trn.global_batch % per or total < dp:
        raise ValueError(
            f"training.global_batch: {trn.global_batch} is not {dp} replicas × at "
            f"least one micro-batch of micro_batch·ep = {per} sequences; use a multiple "
            f"of {per}, at least {per * dp}")
    if placement.balance == "given":
        given = sum(r.replicas * (r.micro_batches or 0) for r in placement.replicas)
        if given != total:
            raise ValueError(
                f"placement.replicas: replicas × micro_batches add up to {given} "
                f"micro-batches but training.global_batch holds {total}; make them add "
                "up, or use balance: throughput")
