"""Scenario: the system (or part of it), the model, the layout and the training run."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveInt, model_validator

from llmsim.partition import chunk_layers
from llmsim.specs._base import Spec
from llmsim.specs.calendar import Calendar
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
    """Seed for random draws: the Monte Carlo of the whole run (llmsim.calendar) draws its
    failures from it; the step simulation itself is deterministic."""
    fidelity: Literal["reduced", "full"] = "reduced"
    """``reduced`` simulates one device per pipeline stage; ``full`` every device."""
    calibration: str | None = None
    """Path to a calibration profile (measured GEMM / collective tables)."""
    calendar: Calendar = Field(default_factory=Calendar)
    """Checkpointing, the Monte Carlo of the whole run, CO₂ and price (llmsim.calendar)."""

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
    def micro_batches(self) -> int:
        """Micro-batches per pipeline per step (m)."""
        return self.training.global_batch // (self.parallelism.micro_batch * self.dp)
