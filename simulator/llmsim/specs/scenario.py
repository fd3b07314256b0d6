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
        degrees = f"tp({par.tp})·pp({par.pp})" + "".join(
            f"·{a}({d})" for a, d in (("cp", par.cp), ("ep", par.ep)) if d > 1)
        if par.dp == "auto":
            if devices % fixed:
                raise ValueError(
                    f"parallelism: {degrees} = {fixed} does not divide the "
                    f"{devices} devices used, so dp cannot be 'auto'; change tp/pp or nodes"
                )
        elif fixed * par.dp != devices:
            raise ValueError(
                f"parallelism: {degrees}·dp({par.dp}) = {fixed * par.dp} ≠ "
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
        per_step = par.micro_batch * self.dp * par.ep
        if trn.global_batch % per_step:
            named = "micro_batch·dp·ep" if par.ep > 1 else "micro_batch·dp"
            factors = f"{par.micro_batch}·{self.dp}" + (f"·{par.ep}" if par.ep > 1 else "")
            raise ValueError(
                f"training.global_batch: {trn.global_batch} is not divisible by "
                f"{named} = {factors} = {per_step}; use a multiple of {per_step}"
            )
        self._check_experts_and_context()
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

    def _check_experts_and_context(self) -> None:
        """Expert and context parallelism as Megatron-Core accepts them."""
        par, mdl, trn = self.parallelism, self.model, self.training
        if par.ep > 1 and mdl.moe is None:
            raise ValueError(
                f"parallelism.ep: {par.ep} needs a mixture-of-experts model ({mdl.name} is "
                "dense); set ep to 1 or give the model a moe section"
            )
        if mdl.moe is not None and mdl.moe.experts % par.ep:
            raise ValueError(
                f"parallelism.ep: {par.ep} does not divide model.moe.experts="
                f"{mdl.moe.experts}; choose ep among the divisors of the expert count"
            )
        if mdl.moe is not None and par.ep > 1 and par.tp > 1 and not par.sequence_parallel:
            raise ValueError(
                f"parallelism.sequence_parallel: false with ep {par.ep} and tp {par.tp}; "
                "Megatron-Core requires sequence parallelism when expert and tensor "
                "parallelism are combined — set sequence_parallel: true"
            )
        if mdl.moe is not None and mdl.moe.ffn_hidden % par.tp:
            raise ValueError(
                f"parallelism.tp: {par.tp} does not divide model.moe.ffn_hidden="
                f"{mdl.moe.ffn_hidden}; choose a tp that divides it"
            )
        if par.moe_shared_expert_overlap and (
                par.ep == 1 or mdl.moe is None or not mdl.moe.shared_experts):
            raise ValueError(
                "parallelism.moe_shared_expert_overlap: true needs a MoE model with "
                "shared experts and ep > 1 (it hides the shared experts behind the token "
                "all-to-alls); turn it off, or set model.moe.shared_experts and ep"
            )
        if par.zero == 3 and (par.ep > 1 or par.cp > 1):
            raise ValueError(
                f"parallelism.zero: 3 with ep {par.ep} and cp {par.cp} is not modelled (its "
                "weight gathers would span two groups); use zero 1 or 2, or ep = cp = 1"
            )
        if par.overlap_param_gather and (par.ep > 1 or par.cp > 1):
            raise ValueError(
                f"parallelism.overlap_param_gather: true with ep {par.ep} and cp {par.cp} is "
                "not modelled (its per-layer gathers would span two groups); turn it off, or "
                "use ep = cp = 1"
            )
        if par.cp > 1 and not trn.fused_attention:
            raise ValueError(
                f"parallelism.cp: {par.cp} needs a fused attention kernel (ring attention "
                "is Transformer Engine's flash/cuDNN path); set training.attention_kernel "
                "to flash or cudnn, or cp to 1"
            )
        if trn.seq_len % (2 * par.cp) and par.cp > 1:
            raise ValueError(
                f"parallelism.cp: {par.cp} does not split training.seq_len={trn.seq_len} "
                f"into 2·cp = {2 * par.cp} equal chunks (causal load balancing gives each "
                "rank two); choose cp so that 2·cp divides the sequence length"
            )

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
        """Micro-batches per pipeline per step (m); the dp·ep pipelines each run their own
        (expert-parallel ranks hold different sequences)."""
        par = self.parallelism
        return self.training.global_batch // (par.micro_batch * self.dp * par.ep)
