"""Result of one simulated step: times, throughput, efficiency, memory, days to train.

Definitions (design §9):
- MFU = model FLOPs per step / (step time · devices · dense peak of the training dtype);
  HFU counts the FLOPs executed including recomputation.
- Bubble fraction of a stage = idle time of its compute stream during the pipeline phase
  (from the step start to the end of the last pass on any stage) over that phase.
- The breakdown of a stage splits the whole step into compute, exposed TP / PP / DP
  communication, the expert-parallel all-to-alls, the context-parallel ring, bubble
  (idle with nothing in flight) and optimizer; it sums to the step.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from llmsim.memory import StageMemory
from llmsim.specs import Scenario
from llmsim.trace import Trace
from llmsim.workload import Workload

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

SECONDS_PER_DAY = 86_400.0


@dataclass(frozen=True)
class StageBreakdown:
    """Where one stage's step time goes, seconds; the parts sum to the step time."""

    stage: int
    compute_s: float
    tp_s: float
    pp_s: float
    dp_s: float
    bubble_s: float
    optimizer_s: float
    a2a_s: float = 0.0
    """Expert-parallel all-to-alls (MoE token dispatch and combine), blocking the passes."""
    cp_s: float = 0.0
    """Context-parallel ring exchanges, the part attention does not hide."""

    def as_dict(self) -> dict[str, float]:
        """The parts keyed like ``breakdown_s`` in the JSON result."""
        return {"compute": self.compute_s, "tp_comm": self.tp_s, "pp_comm": self.pp_s,
                "dp_comm": self.dp_s, "ep_all_to_all": self.a2a_s, "cp_comm": self.cp_s,
                "bubble": self.bubble_s, "optimizer": self.optimizer_s}


def optimal_batch_tokens(compute_flops: float) -> float:
    """Near-optimal global batch in tokens for a compute budget.

    DeepSeek LLM (DeepSeek-AI 2024, arXiv:2401.02954, eq. 1): B_opt = 0.292 · C^0.3271.
    """
    return 0.292 * compute_flops**0.3271


@dataclass
class Result:
    """Everything llmsim predicts for a scenario."""

    scenario: Scenario
    workload: Workload
    trace: Trace
    memory: list[StageMemory]
    step_time_s: float
    stages: list[StageBreakdown]
    bubble_fraction_per_stage: list[float]
    warnings: list[str] = field(default_factory=list)

    # -- throughput -----------------------------------------------------------------
    @property
    def devices(self) -> int:
        """Devices in the job."""
        return self.scenario.devices

    @property
    def tokens_per_s(self) -> float:
        """Training tokens per second, whole job."""
        return self.scenario.training.tokens_per_step / self.step_time_s

    @property
    def model_flops_per_step(self) -> float:
        """Model FLOPs of one step (all devices, no recompute)."""
        return self.workload.model_flops()

    @property
    def hardware_flops_per_step(self) -> float:
        """FLOPs executed in one step (all devices, recompute included)."""
        return self.workload.hardware_flops()

    @property
    def peak_flops_per_device(self) -> float:
        """Dense peak of the training dtype, FLOP/s (a heterogeneous job's mean over its
        devices)."""
        sc = self.scenario
        if sc.placement is not None:
            groups = sc.group_systems()
            return sum(devices * groups[name].node.accelerator.peak_flops(
                sc.training.precision) for name, (_, devices) in sc.group_nodes().items()
            ) / sc.devices
        return sc.system.node.accelerator.peak_flops(sc.training.precision)

    @property
    def model_tflops_per_device(self) -> float:
        """Achieved model TFLOP/s per device."""
        return self.model_flops_per_step / self.step_time_s / self.devices / 1e12

    @property
    def hardware_tflops_per_device(self) -> float:
        """Achieved hardware TFLOP/s per device (recompute counted)."""
        return self.hardware_flops_per_step / self.step_time_s / self.devices / 1e12

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation, 0–1."""
        return self.model_tflops_per_device * 1e12 / self.peak_flops_per_device

    @property
    def hfu(self) -> float:
        """Hardware FLOPs utilisation, 0–1."""
        return self.hardware_tflops_per_device * 1e12 / self.peak_flops_per_device

    @property
    def bubble_fraction(self) -> float:
        """Mean over stages of the pipeline-phase idle fraction."""
        per = self.bubble_fraction_per_stage
        return sum(per) / len(per)

    @property
    def critical_stage(self) -> StageBreakdown:
        """The stage with the most work (compute, TP and all-to-all): the pipeline's
        bottleneck."""
        return max(self.stages,
                   key=lambda b: (b.compute_s + b.tp_s + b.a2a_s + b.cp_s, -b.stage))

    @property
    def breakdown_s(self) -> dict[str, float]:
        """Breakdown of the step on the critical stage, seconds."""
        return self.critical_stage.as_dict()

    @property
    def days_to_train(self) -> float | None:
        """Days for the run's tokens or FLOP budget at this step's throughput."""
        trn = self.scenario.training
        if trn.tokens is not None:
            amount, rate = trn.tokens, self.tokens_per_s
        elif trn.flops is not None:
            amount, rate = trn.flops, self.model_flops_per_step / self.step_time_s
        else:
            return None
        return amount / rate / SECONDS_PER_DAY if rate > 0 else math.inf  # inf: never

    @property
    def fits(self) -> bool:
        """Whether every stage fits in device memory."""
        return all(m.fits for m in self.memory)

    # -- export -------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The results as plain JSON-able values (units in the key names)."""
        s = self.scenario
        return {
            "scenario": s.name,
            "system": s.system.name,
            "model": s.model.name,
            "devices": self.devices,
            "nodes": s.nodes_used,
            "layout": {"tp": s.parallelism.tp, "pp": s.parallelism.pp, "dp": s.dp,
                       "cp": s.parallelism.cp, "ep": s.parallelism.ep,
                       "expert_tp": s.parallelism.etp,
                       "moe_a2a_overlap": s.parallelism.moe_a2a_overlap,
                       "virtual_stages": s.parallelism.virtual_stages,
                       "micro_batch": s.parallelism.micro_batch,
                       "microbatches": s.micro_batches, "schedule": s.parallelism.schedule,
                       "zero": s.parallelism.zero, "recompute": s.parallelism.recompute},
            **({"placement": {
                "groups": {name: {"stages": stages, "nodes": s.group_nodes()[name][0],
                                  "devices": s.group_nodes()[name][1],
                                  "accelerator": s.system.group(name).node.accelerator.name}
                           for name, stages in s.placement.stage_counts().items()},
                "layers_per_stage": s.parallelism.layers_per_stage,
                "balance": s.placement.balance}} if s.placement is not None else {}),
            "params": s.model.params,
            "active_params_per_token": s.model.active_params_per_token,
            "step_time_s": self.step_time_s,
            "tokens_per_s": self.tokens_per_s,
            "model_flops_per_step": self.model_flops_per_step,
            "model_tflops_per_device": self.model_tflops_per_device,
            "hardware_tflops_per_device": self.hardware_tflops_per_device,
            "mfu": self.mfu,
            "hfu": self.hfu,
            "bubble_fraction": self.bubble_fraction,
            "bubble_fraction_per_stage": self.bubble_fraction_per_stage,
            "breakdown_s": self.breakdown_s,
            "critical_stage": self.critical_stage.stage,
            "breakdown_per_stage_s": [b.as_dict() for b in self.stages],
            "memory": [m.as_gb() | {"stage": m.stage} for m in self.memory],
            "fits": self.fits,
            "days_to_train": self.days_to_train,
            "warnings": self.warnings,
        }

    def to_json(self, indent: int | None = 2) -> str:
        """The results as a JSON string: a NaN or infinite value is written as null, and a
        warning names it."""
        data = self.to_dict()
        data["warnings"] = data["warnings"] + [
            f"{key} is {value}, written as null" for key, value in _not_finite(data)]
        return json.dumps(_finite(data), indent=indent)

    def to_dataframe(self) -> pd.DataFrame:
        """Every op of the step: device, stage, stream, name, kind, micro-batch, times
        (the rows of :meth:`Trace.expand`, built a record's spans at a time)."""
        import pandas as pd

        columns = self.trace.expand_columns()
        if len(columns["device"]) == 0:
            return pd.DataFrame()
        df = pd.DataFrame(columns)
        df["duration_s"] = df["end_s"] - df["start_s"]
        return df

    def stream_usage(self) -> pd.DataFrame:
        """Busy and idle seconds per device and stream (busy + idle = step time)."""
        import pandas as pd

        busy: dict[tuple[int, str], float] = {}
        for r in self.trace.expand():
            key = (r.device, r.stream)
            busy[key] = busy.get(key, 0.0) + (r.end_s - r.start_s)
        devices = sorted({d for d, _ in busy})
        streams = ("compute", "tp", "pp", "dp")
        rows = [{"device": d, "stream": st, "busy_s": busy.get((d, st), 0.0),
                 "idle_s": self.step_time_s - busy.get((d, st), 0.0)}
                for d in devices for st in streams]
        return pd.DataFrame(rows)

    def plot_timeline(self, ax: Axes | None = None, max_devices: int = 16) -> Figure:
        """Gantt chart of the step: a matplotlib ``Figure`` that saves with its legend
        (``fig.savefig("timeline.png")``); see ``llmsim.plots.plot_timeline``."""
        from llmsim.plots import plot_timeline

        return plot_timeline(self, ax=ax, max_devices=max_devices)


def _not_finite(value: Any, key: str = "") -> list[tuple[str, float]]:
    """(dotted key, value) of every NaN or infinite float inside ``value``."""
    if isinstance(value, float) and not math.isfinite(value):
        return [(key, value)]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _not_finite(v, f"{key}.{k}".lstrip("."))]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _not_finite(v, f"{key}[{i}]")]
    return []


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value
