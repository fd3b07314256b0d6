"""Heterogeneous jobs: data-parallel replicas (whole pipelines) on node groups.

A scenario's ``placement.replicas`` puts each data-parallel replica, a whole pipeline of
``tp·pp·cp·ep`` devices with the same layout and layer split, on one node group
(docs/heterogeneous.md). Replicas meet only at the gradient reduction, so:

- **the batch is balanced** by :func:`balance_micro_batches`: each micro-batch goes to
  the replica that would finish it first, on its group's priced time per micro-batch, so
  the replicas finish together (micro-batches in proportion to their throughput where
  that is whole; capped by what fits in their memory);
- **each group's replica is simulated alone** on its group's hardware with its own
  micro-batches (:func:`replica_runs`), its gradient reduction and ZeRO gathers — the
  collectives of the data-parallel group, which spans the groups — priced as the slower
  of the groups' own paths for it (:class:`ReplicaCosts`, the rule of
  :class:`llmsim.hetero.SlowerPath`);
- **the step waits for the slowest replica** (:func:`combined`): the step time is the
  longest of the groups' simulated steps. A bucket's reduction in each group's run starts
  when that group's own gradients are ready; across groups it would wait for the latest
  group, so where another group's buckets come later the step is a lower bound by up to
  that gap (without binding memory caps the balance makes the replicas finish within
  about one micro-batch's time of each other; with them the capped group finishes first
  and the slowest run is exact).

Two identical groups give exactly the homogeneous run (tests/test_hetero_replicas.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from llmsim import hetero
from llmsim.costs import CostModel
from llmsim.costs.host_issue import HostIssue
from llmsim.costs.jitter import jittered
from llmsim.memory import StageMemory, memory_per_stage
from llmsim.ops import CommOp, ComputeOp
from llmsim.partition import stage_layers
from llmsim.result import Result
from llmsim.specs import Scenario

DP_AXES = ("dp", "stage", "cp+ep+dp", "cp+dp")
"""Axes whose groups hold ranks of every data-parallel replica, so span the node groups."""


def balance_micro_batches(micro_batches: int, seconds: list[float], extra_s: list[float],
                          most: list[int] | None = None) -> list[int]:
    """Micro-batches per replica that make the slowest replica as fast as possible.

    Replica ``r`` takes ``c_r + m_r · t_r`` for ``m_r`` micro-batches of ``t_r`` seconds
    (its slowest stage's forward and backward of one micro-batch, the 1F1B steady state)
    beside ``c_r`` (``extra_s``: the pipeline's fill and drain, the other stages' times of
    one micro-batch); the step waits for the slowest. The rule is
    :func:`llmsim.hetero.balance_layers`'s: every replica starts with one micro-batch and
    each further one goes to the replica that would finish it first (ties: the earlier
    replica), optimal for unit jobs on machines of different speeds (Q|p_j=1|C_max;
    Dessouky, Lageweg, Lenstra and van de Velde 1990). Without fill and drain, where the
    shares ``micro_batches · (1/t_r) / Σ_q (1/t_q)`` are whole, it gives exactly them.
    ``most`` caps each replica (what fits in its memory, :func:`most_micro_batches`).
    """
    return hetero.balance_layers(micro_batches, seconds, extra_s, most)


def replica_seconds(scenario: Scenario, costs: CostModel) -> tuple[float, float]:
    """One replica's priced time per micro-batch on ``costs``' group: (``t``, the slowest
    stage's forward, recompute and backward of one micro-batch; ``c``, the other stages'
    sum, the pipeline's fill and drain), seconds (the model of
    :func:`balance_micro_batches`)."""
    layer_s, embedding_s, head_s = hetero.seconds_per_layer(scenario, costs)
    split = stage_layers(scenario.model.layers, scenario.parallelism)
    per_stage = [n * layer_s for n in split]
    per_stage[0] += embedding_s
    per_stage[-1] += head_s
    return max(per_stage), sum(per_stage) - max(per_stage)


def most_micro_batches(scenario: Scenario, group: str, total: int,
                       headroom: float | None = None) -> int:
    """The most micro-batches (up to ``total``) a replica on ``group`` runs with every stage
    in its accelerator's memory less ``headroom`` (a share, default
    ``placement.memory_headroom``; :func:`llmsim.memory.memory_per_stage`: the
    micro-batches in flight grow with them under GPipe, not past ``pp`` under 1F1B); 0:
    not even one."""
    assert scenario.placement is not None
    free = scenario.placement.memory_headroom if headroom is None else headroom

    def fits(m: int) -> bool:
        return all(hetero.fits_with(row, free) for row in _memory(scenario, group, m))
    if fits(total):
        return total
    if not fits(1):
        return 0
    low, high = 1, total  # fits(low), not fits(high): memory grows with the micro-batches
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low


def _memory(scenario: Scenario, group: str, micro_batches: int) -> list[StageMemory]:
    """Peak memory per stage of a replica on ``group`` running ``micro_batches``."""
    sub = replica_scenario(scenario, group, micro_batches)
    return memory_per_stage(sub.model, sub.parallelism, sub.training, sub.dp,
                            sub.system.node.accelerator)


def micro_batch_split(scenario: Scenario) -> list[int]:
    """Micro-batches of each replica, in placement order: as given, or balanced by
    throughput (:func:`balance_micro_batches`)."""
    placement = scenario.placement
    assert placement is not None and placement.by_replicas
    if placement.balance == "given":
        return [r.micro_batches or 0 for r in placement.replicas for _ in range(r.replicas)]
    par = scenario.parallelism
    total = scenario.training.global_batch // (par.micro_batch * par.ep)
    costs = hetero.group_costs(scenario)
    timing = {name: replica_seconds(scenario, c) for name, c in costs.items()}
    groups = placement.group_of_replica()  # the scenario holds a micro-batch for each
    caps = {name: most_micro_batches(scenario, name, total) for name in costs}
    if not hetero.holds_all([caps[g] for g in groups], total) \
            and placement.memory_headroom > 0:  # the headroom given up, as for layers
        caps = {name: most_micro_batches(scenario, name, total, 0.0) for name in costs}
    return balance_micro_batches(total, [timing[g][0] for g in groups],
                                 [timing[g][1] for g in groups], [caps[g] for g in groups])


def replica_scenario(scenario: Scenario, group: str, micro_batches: int) -> Scenario:
    """The job as if every replica ran on ``group`` with ``micro_batches`` each: the
    group's node design and network (:func:`llmsim.hetero.job_system`), the same layout
    and data-parallel degree, no placement."""
    system = hetero.job_system(scenario, group)
    par = scenario.parallelism
    batch = micro_batches * par.micro_batch * scenario.dp * par.ep
    return scenario.model_copy(update={
        "system": system, "placement": None,
        "nodes": scenario.devices // system.node.devices_per_node,
        "training": scenario.training.model_copy(update={"global_batch": batch})})


class ReplicaCosts:
    """A replica's cost model: its group's prices, but the collectives of groups that
    span the replicas (:data:`DP_AXES`) at the slowest group's price on its own path."""

    def __init__(self, own: CostModel, groups: list[CostModel]) -> None:
        self.own, self.groups = own, groups

    @property
    def host_issue(self) -> HostIssue:
        """The replica's group's host issue."""
        return self.own.host_issue

    def compute_s(self, op: ComputeOp) -> float:
        """``op`` on the replica's group, seconds."""
        return self.own.compute_s(op)

    def comm_s(self, op: CommOp) -> float:
        """``op`` on the replica's group, or across the groups the slowest path, seconds."""
        if op.axis in DP_AXES:
            return max(c.comm_s(op) for c in self.groups)
        return self.own.comm_s(op)


def replica_runs(scenario: Scenario, split: list[int], costs: CostModel | None = None
                 ) -> dict[tuple[str, int], tuple[Scenario, CostModel]]:
    """Per distinct (group, micro-batches) of the replicas (``split``: each replica's
    micro-batches, :func:`micro_batch_split`), the scenario to simulate and its cost model
    (``costs`` for every group when given, as in a what-if study)."""
    assert scenario.placement is not None
    prices = hetero.group_costs(scenario) if costs is None else {}
    across = list(prices.values())
    out: dict[tuple[str, int], tuple[Scenario, CostModel]] = {}
    for group, m in zip(scenario.placement.group_of_replica(), split, strict=True):
        if (group, m) not in out:
            sub = replica_scenario(scenario, group, m)
            model = costs if costs is not None else jittered(
                ReplicaCosts(prices[group], across), sub)
            out[(group, m)] = (sub, model)
    return out


@dataclass
class ReplicasResult(Result):
    """A job of data-parallel replicas on node groups: the slowest replica's step, trace
    and breakdown, the whole job's FLOPs, memory and devices."""

    runs: dict[tuple[str, int], Result] = field(default_factory=dict)
    """(group, micro-batches) → that replica's simulated step."""
    split: list[int] = field(default_factory=list)
    """Micro-batches of each replica, in placement order."""

    def _replica_flops(self, hardware: bool) -> float:
        assert self.scenario.placement is not None
        total = 0.0
        for group, m in zip(self.scenario.placement.group_of_replica(), self.split,
                            strict=True):
            run = self.runs[(group, m)]
            flops = run.workload.hardware_flops() if hardware else run.workload.model_flops()
            total += flops / self.scenario.dp  # one replica's share of that run
        return total

    @property
    def model_flops_per_step(self) -> float:
        """Model FLOPs of one step: every replica's micro-batches (no recompute)."""
        return self._replica_flops(hardware=False)

    @property
    def hardware_flops_per_step(self) -> float:
        """FLOPs executed in one step by every replica, recompute included."""
        return self._replica_flops(hardware=True)

    def to_dict(self) -> dict[str, Any]:
        """:meth:`Result.to_dict` with the replicas of each group and their steps."""
        out = super().to_dict()
        s = self.scenario
        assert s.placement is not None
        out["placement"] = {"replicas": group_rows(self), "balance": s.placement.balance,
                            "micro_batches_per_replica": self.split}
        return out


def combined(scenario: Scenario, runs: dict[tuple[str, int], Result], split: list[int]
             ) -> ReplicasResult:
    """The job's result from each group's replica run (``split``: each replica's
    micro-batches): the step waits for the slowest."""
    slowest = max(runs.values(), key=lambda r: r.step_time_s)
    memory = [max((run.memory[s] for run in runs.values()),
                  key=lambda m: m.total_bytes / m.capacity_bytes)
              for s in range(scenario.parallelism.pp)]
    return ReplicasResult(scenario=scenario, workload=slowest.workload, trace=slowest.trace,
                          memory=memory, step_time_s=slowest.step_time_s,
                          stages=slowest.stages,
                          bubble_fraction_per_stage=slowest.bubble_fraction_per_stage,
                          runs=runs, split=split)


def group_rows(result: ReplicasResult) -> list[dict[str, object]]:
    """One row per node group: its replicas, their micro-batches and simulated steps, the
    nodes and devices it uses, its accelerator and network."""
    s = result.scenario
    assert s.placement is not None
    used = s.group_nodes()
    rows: list[dict[str, object]] = []
    for name, count in s.placement.replica_counts().items():
        system = s.system.group(name)
        mine = sorted({m for g, m in zip(s.placement.group_of_replica(), result.split,
                                         strict=True) if g == name})
        nodes, devices = used[name]
        rows.append({"group": name, "replicas": count, "micro_batches": mine,
                     "step_s": [result.runs[(name, m)].step_time_s for m in mine],
                     "nodes": nodes, "of_nodes": system.nodes, "devices": devices,
                     "accelerator": system.node.accelerator.name,
                     "network": system.network.name})
    return rows


def gradient_bucket(result: ReplicasResult) -> dict[str, object] | None:
    """The first stage's gradient bucket reduction: its size, each group's price on its
    own path and the price across (the slowest); None without data parallelism."""
    buckets = result.workload.dp_grad_buckets(result.workload.chunks[(0, 0)])
    if not buckets:
        return None
    op = buckets[0][1]
    prices = {name: c.comm_s(op) for name, c in hetero.group_costs(result.scenario).items()}
    return {"bytes": op.bytes, "collective": op.collective, "per_group_s": prices,
            "across_s": max(prices.values())}
