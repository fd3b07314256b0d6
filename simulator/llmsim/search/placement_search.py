"""The placement of a heterogeneous job, searched: which node group runs which pipeline
stages, or which data-parallel replicas (docs/heterogeneous.md).

A machine of several node groups (ABCI's A100 and V100 nodes) runs one job two ways
(:class:`~llmsim.specs.placement.Placement`): consecutive pipeline stages on each group,
every stage on ``tp·dp`` devices of its group and the layers split by the groups'
priced speed (:func:`llmsim.hetero.balanced`), or whole pipelines of ``tp·pp`` devices
on each group, the batch split by their speed (:mod:`llmsim.hetero_replicas`). The
layout search's estimator prices one group's hardware, so this search prices each
candidate with the engine itself: the candidates are few (tens), and a
step of the 83-stage ABCI job takes the engine about 2 s.

The candidates (:func:`candidates`): tensor-parallel degrees the model allows up to the
smallest node (so a TP group never leaves a node of any group); with ``stages``, every
data-parallel degree dividing the batch whose stage of ``tp·dp`` devices fills whole
nodes of every group, each group holding as many stages as its devices allow and every
group at least one, in each order of the groups (the first stages hold the most
micro-batches in flight: the group with the larger memory goes first, or not); with
``replicas``, every pipeline degree dividing the layers, each group holding as many
whole ``tp·pp`` pipelines as fill whole nodes of it; each with ZeRO 1 and 2 and full or
selective recompute, 1F1B, one sequence per micro-batch and sequence parallelism where
tp > 1, the scenario's other settings kept. Layouts that do not fit (the memory model,
:func:`fits_at_all` before the engine runs) or that the placement rules refuse are
counted, not ranked. The search's memory headroom (10 % unless given) goes into each
candidate's ``placement.memory_headroom``, which the layer and batch balance leave free
on every device (:func:`llmsim.hetero.most_layers_that_fit`).
"""

from __future__ import annotations

import itertools
import math
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from llmsim.errors import UserError
from llmsim.search import DEFAULT_HEADROOM
from llmsim.search.layout import SWITCHES
from llmsim.search.space import divisors, tp_candidates
from llmsim.specs import Scenario

ZEROS = (1, 2)
"""ZeRO stages tried (both shard the optimizer state over the data-parallel ranks; ZeRO-3's
per-layer gathers take the engine minutes a step on these jobs)."""
RECOMPUTES = ("full", "selective")


@dataclass(frozen=True, slots=True, order=True)
class GroupLayout:
    """One candidate: the parallel degrees and what each node group runs."""

    by: str
    """``stages`` (pipeline stages on groups) or ``replicas`` (whole pipelines on groups)."""
    tp: int
    pp: int
    dp: int
    zero: int
    recompute: str
    groups: tuple[tuple[str, int], ...]
    """(group, its stages or replicas), in placement order."""

    @property
    def key(self) -> str:
        """``stages.tp4.pp83.dp16.z1.full.a100x15+v100x68``."""
        runs = "+".join(f"{g}x{n}" for g, n in self.groups)
        return f"{self.by}.tp{self.tp}.pp{self.pp}.dp{self.dp}.z{self.zero}.{self.recompute}.{runs}"

    @property
    def devices(self) -> int:
        """Devices the job uses."""
        return self.tp * self.pp * self.dp

    def placement(self) -> dict[str, Any]:
        """The scenario's ``placement`` field."""
        if self.by == "stages":
            return {"stages": [{"group": g, "stages": n} for g, n in self.groups],
                    "balance": "throughput"}
        return {"replicas": [{"group": g, "replicas": n} for g, n in self.groups],
                "balance": "throughput"}


def group_devices(scenario: Scenario) -> dict[str, tuple[int, int]]:
    """Per node group of the scenario's system: (its devices, devices per node)."""
    return {g.name: (g.system.devices, g.system.node.devices_per_node)
            for g in scenario.system.groups}


def candidates(scenario: Scenario) -> Iterator[GroupLayout]:
    """Every candidate placement of ``scenario``'s model on its system's groups (module
    docstring)."""
    groups = group_devices(scenario)
    if len(groups) < 2:
        raise UserError(f"scenario {scenario.name!r}: system {scenario.system.name!r} has "
                        f"{len(groups)} node group(s); a placement search needs a system of "
                        "several (hardware/systems/abci.yaml); search a one-group system with "
                        "the layout search")
    node_lcm = math.lcm(*(dpn for _, dpn in groups.values()))
    smallest = min(dpn for _, dpn in groups.values())
    layers, batch = scenario.model.layers, scenario.training.global_batch
    for tp in tp_candidates(scenario, smallest):
        if smallest % tp:  # a TP group within a node of every group
            continue
        yield from _stages(tp, groups, node_lcm, layers, batch)
        yield from _replicas(tp, groups, layers, batch)


def _settings() -> Iterator[tuple[int, str]]:
    return itertools.product(ZEROS, RECOMPUTES)


def _stages(tp: int, groups: dict[str, tuple[int, int]], node_lcm: int, layers: int,
            batch: int) -> Iterator[GroupLayout]:
    for dp in divisors(batch):
        stage = tp * dp
        if stage % node_lcm or dp < 2:
            continue
        counts = {name: devices // stage for name, (devices, _) in groups.items()}
        pp = sum(counts.values())
        if min(counts.values()) < 1 or pp > layers:
            continue
        for order in itertools.permutations(counts):
            for zero, recompute in _settings():
                yield GroupLayout("stages", tp, pp, dp, zero, recompute,
                                  tuple((name, counts[name]) for name in order))


def _replicas(tp: int, groups: dict[str, tuple[int, int]], layers: int,
              batch: int) -> Iterator[GroupLayout]:
    for pp in divisors(layers):
        pipeline = tp * pp
        counts = {}
        for name, (devices, dpn) in groups.items():
            n = devices // pipeline
            while n and n * pipeline % dpn:
                n -= 1
            counts[name] = n
        dp = sum(counts.values())
        if min(counts.values()) < 1 or dp < 2 or batch < dp \
                or any(pipeline * dp % dpn for _, dpn in groups.values()):
            continue
        for zero, recompute in _settings():
            yield GroupLayout("replicas", tp, pp, dp, zero, recompute,
                              tuple(counts.items()))


def apply_placement(scenario: Scenario, layout: GroupLayout,
                    memory_headroom: float = DEFAULT_HEADROOM) -> Scenario:
    """``scenario`` with ``layout``'s placement and degrees, in reduced fidelity, validated
    (raises ValueError when a rule refuses it); its balance leaves ``memory_headroom`` of
    each device's memory free (``placement.memory_headroom``)."""
    par = scenario.parallelism
    updates = {"tp": layout.tp, "pp": layout.pp, "dp": layout.dp, "zero": layout.zero,
               "recompute": layout.recompute, "schedule": "1f1b", "virtual_stages": 1,
               "micro_batch": 1, "sequence_parallel": layout.tp > 1,
               "overlap_tp_comm": False, "layers_per_stage": None,
               "first_stage_layers": None, "last_stage_layers": None}
    new_par = type(par).model_validate({**par.model_dump(exclude_unset=True), **updates})
    fields = {name: getattr(scenario, name) for name in type(scenario).model_fields}
    return type(scenario).model_validate({
        **fields, "nodes": None, "parallelism": new_par,
        "placement": {**layout.placement(), "memory_headroom": memory_headroom},
        "fidelity": "reduced"})


def fits_at_all(scenario: Scenario) -> bool:
    """Whether the memory model lets ``scenario``'s placement run at all, before the
    engine is asked: with stages, every stage holds a layer and together they hold the
    model (:func:`llmsim.hetero.most_layers_that_fit`); with replicas, a replica of every
    group runs a micro-batch and together they run the batch, both with the placement's
    ``memory_headroom`` left free
    (:func:`llmsim.hetero_replicas.most_micro_batches`)."""
    from llmsim import hetero, hetero_replicas

    placement = scenario.placement
    assert placement is not None
    if not placement.by_replicas:
        most = hetero.most_layers_that_fit(scenario)
        return min(most) > 0 and sum(most) >= scenario.model.layers
    total = scenario.training.global_batch // scenario.parallelism.micro_batch
    held = 0
    for name, replicas in placement.replica_counts().items():
        most = hetero_replicas.most_micro_batches(scenario, name, total)
        if most == 0:
            return False
        held += most * replicas
    return held >= total


OBJECTIVE_COLUMNS = {"days": ("days", False), "step_time": ("step_time_s", False),
                     "mfu": ("mfu", True), "tokens_per_device": ("tokens_per_device_s", True)}


@dataclass(frozen=True, slots=True)
class PlacementSearch:
    """What :func:`search_placements` looked at."""

    candidates: int
    """Candidate placements (before the sample)."""
    sampled: bool
    """Whether ``max_candidates`` made it price a seeded sample of them."""
    priced: int
    """Candidates the engine ran that fit."""
    invalid: int
    """Candidates a rule refused (placement, batch, or no layer split that fits)."""
    out_of_memory: int
    """Candidates the engine ran that do not fit in memory less the headroom."""
    wall_s: float


def describe_placement(placement: Any) -> str:
    """``a100×15+v100×68 stages``: what each group runs, on one line."""
    runs = placement.replicas if placement.by_replicas else placement.stages
    counts = "+".join(f"{r.group}×{r.replicas if placement.by_replicas else r.stages}"
                      for r in runs)
    return f"{counts} {'replicas' if placement.by_replicas else 'stages'}"


def search_placements(scenario: Scenario, *, objective: str = "days",
                      memory_headroom: float = DEFAULT_HEADROOM, max_candidates: int | None = None,
                      progress: Callable[[int, int], None] | None = None,
                      ) -> tuple[list[dict[str, Any]], Scenario | None, PlacementSearch]:
    """Price every candidate placement (:func:`candidates`; a sample of
    ``max_candidates`` of them seeded by the scenario's seed when there are more) of
    ``scenario`` with the engine: (the rows of those that fit, best first by
    ``objective``; the best one's scenario or None; the counts). A row holds the
    layout's fields, ``placement`` (:func:`describe_placement`), ``devices``,
    ``idle_devices``, ``memory_gb`` (the fullest device), ``step_time_s``, ``mfu``,
    ``days`` and ``tokens_per_device_s``."""
    from llmsim.simulation import simulate

    if objective not in OBJECTIVE_COLUMNS:
        raise UserError(f"--objective: {objective!r} is not one of "
                        f"{', '.join(OBJECTIVE_COLUMNS)}")
    if not 0 <= memory_headroom < 1:
        raise UserError(f"--memory-headroom: {memory_headroom} must be at least 0 and below 1 "
                        "(a share of device memory, e.g. 0.1)")
    started = time.perf_counter()
    column, larger = OBJECTIVE_COLUMNS[objective]
    layouts = list(candidates(scenario))
    total = len(layouts)
    if max_candidates is not None and total > max_candidates:
        layouts = sorted(random.Random(scenario.seed).sample(layouts, max_candidates))
    machine = scenario.system.all_devices
    rows, scenarios, invalid, oom = [], {}, 0, 0
    for i, layout in enumerate(layouts):
        if progress is not None:
            progress(i, len(layouts))
        try:
            sc = apply_placement(scenario, layout, memory_headroom)
            if not fits_at_all(sc):
                oom += 1
                continue
            result = simulate(sc)
        except (ValueError, UserError):
            invalid += 1
            continue
        peak = max(m.total_bytes / m.capacity_bytes for m in result.memory)
        if not result.fits or peak > 1 - memory_headroom:
            oom += 1
            continue
        scenarios[layout.key] = sc
        tokens = scenario.training.tokens_per_step / result.step_time_s
        par = sc.parallelism
        rows.append({"key": layout.key, "by": layout.by, "tp": layout.tp, "pp": layout.pp,
                     "dp": layout.dp, "virtual_stages": 1, "schedule": par.schedule,
                     "micro_batch": par.micro_batch, "zero": layout.zero,
                     "sequence_parallel": par.sequence_parallel, "recompute": layout.recompute,
                     **{name: getattr(par, name) for name in SWITCHES},
                     "placement": describe_placement(sc.placement),
                     "devices": sc.devices, "idle_devices": machine - sc.devices,
                     "memory_gb": max(m.total_bytes for m in result.memory) / 1e9,
                     "memory_fraction": peak, "step_time_s": result.step_time_s,
                     "mfu": result.mfu, "days": result.days_to_train,
                     "tokens_per_device_s": tokens / sc.devices})
    rows.sort(key=lambda r: (-r[column] if larger else r[column]) if r[column] is not None
              else math.inf)
    best = scenarios[rows[0]["key"]] if rows else None
    return rows, best, PlacementSearch(total, len(layouts) < total, len(rows), invalid, oom,
                                       time.perf_counter() - started)


def placement_table(scenario: Scenario, *, objective: str = "days",
                    memory_headroom: float = DEFAULT_HEADROOM,
                    max_layouts: int | None = None) -> Any:
    """:func:`search_placements` as the layout search's table (``llmsim search`` of a
    scenario with a placement): one row per placement that fits, best first, the
    engine's numbers in the columns the layout search confirms (``step_time_s``,
    ``mfu``, ``days``; no estimator's: ``est_step_time_s`` is empty), ``attrs["summary"]``
    and ``attrs["best"]`` as :func:`llmsim.search.search` sets them."""
    import pandas as pd

    from llmsim.search import SearchSummary, objective_column

    rows, best, info = search_placements(scenario, objective=objective,
                                         memory_headroom=memory_headroom,
                                         max_candidates=max_layouts)
    table = pd.DataFrame(rows)
    if len(table):
        table["est_step_time_s"] = math.nan
        table["est_over_engine"] = math.nan
    table.attrs["summary"] = SearchSummary(
        scenario=scenario.name, objective=objective, machine_devices=scenario.system.all_devices,
        core_layouts=info.candidates, sampled=info.sampled,
        priced=info.priced, invalid=info.invalid, out_of_memory=info.out_of_memory,
        confirmed=info.priced, memory_headroom=memory_headroom, wall_s=info.wall_s,
        estimate_wall_s=0.0, layouts_per_s=0.0)
    table.attrs["best"] = best
    table.attrs["objective_column"] = objective_column(objective)
    return table
