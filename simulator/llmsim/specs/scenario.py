"""Scenario: the system (or part of it), the model, the layout and the training run."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveInt, model_validator

from llmsim.partition import chunk_layers
from llmsim.specs._base import Spec
from llmsim.specs.model import Model
from llmsim.specs.parallelism import Parallelism
from llmsim.specs.system import System
from llmsim.specs.training import Training


class Scenario(Spec):
    """Everything one simulation needs. Names are resolved from the catalog at load."""

    name: str = "scenario"
    """Short name for reports."""
    description: str = ""
    """What the scenario asks."""
    system: System
    """The machine (catalog name or inline spec)."""
    nodes: PositiveInt | None = None
    """Nodes to use; defaults to the whole system."""
    model: Model
    """The model (catalog name or inline spec)."""
    parallelism: Parallelism = Field(default_factory=Parallelism)
    """Parallel layout."""
    training: Training
    """Batch, sequence, precision and run size."""
    seed: int = 0
    """Seed for random draws. The simulation has none today (it is deterministic), so the
    value changes nothing yet."""
    fidelity: Literal["reduced", "full"] = "reduced"
    """``reduced`` simulates one device per pipeline stage; ``full`` every device."""
    calibration: str | None = None
    """Path to a calibration profile (measured GEMM / collective tables)."""
    max_sim_passes: PositiveInt = 1_000_000
    """Largest step llmsim simulates before refusing, in layer passes: the devices
    simulated (one per stage, every device with ``fidelity: full``) × micro-batches per
    pipeline × layers per stage, plus the gradient buckets those devices reduce. A pass
    takes some 20–70 µs on one core (docs/scenarios.md), so the default bounds a run to
    about a minute; raise it to insist on a larger one."""

    @model_validator(mode="after")
    def _check_layout(self) -> Scenario:
        sysm, par, mdl, trn = self.system, self.parallelism, self.model, self.training
        if self.nodes is not None and self.nodes > sysm.nodes:
            raise ValueError(
                f"nodes: {self.nodes} is more than {sysm.name} has ({sysm.nodes}); "
                f"use at most {sysm.nodes}"
            )
        devices = self.devices
        fixed = par.tp * par.pp * par.cp * par.ep
        if par.dp == "auto":
            if devices % fixed:
                raise ValueError(
                    f"parallelism: tp({par.tp})·pp({par.pp}) = {fixed} does not divide the "
                    f"{devices} devices used, so dp cannot be 'auto'; change tp/pp or nodes"
                )
        elif fixed * par.dp != devices:
            raise ValueError(
                f"parallelism: tp({par.tp})·pp({par.pp})·dp({par.dp}) = {fixed * par.dp} ≠ "
                f"{devices} devices used ({self.nodes_used} nodes × "
                f"{sysm.node.devices_per_node}); change a degree, set dp: auto, or set nodes"
            )
        if mdl.heads % par.tp:
            raise ValueError(
                f"parallelism.tp: {par.tp} does not divide model.heads={mdl.heads}; "
                "choose tp among the divisors of the head count"
            )
        if mdl.n_kv_heads % par.tp and par.tp % mdl.n_kv_heads:
            raise ValueError(
                f"parallelism.tp: {par.tp} and model.kv_heads={mdl.n_kv_heads} do not divide "
                "one another; choose tp so that one divides the other"
            )
        if mdl.ffn_hidden % par.tp:
            raise ValueError(
                f"parallelism.tp: {par.tp} does not divide model.ffn_hidden={mdl.ffn_hidden}; "
                "choose a tp that divides it"
            )
        chunk_layers(mdl.layers, par)  # raises a ValueError naming the field
        per_step = par.micro_batch * self.dp
        if trn.global_batch % per_step:
            raise ValueError(
                f"training.global_batch: {trn.global_batch} is not divisible by "
                f"micro_batch·dp = {par.micro_batch}·{self.dp} = {per_step}; "
                f"use a multiple of {per_step}"
            )
        if par.schedule == "interleaved-1f1b" and self.micro_batches % par.pp:
            raise ValueError(_interleaved_hint(trn.global_batch, par.micro_batch, self.dp,
                                               par.pp))
        if self.sim_passes > self.max_sim_passes:
            devices = "every device" if self.fidelity == "full" else "one device per stage"
            raise ValueError(
                f"this step would take {self.sim_passes:,} layer passes to simulate "
                f"({devices}), more than max_sim_passes = {self.max_sim_passes:,}; use fewer "
                "micro-batches, layers or devices, fidelity: reduced, a larger "
                "parallelism.dp_bucket_mb, or set max_sim_passes higher to insist"
            )
        accel = sysm.node.accelerator
        if not accel.supports(trn.precision):
            have = [k for k, v in accel.dense_tflops.model_dump().items() if v]
            raise ValueError(
                f"training.precision: {trn.precision} is not supported by {accel.name}; "
                f"use one of {', '.join(have)}"
            )
        units = accel.gemm.compute_units
        held = sysm.node.collective_units  # beside a data-parallel collective as well
        for field, sms in par.tp_overlap_units.items():
            if sms + held >= units:
                raise ValueError(
                    f"parallelism.{field}: {sms} leaves none of {accel.name}'s {units} "
                    f"compute units to the GEMMs (other kernels hold {held} more); "
                    f"use fewer than {units - held}"
                )
        return self

    @property
    def nodes_used(self) -> int:
        """Nodes the job runs on."""
        return self.nodes if self.nodes is not None else self.system.nodes

    @property
    def devices(self) -> int:
        """Devices the job runs on."""
        return self.nodes_used * self.system.node.devices_per_node

    @property
    def dp(self) -> int:
        """Resolved data-parallel degree."""
        par = self.parallelism
        if par.dp == "auto":
            return self.devices // (par.tp * par.pp * par.cp * par.ep)
        return par.dp

    @property
    def sim_passes(self) -> int:
        """Estimated work of simulating one step (see ``max_sim_passes``): simulated
        devices × micro-batches × layers per stage + their gradient buckets (four bytes a
        gradient, the most any precision reduces)."""
        par = self.parallelism
        simulated = par.pp * (par.tp * self.dp if self.fidelity == "full" else 1)
        layers = -(-self.model.layers // par.pp)
        grad_bytes = 4 * self.model.params / (par.tp * par.pp)
        buckets = par.virtual_stages + min(grad_bytes / (par.dp_bucket_mb * 1e6), 1e30)
        return int(simulated * (self.micro_batches * layers + (buckets if self.dp > 1 else 0)))

    @property
    def micro_batches(self) -> int:
        """Micro-batches per pipeline per step (m)."""
        return self.training.global_batch // (self.parallelism.micro_batch * self.dp)


def _interleaved_hint(global_batch: int, micro_batch: int, dp: int, pp: int) -> str:
    """Why an interleaved pipeline cannot run this batch, and nearby values that can.

    Megatron-LM's interleaved schedule needs the micro-batches per pipeline,
    global_batch / (micro_batch · dp), to be a multiple of the stages pp."""
    m = global_batch // (micro_batch * dp)
    step = micro_batch * dp * pp
    batches = [b for b in (global_batch // step * step, (global_batch // step + 1) * step) if b]
    per_replica = global_batch // dp
    micro = [b for b in range(1, min(per_replica, 4096) + 1)
             if per_replica % b == 0 and (per_replica // b) % pp == 0]
    sequences = global_batch // micro_batch
    dps = [d for d in range(1, min(sequences, 65536) + 1)
           if sequences % d == 0 and (sequences // d) % pp == 0]
    options = [f"global_batch {' or '.join(map(str, batches))}"]
    if micro:
        options.append(f"micro_batch {min(micro, key=lambda b: (abs(b - micro_batch), b))}")
    if dps:
        options.append(f"dp {min(dps, key=lambda d: (abs(d - dp), d))} (with the nodes to "
                       "match)")
    return (f"parallelism.schedule: interleaved-1f1b needs the micro-batches per pipeline, "
            f"training.global_batch / (parallelism.micro_batch · dp) = {global_batch} / "
            f"({micro_batch} · {dp}) = {m}, to be a multiple of pp = {pp}; use "
            + ", ".join(options[:-1]) + (", or " if len(options) > 1 else "") + options[-1])
