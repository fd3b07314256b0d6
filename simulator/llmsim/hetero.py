"""Heterogeneous jobs: pipeline stages on node groups of different hardware.

A system may hold several node groups (:class:`~llmsim.specs.system.NodeGroup`: ABCI's
A100 nodes and V100 nodes on one InfiniBand fabric), and a scenario's ``placement`` says
which group runs which pipeline stages (docs/heterogeneous.md). Every stage has the same
tp, cp, ep and dp degrees and sits on whole nodes of its group, so:

- **a stage is priced on its group's hardware**: its accelerator, its node's fabric and its
  network (:func:`group_costs`), with the job's groups laid out as they would be if the
  whole job ran on that group's nodes — the same shapes, since a stage's TP, DP and
  stage groups do not leave the stage's nodes;
- **a message between two groups** (the pipeline send at their border, the tied
  embedding's all-reduce between the first and last stage) crosses the fabric both groups
  hang off and is priced as the slower of the two groups' own paths for it
  (:class:`SlowerPath`): a node's injection bandwidth, its leaf's uplink taper and the
  hops of the side that limits it;
- **the layers are balanced** by :func:`balance_layers`: each stage gets layers in
  proportion to its group's priced speed on one layer, so that the slowest stage — the
  one every 1F1B step waits for — is as fast as it can be.

A system of two identical groups gives exactly the homogeneous run (tests/test_hetero.py).
Data-parallel replicas (whole pipelines) on node groups: :mod:`llmsim.hetero_replicas`.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence

from llmsim.blocks import Block
from llmsim.calibration import load_calibration
from llmsim.costs import CostModel, HardwareCosts
from llmsim.costs.alltoall import TokenDispatch
from llmsim.costs.host_issue import HostIssue, host_runs_ahead
from llmsim.engine import Device
from llmsim.errors import UserError
from llmsim.memory import StageMemory, memory_per_stage
from llmsim.ops import CommOp, ComputeOp
from llmsim.plan import Plan
from llmsim.specs import Scenario, System
from llmsim.workload.build import pass_ops


def balance_layers(layers: int, seconds_per_layer: Sequence[float],
                   extra_s: Sequence[float] | None = None,
                   most: Sequence[int] | None = None) -> list[int]:
    """Transformer layers per stage that make the slowest stage as fast as possible.

    Stage ``s`` takes ``e_s + n_s · t_s`` for ``n_s`` layers of ``t_s`` seconds each
    beside ``e_s`` of other work (``extra_s``: the embedding on the first stage, the LM
    head on the last; default none). In 1F1B every step waits for the slowest stage, so
    the rule minimises ``max_s (e_s + n_s · t_s)`` with ``Σ n_s = layers`` and ``n_s ≥ 1``.
    Each stage starts with one layer and each further layer goes to the stage that would
    finish it first (ties: the earlier stage): the earliest-completion greedy rule, optimal
    for unit jobs on machines of different speeds (Q|p_j=1|C_max; Dessouky, Lageweg,
    Lenstra and van de Velde 1990). Without extra work, where the proportional shares
    ``layers · (1/t_s) / Σ_r (1/t_r)`` are whole numbers, it returns exactly them.

    ``most`` caps each stage's layers (what fits in its devices' memory): a full stage
    takes no more, which keeps the rule optimal (it still picks the ``layers`` earliest
    finishing slots ``e_s + k · t_s``, ``k ≤ most_s``); caps that cannot hold every layer
    between them are ignored, and the memory model reports the stage that does not fit.
    """
    stages = len(seconds_per_layer)
    extra = list(extra_s) if extra_s is not None else [0.0] * stages
    caps = list(most) if most is not None and sum(max(1, m) for m in most) >= layers \
        else [layers] * stages
    if stages == 0 or layers < stages:
        raise ValueError(f"{layers} layers cannot give each of {stages} stages one")
    if any(not t > 0 for t in seconds_per_layer):
        raise ValueError(f"seconds per layer {list(seconds_per_layer)} must be positive")
    counts = [1] * stages
    heap = [(extra[s] + 2 * t, s) for s, t in enumerate(seconds_per_layer) if caps[s] > 1]
    heapq.heapify(heap)
    for _ in range(layers - stages):
        _, s = heapq.heappop(heap)
        counts[s] += 1
        if counts[s] < caps[s]:
            heapq.heappush(heap, (extra[s] + (counts[s] + 1) * seconds_per_layer[s], s))
    return counts


class SlowerPath:
    """The cost model of a message between two node groups: the slower side's price."""

    def __init__(self, first: CostModel, second: CostModel) -> None:
        self.first, self.second = first, second

    @property
    def host_issue(self) -> HostIssue:
        """The slower of the two hosts' issue (:meth:`HostIssue.slower`)."""
        return self.first.host_issue.slower(self.second.host_issue)

    def compute_s(self, op: ComputeOp) -> float:
        """The slower group's time for ``op``, seconds."""
        return max(self.first.compute_s(op), self.second.compute_s(op))

    def comm_s(self, op: CommOp) -> float:
        """The slower group's time for ``op`` on its own path, seconds."""
        return max(self.first.comm_s(op), self.second.comm_s(op))


class StagedCosts:
    """Cost models per pipeline stage, one per node group (the engine's ``stage_costs``).

    As a plain :class:`~llmsim.costs.CostModel` it prices as the first stage's group.
    """

    def __init__(self, groups: dict[str, CostModel], group_of_stage: list[str]) -> None:
        self.groups, self.group_of_stage = groups, group_of_stage
        self._pairs: dict[tuple[str, str], CostModel] = {}

    def for_stage(self, stage: int) -> CostModel:
        """The cost model of the group that runs ``stage``."""
        return self.groups[self.group_of_stage[stage]]

    def between(self, stage: int, other: int) -> CostModel:
        """The cost model of a message between two stages: their group's, or across groups
        the slower of the two (:class:`SlowerPath`)."""
        a, b = self.group_of_stage[stage], self.group_of_stage[other]
        if a == b:
            return self.groups[a]
        key = (min(a, b), max(a, b))
        if key not in self._pairs:
            self._pairs[key] = SlowerPath(self.groups[key[0]], self.groups[key[1]])
        return self._pairs[key]

    @property
    def host_issue(self) -> HostIssue:
        """The first stage's group's host issue."""
        return self.for_stage(0).host_issue

    def compute_s(self, op: ComputeOp) -> float:
        """``op`` on the first stage's group, seconds."""
        return self.for_stage(0).compute_s(op)

    def comm_s(self, op: CommOp) -> float:
        """``op`` on the first stage's group, seconds."""
        return self.for_stage(0).comm_s(op)


def job_system(scenario: Scenario, name: str) -> System:
    """Group ``name`` as the system a job of this scenario's shape would run on alone: its
    node design and network, with at least the nodes the whole job would take there."""
    group = scenario.system.group(name)
    nodes = scenario.devices // group.node.devices_per_node
    return group if group.nodes >= nodes else group.model_copy(update={"nodes": nodes})


def group_costs(scenario: Scenario) -> dict[str, HardwareCosts]:
    """The hardware cost model of each node group the placement names (see the module
    docstring: the job's groups laid out on that group's nodes)."""
    calibration = load_calibration(scenario.calibration) if scenario.calibration else None
    out = {}
    for name in scenario.group_systems():
        system = job_system(scenario, name)
        plan = Plan(system, scenario.devices // system.node.devices_per_node,
                    scenario.parallelism, scenario.dp)
        out[name] = HardwareCosts(system, plan, scenario.training.precision, calibration,
                                  scenario.training.attention_kernel,
                                  scenario.training.power_limit_w,
                                  scenario.training.cuda_graphs,
                                  scenario.parallelism.parameter_servers,
                                  TokenDispatch.of(scenario.model, scenario.parallelism),
                                  scenario.training.allocator, scenario.training.host_path,
                                  host_runs_ahead(scenario.parallelism))
    return out


def staged_costs(scenario: Scenario) -> StagedCosts:
    """Per-stage cost models of a scenario with a placement."""
    assert scenario.placement is not None
    return StagedCosts(dict(group_costs(scenario)), scenario.placement.group_of_stage())


def seconds_per_layer(scenario: Scenario, costs: CostModel) -> tuple[float, float, float]:
    """Priced seconds, on one micro-batch, of one transformer layer's forward, recompute
    and backward passes (the mean over the model's layers, dense and MoE alike), of the
    embedding's and of the LM head's (with the loss)."""
    par = scenario.parallelism
    ops = pass_ops(scenario.model, par, scenario.training)

    def priced(parts: tuple[tuple, ...]) -> float:
        return Block.of(sum(parts, ()), costs, par.overlap_tp_comm).duration_s
    layer = sum(priced(ops.block(scenario.model, i)) for i in range(scenario.model.layers))
    return layer / scenario.model.layers, priced(ops.embedding), priced(ops.head)


def balanced(scenario: Scenario) -> Scenario:
    """The scenario with its layers split over the stages (``parallelism.layers_per_stage``)
    by :func:`balance_layers`; unchanged without a placement of stages or with
    ``balance: given``."""
    placement = scenario.placement
    if placement is None or placement.by_replicas \
            or scenario.parallelism.layers_per_stage is not None:
        return scenario
    costs = group_costs(scenario)
    per_group = {name: seconds_per_layer(scenario, c) for name, c in costs.items()}
    groups = placement.group_of_stage()
    extra = [0.0] * len(groups)
    extra[0] += per_group[groups[0]][1]
    extra[-1] += per_group[groups[-1]][2]
    try:
        split = balance_layers(scenario.model.layers, [per_group[g][0] for g in groups],
                               extra, layer_caps(scenario))
    except ValueError as exc:
        raise UserError(f"placement: {exc}; use fewer stages") from None
    par = scenario.parallelism.model_copy(update={"layers_per_stage": split})
    return scenario.model_copy(update={"parallelism": par})


def fits_with(row: StageMemory, headroom: float) -> bool:
    """Whether ``row``'s peak fits in its device's memory less ``headroom``, a share of it
    (0–1; at 0, :attr:`StageMemory.fits`)."""
    return row.total_bytes <= row.capacity_bytes * (1 - headroom)


def holds_all(caps: Sequence[int], units: int) -> bool:
    """Whether caps per stage (or replica) hold ``units`` layers (or micro-batches) between
    them, each taking at least one (:func:`balance_layers` ignores caps that do not)."""
    return sum(max(1, m) for m in caps) >= units


def layer_caps(scenario: Scenario) -> list[int]:
    """The caps of :func:`balance_layers`: per stage the most layers that fit in its memory
    less ``placement.memory_headroom`` (:func:`most_layers_that_fit`); where those cannot
    hold the model, the most that fit in the whole memory (the headroom given up rather
    than a stage overfilled)."""
    assert scenario.placement is not None
    caps = most_layers_that_fit(scenario)
    if not holds_all(caps, scenario.model.layers) and scenario.placement.memory_headroom > 0:
        caps = most_layers_that_fit(scenario, headroom=0.0)
    return caps


def most_layers_that_fit(scenario: Scenario, headroom: float | None = None) -> list[int]:
    """Per stage, the most layers its devices hold by the memory model
    (:func:`llmsim.memory.memory_per_stage`, with its micro-batches in flight) with
    ``headroom`` of their memory left free (default ``placement.memory_headroom``), found
    by pricing every stage with 1, 2, … layers until none more fits (0: not even one)."""
    assert scenario.placement is not None
    free = scenario.placement.memory_headroom if headroom is None else headroom
    groups = scenario.placement.group_of_stage()
    par = scenario.parallelism
    most = [0] * len(groups)
    open_stages = set(range(len(groups)))
    for n in range(1, scenario.model.layers + 1):
        model = scenario.model.model_copy(update={"layers": n * par.pp})
        trial = par.model_copy(update={"layers_per_stage": None})
        rows = {name: memory_per_stage(model, trial, scenario.training, scenario.dp,
                                       system.node.accelerator)
                for name, system in scenario.group_systems().items()}
        for s in list(open_stages):
            if fits_with(rows[groups[s]][s], free):
                most[s] = n
            else:
                open_stages.discard(s)
        if not open_stages or n > scenario.model.layers - len(groups):
            break  # no stage can take more: the others hold one layer each
    return most


def node_of(scenario: Scenario) -> Callable[[Device, int], int]:
    """The node (numbered over the groups in placement order) that holds ``stage`` of a
    device's pipeline; every stage fills whole nodes of its group."""
    assert scenario.placement is not None
    par = scenario.parallelism
    per_stage = par.tp * par.cp * par.ep * scenario.dp
    first_node, node = [], 0
    for name in scenario.placement.group_of_stage():
        first_node.append(node)
        node += per_stage // scenario.system.group(name).node.devices_per_node
    dpn = [scenario.system.group(g).node.devices_per_node
           for g in scenario.placement.group_of_stage()]

    def node_at(device: Device, stage: int) -> int:
        t, d = device.pipe if isinstance(device.pipe, tuple) else (0, 0)
        return first_node[stage] + (t + d * par.tp * par.cp * par.ep) // dpn[stage]
    return node_at


def group_memory(scenario: Scenario) -> list[StageMemory]:
    """Peak memory of one device of each stage, on its group's accelerator."""
    assert scenario.placement is not None
    args = (scenario.model, scenario.parallelism, scenario.training, scenario.dp)
    rows = {name: memory_per_stage(*args, system.node.accelerator)
            for name, system in scenario.group_systems().items()}
    return [rows[g][s] for s, g in enumerate(scenario.placement.group_of_stage())]


def border_sends(scenario: Scenario, message_bytes: float) -> list[dict[str, object]]:
    """Each border between stages on different node groups, with the time a pipeline send
    of ``message_bytes`` takes on each side's own path and across (the slower side's)."""
    assert scenario.placement is not None
    groups = scenario.placement.group_of_stage()
    costs = group_costs(scenario)
    op = CommOp("pp_send", "send_recv", "pp", "F", message_bytes)
    out: list[dict[str, object]] = []
    for s in range(len(groups) - 1):
        a, b = groups[s], groups[s + 1]
        if a != b:
            out.append({"stage": s, "from": a, "to": b, "from_s": costs[a].comm_s(op),
                        "to_s": costs[b].comm_s(op),
                        "across_s": SlowerPath(costs[a], costs[b]).comm_s(op)})
    return out


def group_rows(scenario: Scenario) -> list[dict[str, object]]:
    """One row per node group the placement uses: its stages, layers, nodes, devices and
    accelerator (the scenario balanced, :func:`balanced`)."""
    assert scenario.placement is not None
    groups = scenario.placement.group_of_stage()
    layers = scenario.parallelism.layers_per_stage or []
    used = scenario.group_nodes()
    rows: list[dict[str, object]] = []
    for name, system in scenario.group_systems().items():
        stages = [s for s, g in enumerate(groups) if g == name]
        nodes, devices = used[name]
        rows.append({"group": name, "stages": f"{stages[0]}–{stages[-1]}" if len(stages) > 1
                     else str(stages[0]), "layers": sorted({layers[s] for s in stages})
                     if layers else [], "nodes": nodes, "of_nodes": system.nodes,
                     "devices": devices, "accelerator": system.node.accelerator.name,
                     "network": system.network.name})
    return rows
