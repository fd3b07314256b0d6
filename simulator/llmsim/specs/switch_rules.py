"""The scenario rules that read the overlap switches a layout search varies between the
variants of one layout (:meth:`llmsim.specs.scenario.Scenario.check_switch_rules`), each
refused with one sentence naming the field, the value and the fix; the scenario's
validation calls them in its order."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llmsim.specs.model import Model
    from llmsim.specs.parallelism import Parallelism
    from llmsim.specs.system import System
    from llmsim.specs.training import Training


def check_moe_fields(par: Parallelism, mdl: Model) -> None:
    """The MoE settings (the all-to-all overlap among them) need a MoE model."""
    for field in ("expert_tp", "moe_a2a_overlap", "moe_max_nodes"):
        if getattr(par, field) not in (None, False) and mdl.moe is None:
            raise ValueError(
                f"parallelism.{field}: {getattr(par, field)} needs a mixture-of-experts "
                f"model ({mdl.name} is dense); remove it or give the model a moe section"
            )


def check_a2a_overlap(par: Parallelism, trn: Training) -> None:
    """The MoE all-to-all overlap needs an all-to-all, and a framework that overlaps it:
    Megatron-Core's, not DeepSpeed's. DeepSpeed 0.5.8's ``MOELayer.forward``
    (``deepspeed/moe/sharded_moe.py`` at 1bc13fe83) and X-MoE's ``MOEv2Layer.forward``
    (``deepspeed/moe/moe_v2.py`` at 33c69c95) call their two all-to-alls in line between
    the dispatch, the experts and the combine, on the default stream, and neither tree
    has a second stream or an asynchronous collective under ``deepspeed/moe``."""
    if par.moe_a2a_overlap and par.expert_ranks == 1:
        raise ValueError(
            "parallelism.moe_a2a_overlap: true without expert parallelism has no "
            "all-to-all to hide; turn it off, or set ep > 1 (or expert_tp 1 with tp > 1)"
        )
    if par.moe_a2a_overlap and par.moe_dispatcher == "deepspeed":
        raise ValueError(
            "parallelism.moe_a2a_overlap: true with moe_dispatcher: deepspeed, whose "
            "MOELayer runs its all-to-alls in line between the einsums and the experts; "
            "turn moe_a2a_overlap off, or use Megatron-Core's alltoall dispatcher"
        )
    if par.moe_a2a_overlap and trn.expert_loop == "deepspeed_uneven":
        raise ValueError(
            "parallelism.moe_a2a_overlap: true with training.expert_loop: deepspeed_uneven, "
            "whose X-MoE layer runs its all-to-alls in line around its expert loop; turn "
            "moe_a2a_overlap off, or set expert_loop to grouped"
        )


def check_shared_expert_overlap(par: Parallelism, mdl: Model) -> None:
    """The shared experts' overlap needs shared experts and expert parallelism."""
    if par.moe_shared_expert_overlap and (
            par.ep == 1 or mdl.moe is None or not mdl.moe.shared_experts):
        raise ValueError(
            "parallelism.moe_shared_expert_overlap: true needs a MoE model with "
            "shared experts and ep > 1 (it hides the shared experts behind the token "
            "all-to-alls); turn it off, or set model.moe.shared_experts and ep"
        )


def check_tp_overlap_units(sysm: System, par: Parallelism) -> None:
    """The TP overlap's kernels leave compute units to the GEMMs."""
    accel = sysm.node.accelerator
    units = accel.gemm.compute_units
    held = sysm.node.collective_units  # beside a data-parallel collective as well
    for field, sms in par.tp_overlap_units.items():
        if sms + held >= units:
            raise ValueError(
                f"parallelism.{field}: {sms} leaves none of {accel.name}'s {units} "
                f"compute units to the GEMMs (other kernels hold {held} more); "
                f"use fewer than {units - held}"
            )
