"""Scenario: the system (or part of it), the model, the layout and the training run."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, NonNegativeInt, PositiveInt, model_validator

from llmsim.partition import split_refused
from llmsim.specs._base import Name, Spec
from llmsim.specs.calendar import Calendar
from llmsim.specs.jitter import Jitter
from llmsim.specs.kernel_rules import check_kernel_choices
from llmsim.specs.model import Model
from llmsim.specs.network import Torus
from llmsim.specs.parallelism import Parallelism
from llmsim.specs.placement import Placement, check_placement, check_replica_batch
from llmsim.specs.switch_rules import (
    check_a2a_overlap,
    check_moe_fields,
    check_shared_expert_overlap,
    check_tp_overlap_units,
)
from llmsim.specs.system import System
from llmsim.specs.training import Training


class Scenario(Spec):
    """Everything one simulation needs. Names are resolved from the catalog at load."""

    name: Name = "scenario"
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
    placement: Placement | None = None
    """Which node group of the system runs which pipeline stages (a heterogeneous job,
    docs/heterogeneous.md); None: every stage on the system's own (first) group."""
    training: Training
    """Batch, sequence, precision and run size."""
    seed: NonNegativeInt = 0
    """Seed for random draws: the Monte Carlo of the whole run (llmsim.calendar) draws its
    failures from it, and the step's per-op noise (``jitter``, when given) its factors;
    without jitter the step simulation is deterministic."""
    fidelity: Literal["reduced", "full"] = "reduced"
    """``reduced`` simulates one device per pipeline stage; ``full`` every device."""
    calibration: str | None = None
    """Path to a calibration profile (measured GEMM / collective tables)."""
    calendar: Calendar = Field(default_factory=Calendar)
    """Checkpointing, the Monte Carlo of the whole run, CO₂ and price (llmsim.calendar)."""
    jitter: Jitter = Field(default_factory=Jitter)
    """Per-op duration noise and slow devices (llmsim.costs.jitter); none by default."""
    max_sim_passes: PositiveInt = 1_000_000
    """Largest step llmsim simulates before refusing, in layer passes: the devices
    simulated (one per stage, every device with ``fidelity: full``) × micro-batches per
    pipeline × layers per stage (the last stage's, with its ``model.mtp_depth``
    multi-token prediction modules), plus the gradient buckets those devices reduce. A pass
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
        if self.placement is not None:
            check_placement(self.placement, self.system, self.parallelism, self.nodes)
        if par.dp_mode == "parameter_server" and par.parameter_servers > self.nodes_used:
            raise ValueError(
                f"parallelism.parameter_servers: {par.parameter_servers} servers on a job of "
                f"{self.nodes_used} nodes; the servers run one per node of the job, so use at "
                f"most {self.nodes_used}"
            )
        shape = sysm.network.job_shape if isinstance(sysm.network, Torus) else None
        if shape is not None and self.placement is None and math.prod(shape) < self.nodes_used:
            raise ValueError(
                f"system.network.job_shape {shape} holds {math.prod(shape)} nodes, fewer "
                f"than the job's {self.nodes_used}; give a shape of at least "
                f"{self.nodes_used} nodes or set nodes to at most {math.prod(shape)}")
        devices = self.devices
        fixed = par.tp * par.pp * par.cp * par.ep
        if par.dp == "auto":
            if devices % fixed:
                raise ValueError(
                    f"parallelism: {_degrees(par)} = {fixed} does not divide the "
                    f"{devices} devices used, so dp cannot be 'auto'; change tp/pp or nodes"
                )
        elif fixed * par.dp != devices:
            raise ValueError(
                f"parallelism: {_degrees(par)}·dp({par.dp}) = {fixed * par.dp} ≠ "
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
        if self._layers_wait_for_balance:
            if mdl.layers < par.pp:
                raise ValueError(
                    f"parallelism.pp: {par.pp} stages for model.layers={mdl.layers}; a "
                    "balanced placement gives every stage a layer — use at most "
                    f"{mdl.layers} stages"
                )
        else:
            refused = split_refused(mdl.layers, par.pp, par.virtual_stages,
                                    par.first_stage_layers, par.last_stage_layers,
                                    None if par.layers_per_stage is None
                                    else tuple(par.layers_per_stage))
            if refused:
                raise ValueError(refused)  # chunk_layers' sentence naming the field
        per_step = par.micro_batch * self.dp * par.ep
        if self.placement is not None and self.placement.by_replicas:
            check_replica_batch(self.placement, par, trn, self.dp)
        elif trn.global_batch % per_step:
            named = "micro_batch·dp·ep" if par.ep > 1 else "micro_batch·dp"
            factors = f"{par.micro_batch}·{self.dp}" + (f"·{par.ep}" if par.ep > 1 else "")
            raise ValueError(
                f"training.global_batch: {trn.global_batch} is not divisible by "
                f"{named} = {factors} = {per_step}; use a multiple of {per_step}"
            )
        self._check_experts_and_context()
        check_kernel_choices(self.model, self.training)
        if par.schedule == "interleaved-1f1b" and self.micro_batches % par.pp \
                and not (self.placement is not None and self.placement.by_replicas):
            raise ValueError(_interleaved_hint(trn.global_batch, par.micro_batch,
                                               self.dp * par.ep, par.pp))
        if self.sim_passes > self.max_sim_passes:
            devices = "every device" if self.fidelity == "full" else "one device per stage"
            raise ValueError(
                f"this step would take {self.sim_passes:,} layer passes to simulate "
                f"({devices}), more than max_sim_passes = {self.max_sim_passes:,}; use fewer "
                "micro-batches, layers (or model.mtp_depth) or devices, fidelity: reduced, a "
                "larger parallelism.dp_bucket_mb, or set max_sim_passes higher to insist"
            )
        for accel in {g.node.accelerator.name: g.node.accelerator
                      for g in self.group_systems().values()}.values():
            if not accel.supports(trn.precision):
                have = [k for k, v in accel.dense_tflops.model_dump().items() if v]
                raise ValueError(
                    f"training.precision: {trn.precision} is not supported by {accel.name}; "
                    f"use one of {', '.join(have)}"
                )
            clocks = accel.clocks
            if clocks is not None and trn.power_limit_w is not None \
                    and trn.power_limit_w <= clocks.static_w:
                raise ValueError(  # no dynamic power left: no clock (costs/clocks.py)
                    f"training.power_limit_w: {trn.power_limit_w} W is not above "
                    f"{accel.name}'s clocks.static_w ({clocks.static_w} W), so no clock "
                    f"runs; give a limit above it, e.g. the board's {clocks.power_limit_w} W"
                )
        check_tp_overlap_units(sysm, par)
        return self

    def check_switch_rules(self) -> None:
        """The rules of the scenario's validation that read the fields the layout search
        varies between the switch variants of one layout (``overlap_tp_comm``,
        ``overlap_pp_comm``, ``overlap_param_gather``, ``moe_a2a_overlap`` and the
        ``moe_comm_units`` and ``moe_shared_expert_overlap`` it drops), in the
        validation's order: a scenario that differs only in those fields from one that
        passed every rule breaks the first of these it breaks, if any
        (:func:`llmsim.search.price.with_switches`; ``tests/test_search_fast_rules.py``
        checks that no other rule reads those fields)."""
        check_moe_fields(self.parallelism, self.model)
        check_a2a_overlap(self.parallelism, self.training)
        check_shared_expert_overlap(self.parallelism, self.model)
        check_tp_overlap_units(self.system, self.parallelism)

    @property
    def _layers_wait_for_balance(self) -> bool:
        """Whether the layer split is computed later, by the throughput balance."""
        return (self.placement is not None and self.placement.balance == "throughput"
                and not self.placement.by_replicas
                and self.parallelism.layers_per_stage is None)

    def group_systems(self) -> dict[str, System]:
        """The node groups the job runs on, by name (the system itself without placement)."""
        if self.placement is None:
            return {self.system.name: self.system}
        return {name: self.system.group(name) for name in self.placement.group_names()}

    def _check_experts_and_context(self) -> None:
        """Expert and context parallelism as Megatron-Core accepts them."""
        par, mdl, trn = self.parallelism, self.model, self.training
        if par.recompute == "full_keep_attention" and (
                not trn.fused_attention or mdl.moe is not None or mdl.mla is not None):
            raise ValueError(
                "parallelism.recompute: full_keep_attention keeps a fused attention kernel's "
                f"output in a dense block without MLA ({mdl.name}, attention_kernel "
                f"{trn.attention_kernel}); use full, or a fused kernel on a dense model"
            )
        if par.cp > 1 and par.cp_schedule == "distflash" and par.cp % 2:
            raise ValueError(
                f"parallelism.cp: {par.cp} is odd, and DistFlashAttn's schedule covers the "
                "causal attention only over an even number of ranks; choose an even cp or "
                "cp_schedule te_ring"
            )
        if par.cp > 1 and par.cp_schedule == "distflash" and mdl.mla is not None:
            raise ValueError(
                f"parallelism.cp_schedule: distflash exchanges key/value blocks, not {mdl.name}'s "
                "MLA latents; use te_ring"
            )
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
        check_moe_fields(par, mdl)
        if par.moe_dispatcher != "alltoall" and mdl.moe is None:
            raise ValueError(
                f"parallelism.moe_dispatcher: {par.moe_dispatcher} needs a mixture-of-experts "
                f"model ({mdl.name} is dense); remove it or give the model a moe section"
            )
        if trn.rope != "fused" and (mdl.position_embedding != "rope" or mdl.mla is not None):
            raise ValueError(
                f"training.rope: {trn.rope} prices the rotary embedding of a RoPE block "
                f"without MLA, and {mdl.name} has "
                f"{'MLA' if mdl.mla else mdl.position_embedding + ' positions'}; remove it"
            )
        if trn.expert_loop != "grouped" and mdl.moe is None:
            raise ValueError(
                f"training.expert_loop: {trn.expert_loop} runs a MoE layer's local experts "
                f"({mdl.name} is dense); remove it or give the model a moe section"
            )
        if par.moe_dispatcher == "deepspeed" and mdl.moe and mdl.moe.capacity_factor is None:
            raise ValueError(
                "parallelism.moe_dispatcher: deepspeed needs model.moe.capacity_factor (its "
                "einsums are sized by the capacity; it is None); set it, e.g. 1.0"
            )
        if par.moe_dispatcher == "deepspeed" and trn.expert_loop == "deepspeed_uneven":
            raise ValueError(  # X-MoE 33c69c95, deepspeed/moe/moe_v2.py: MOEv2Layer.forward
                "training.expert_loop: deepspeed_uneven with parallelism.moe_dispatcher: "
                "deepspeed: DeepSpeed's einsum layer sends even, capacity-padded batches, "
                "and X-MoE's uneven loop runs only behind its padding-free dispatch (its "
                "einsum branch fails on the padding-free gate's outputs); set expert_loop to "
                "grouped, or moe_dispatcher to alltoall"
            )
        if trn.fp8_activation_cache and mdl.moe is None:
            raise ValueError(
                f"training.fp8_activation_cache: true needs a mixture-of-experts model "
                f"({mdl.name} is dense); remove it or give the model a moe section"
            )
        if mdl.moe is not None and mdl.moe.experts % par.expert_ranks:
            raise ValueError(
                f"parallelism.expert_tp: {par.etp} splits the experts over tp·ep/expert_tp = "
                f"{par.tp}·{par.ep}/{par.etp} = {par.expert_ranks} ranks, which does not "
                f"divide model.moe.experts={mdl.moe.experts}; lower ep, or raise expert_tp"
            )
        if mdl.moe is not None and par.expert_ranks > 1 and par.tp > 1 \
                and not par.sequence_parallel:
            raise ValueError(
                f"parallelism.sequence_parallel: false with ep {par.ep} and tp {par.tp}; "
                "Megatron-Core requires sequence parallelism when expert and tensor "
                "parallelism are combined — set sequence_parallel: true"
            )
        check_a2a_overlap(par, trn)
        if mdl.moe is not None and mdl.moe.ffn_hidden % par.etp:
            raise ValueError(
                f"parallelism.tp: {par.etp} does not divide model.moe.ffn_hidden="
                f"{mdl.moe.ffn_hidden}; choose a tp that divides it"
            )
        if mdl.moe is not None and mdl.moe.shared_experts and mdl.moe.ffn_hidden % par.tp:
            raise ValueError(
                f"parallelism.tp: {par.tp} does not divide model.moe.ffn_hidden="
                f"{mdl.moe.ffn_hidden} of the shared experts; choose a tp that divides it"
            )
        check_shared_expert_overlap(par, mdl)
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
        """Nodes the job runs on (of every group its placement names)."""
        if self.placement is not None:
            return sum(n for n, _ in self.group_nodes().values())
        return self.nodes if self.nodes is not None else self.system.nodes

    @property
    def devices(self) -> int:
        """Devices the job runs on."""
        if self.placement is not None:
            return sum(d for _, d in self.group_nodes().values())
        return self.nodes_used * self.system.node.devices_per_node

    def group_nodes(self) -> dict[str, tuple[int, int]]:
        """Per node group of the placement: (nodes, devices) the job uses there."""
        assert self.placement is not None
        par = self.parallelism
        per_stage = par.tp * par.cp * par.ep * (par.dp if isinstance(par.dp, int) else 1)
        out = {}
        for name, replicas in self.placement.replica_counts().items():
            dpn = self.system.group(name).node.devices_per_node
            devices = replicas * par.tp * par.pp * par.cp * par.ep
            out[name] = (-(-devices // dpn), devices)
        for name, stages in self.placement.stage_counts().items():
            dpn = self.system.group(name).node.devices_per_node
            out[name] = (-(-stages * per_stage // dpn), stages * per_stage)
        return out

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
        devices × micro-batches × layers per stage (the last stage's, with its
        multi-token prediction modules) + their gradient buckets (four bytes a gradient,
        the most any precision reduces)."""
        par = self.parallelism
        simulated = par.pp * (par.tp * self.dp if self.fidelity == "full" else 1)
        layers = -(-self.model.layers // par.pp) + self.model.mtp_depth  # the last stage's
        grad_bytes = 4 * self.model.params / (par.tp * par.pp)
        buckets = par.virtual_stages + min(grad_bytes / (par.dp_bucket_mb * 1e6), 1e30)
        return int(simulated * (self.micro_batches * layers + (buckets if self.dp > 1 else 0)))

    @property
    def micro_batches(self) -> int:
        """Micro-batches per pipeline per step (m); the dp·ep pipelines each run their own
        (expert-parallel ranks hold different sequences)."""
        par = self.parallelism
        return self.training.global_batch // (par.micro_batch * self.dp * par.ep)


def _degrees(par: Parallelism) -> str:
    """``tp(8)·pp(4)``, with ``·cp(2)`` and ``·ep(8)`` where above 1."""
    return f"tp({par.tp})·pp({par.pp})" + "".join(
        f"·{a}({d})" for a, d in (("cp", par.cp), ("ep", par.ep)) if d > 1)


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
