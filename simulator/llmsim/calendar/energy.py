"""Energy of a step and of a run, from the step's time split and power by kind of work.

Each device of pipeline stage s spends the step as the result's breakdown of that stage
says: compute (split into GEMM-like — GEMMs and fused attention — and memory-bound
kernels in the proportion the stage's compute stream ran them), exposed TP / PP / DP
communication, bubble (waiting) and optimizer (memory-bound). Each part draws the
device's power for that kind of work (:class:`llmsim.specs.DevicePower`); nodes and
network add their power for the whole step, the power conversion in the racks divides it
all by its efficiency, and the facility multiplies it by its PUE. A run adds, at idle
power, the time it stops for checkpoints and restarts, and at step power the work it
redoes after failures.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmsim.blocks import Block
from llmsim.ops import ComputeOp
from llmsim.result import Result
from llmsim.specs import Accelerator, DevicePower, Scenario

JOULES_PER_MWH = 3.6e9
"""Joules in a megawatt-hour."""
JOULES_PER_KWH = 3.6e6
"""Joules in a kilowatt-hour."""


def device_power(accelerator: Accelerator) -> DevicePower | None:
    """The accelerator's measured power, else one derived from its ``tdp_w``; None when
    it has neither."""
    if accelerator.power is not None:
        return accelerator.power
    if accelerator.tdp_w is None:
        return None
    return DevicePower.from_tdp(accelerator.tdp_w)


@dataclass(frozen=True)
class StepEnergy:
    """Energy of one step of the whole job, joules, by where it goes."""

    gemm_j: float
    memory_j: float
    comm_j: float
    wait_j: float
    nodes_j: float
    """Node power beside the devices, and the network's."""
    pue: float
    """The facility's PUE, applied to the sum of the parts."""
    step_time_s: float
    idle_power_w: float
    """The job's power while it holds its nodes and runs nothing (devices idle, nodes
    and network on, PUE included), W."""
    conversion_efficiency: float = 1.0
    """Share of the IT input power that reaches the parts (rectifiers, regulators)."""

    @property
    def it_j(self) -> float:
        """Devices, nodes and network at the rack's input (conversion losses included),
        joules."""
        parts = self.gemm_j + self.memory_j + self.comm_j + self.wait_j + self.nodes_j
        return parts / self.conversion_efficiency

    @property
    def total_j(self) -> float:
        """With the facility's overhead, joules."""
        return self.it_j * self.pue

    @property
    def power_w(self) -> float:
        """Mean power of the job while it trains, facility included, W."""
        return self.total_j / self.step_time_s


def memory_shares(result: Result) -> list[float]:
    """Per pipeline stage, the share of its pass time on the compute stream that
    memory-bound kernels take (the rest: GEMMs and fused attention), read from the step's
    trace on the first device of each stage."""
    pp = result.scenario.parallelism.pp
    kinds: list[dict[str, str]] = [{} for _ in range(pp)]
    for (stage, _), chunk in result.workload.chunks.items():
        kinds[stage].update({op.name: op.kind for op in chunk.ops if isinstance(op, ComputeOp)})
    trace = result.trace
    first: dict[int, int] = {}
    gemm_s, memory_s = [0.0] * pp, [0.0] * pp
    split: dict[int, tuple[list[float], list[float]]] = {}  # id of a block → _compute_spans_s
    block_of = trace.block_finder()
    for r in trace.records:
        if r.stream != "compute" or first.setdefault(r.stage, r.device) != r.device:
            continue
        block = block_of(r)
        if block is None or block.duration_s <= 0:
            continue
        scale = (r.end_s - r.start_s) / block.duration_s
        parts = split.get(id(block))
        if parts is None:
            parts = split[id(block)] = _compute_spans_s(block, kinds[r.stage])
        gemm, memory = parts
        for duration_s in memory:
            memory_s[r.stage] += duration_s * scale
        for duration_s in gemm:
            gemm_s[r.stage] += duration_s * scale
    return [m / (g + m) if g + m > 0 else 0.0 for g, m in zip(gemm_s, memory_s, strict=True)]


def _compute_spans_s(block: Block, kinds: dict[str, str]) -> tuple[list[float], list[float]]:
    """Seconds of ``block``'s spans on the compute stream, in order: (GEMM-like, memory-bound),
    by each op's kind in ``kinds`` (name → kind; memory-bound when not there). Found once
    per block, not per record that runs it."""
    gemm: list[float] = []
    memory: list[float] = []
    for span in block.spans:
        if span.stream == "compute":
            (memory if kinds.get(span.name, "memory") == "memory" else gemm).append(
                span.duration_s)
    return gemm, memory


def compute_memory_share(result: Result, stage: int) -> float:
    """:func:`memory_shares` of one stage."""
    return memory_shares(result)[stage]


def step_energy(result: Result) -> StepEnergy | None:
    """Energy of one step of ``result``'s job; None when the accelerator has no power
    figures."""
    s = result.scenario
    power = device_power(s.system.node.accelerator)
    # A heterogeneous job's stages draw their own group's accelerator's power.
    powers = ([device_power(s.system.group(g).node.accelerator)
               for g in s.placement.group_of_stage()] if s.placement is not None
              else [power] * s.parallelism.pp)
    if s.placement is not None and s.placement.by_replicas:  # replicas on node groups
        powers = [_mean_power(s)] * s.parallelism.pp
    if power is None or any(p is None for p in powers):
        return None
    per_stage = s.devices / s.parallelism.pp
    gemm = memory = comm = wait = 0.0
    shares = memory_shares(result)
    for b in result.stages:
        power = powers[b.stage]
        assert power is not None
        mem_share = shares[b.stage]
        gemm += per_stage * power.gemm_w * b.compute_s * (1 - mem_share)
        memory += per_stage * power.memory_w * (b.compute_s * mem_share + b.optimizer_s)
        comm += per_stage * power.comm_w * (b.tp_s + b.pp_s + b.dp_s)
        wait += per_stage * power.wait_w * b.bubble_s
    facility = s.system.facility
    node_w = s.nodes_used * (facility.node_overhead_w + facility.network_w_per_node)
    devices_idle_w = (s.devices * power.idle_w if s.placement is None
                      else sum(per_stage * p.idle_w for p in powers if p is not None))
    idle_w = (devices_idle_w + node_w) / facility.conversion_efficiency * facility.pue
    return StepEnergy(gemm, memory, comm, wait, node_w * result.step_time_s, facility.pue,
                      result.step_time_s, idle_w, facility.conversion_efficiency)


def _mean_power(s: Scenario) -> DevicePower | None:
    """The mean device power of a job of data-parallel replicas on node groups, weighted by
    each group's devices (every stage's devices are the replicas' of every group; the
    slowest replica's breakdown stands for them all); None if a group has no figures."""
    shares = [(devices / s.devices, device_power(s.system.group(g).node.accelerator))
              for g, (_, devices) in s.group_nodes().items()]
    if any(p is None for _, p in shares):
        return None
    return DevicePower(**{f: sum(w * getattr(p, f) for w, p in shares)
                          for f in DevicePower.model_fields})


@dataclass(frozen=True)
class RunEnergy:
    """Energy of a whole run, joules, and its CO₂ and price."""

    training_j: float
    """The run's steps, once each."""
    redone_j: float
    """Work redone after failures, at step power."""
    stopped_j: float
    """Checkpoints and restarts, at idle power."""
    gco2_per_kwh: float
    price_per_kwh: float

    @property
    def total_j(self) -> float:
        """Everything, joules."""
        return self.training_j + self.redone_j + self.stopped_j

    @property
    def mwh(self) -> float:
        """Everything, MWh."""
        return self.total_j / JOULES_PER_MWH

    @property
    def tonnes_co2(self) -> float:
        """CO₂ at the grid's intensity, tonnes."""
        return self.total_j / JOULES_PER_KWH * self.gco2_per_kwh / 1e6

    @property
    def cost(self) -> float:
        """Electricity cost at the price, USD."""
        return self.total_j / JOULES_PER_KWH * self.price_per_kwh


def run_energy(step: StepEnergy, work_s: float, redone_s: float, stopped_s: float,
               gco2_per_kwh: float, price_per_kwh: float) -> RunEnergy:
    """Energy of a run of ``work_s`` training seconds that redoes ``redone_s`` seconds of
    work and stands still ``stopped_s`` seconds (checkpoints, restarts)."""
    return RunEnergy(step.power_w * work_s, step.power_w * redone_s,
                     step.idle_power_w * stopped_s, gco2_per_kwh, price_per_kwh)
