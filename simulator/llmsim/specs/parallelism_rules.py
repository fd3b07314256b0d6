"""The rules between a layout's switches: which combinations of schedule, ZeRO stage,
overlap and recompute switches a framework allows, each refused with one sentence naming
the field, the value and the fix (checked when a :class:`~llmsim.specs.parallelism.Parallelism`
is made)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llmsim.specs.parallelism import Parallelism

NOT_REPLAYED = ("pipedream",)
"""Schedules ``llmsim schedule show`` draws but the engine does not replay yet
(PipeDream's run without a flush)."""


def check_layout_rules(par: Parallelism) -> None:
    """Raise ``ValueError`` for the first rule ``par`` breaks."""
    if par.dp_mode == "parameter_server" and (par.zero or par.ep > 1 or par.cp > 1):
        raise ValueError(
            f"parallelism.dp_mode: parameter_server with zero {par.zero}, ep {par.ep}, "
            f"cp {par.cp}; the servers hold whole gradients of dense replicas: set zero "
            "to 0 and ep and cp to 1, or use dp_mode all_reduce"
        )
    if par.schedule in NOT_REPLAYED:
        raise ValueError(
            f"parallelism.schedule: {par.schedule} is drawn by `llmsim schedule show` "
            "but the engine does not replay it yet; use gpipe, 1f1b, interleaved-1f1b, "
            "zb-h1, zb-h2, zb-v, chimera or dualpipe"
        )
    if par.schedule in ("chimera", "dualpipe") and (par.pp % 2 or par.zero == 3):
        raise ValueError(
            f"parallelism.schedule: {par.schedule} with pp {par.pp} and zero "
            f"{par.zero}; its down and up pipelines need an even pp (Li & Hoefler "
            "2021 §3.1), and ZeRO-3's per-layer gathers over the two weight replicas "
            "are not modelled: use an even pp and zero 0 to 2, or another schedule"
        )
    if par.moe_comm_units and not par.moe_a2a_overlap:
        raise ValueError(
            f"parallelism.moe_comm_units: {par.moe_comm_units} without moe_a2a_overlap; "
            "the all-to-all kernels hold units only while overlapped: set "
            "moe_a2a_overlap true, or moe_comm_units 0"
        )
    if par.recompute_norms_and_up_proj and par.recompute in ("full", "full_keep_attention"):
        raise ValueError(
            f"parallelism.recompute_norms_and_up_proj: true with recompute {par.recompute}, "
            "which recomputes the norms already; drop it, or use recompute none or selective"
        )
    if par.modules_per_layer is not None and not (
            par.gather_per_module or par.grad_buckets_whole_matrices):
        raise ValueError(
            f"parallelism.modules_per_layer: {par.modules_per_layer} counts the matrices "
            "gathered or reduced one by one, and neither gather_per_module nor "
            "grad_buckets_whole_matrices is on; set one of them, or remove modules_per_layer"
        )
    if par.schedule == "interleaved-1f1b" and par.virtual_stages < 2:
        raise ValueError(
            "parallelism.virtual_stages: 1 with schedule interleaved-1f1b; "
            "set virtual_stages to 2 or more, or use schedule 1f1b"
        )
    if par.schedule == "zb-v" and par.virtual_stages != 2:
        raise ValueError(
            f"parallelism.virtual_stages: {par.virtual_stages} with schedule zb-v, which "
            "places exactly two model chunks on each stage; set virtual_stages to 2"
        )
    if par.schedule not in ("interleaved-1f1b", "zb-v") and par.virtual_stages != 1:
        raise ValueError(
            f"parallelism.virtual_stages: {par.virtual_stages} needs schedule "
            f"interleaved-1f1b (got {par.schedule}); change one of them"
        )
    if par.overlap_tp_comm and par.tp > 1 and not par.sequence_parallel:
        raise ValueError(
            "parallelism.overlap_tp_comm: true needs sequence_parallel: true (the "
            "overlap pipelines its all-gathers and reduce-scatters, as Megatron-LM's "
            "--tp-comm-overlap requires --sequence-parallel); set both or neither"
        )
    if par.async_tp_allreduce and par.sequence_parallel:
        raise ValueError(
            "parallelism.async_tp_allreduce: true needs sequence_parallel: false (with "
            "sequence parallelism the backward reduce-scatters instead; Megatron-LM "
            "ignores the flag then); turn one of them off"
        )
    if par.overlap_param_gather and par.zero not in (1, 2):
        raise ValueError(
            f"parallelism.overlap_param_gather: true needs zero 1 or 2 (got {par.zero}): "
            "it overlaps the distributed optimizer's weight all-gather; set zero or turn "
            "it off"
        )
    if par.grad_reduce_launch == "pp_aligned" and (
            par.schedule not in ("1f1b", "interleaved-1f1b") or par.zero == 3):
        raise ValueError(
            f"parallelism.grad_reduce_launch: pp_aligned with schedule {par.schedule} "
            f"and zero {par.zero}; it is how Megatron-Core's DDP issues the reductions "
            "in its 1f1b and interleaved-1f1b schedules, at zero 0 to 2 — change those, "
            "or use bucket_ready"
        )
    if par.zero == 3:
        for field in ("grad_bucket_nan_check", "grad_bucket_prescale"):
            if getattr(par, field):
                raise ValueError(
                    f"parallelism.{field}: true with zero 3; the bucket checks are "
                    "Megatron-Core DDP's, whose ZeRO stops at 2 — set zero to 1 or 2, or "
                    "turn it off"
                )
    if par.pp == 1:
        for field in ("first_stage_layers", "last_stage_layers"):
            if getattr(par, field) is not None:
                raise ValueError(
                    f"parallelism.{field}: {getattr(par, field)} needs pp ≥ 2 (one stage "
                    "holds every layer); remove it or raise pp"
                )
    if par.cp == 1 and par.cp_schedule != "te_ring":
        raise ValueError(
            f"parallelism.cp_schedule: {par.cp_schedule} schedules context-parallel "
            "attention, and cp is 1 (no context parallelism), so it would be ignored; raise "
            "cp to an even degree of 2 or more, or remove cp_schedule"
        )
    if par.layers_per_stage is not None and (
            len(par.layers_per_stage) != par.pp or par.first_stage_layers is not None
            or par.last_stage_layers is not None):
        raise ValueError(
            f"parallelism.layers_per_stage: {par.layers_per_stage} must give one count "
            f"per stage (pp = {par.pp}) and replaces first_stage_layers / "
            "last_stage_layers; give pp counts and remove those two"
        )
    if par.expert_tp is not None and par.tp % par.expert_tp:
        raise ValueError(
            f"parallelism.expert_tp: {par.expert_tp} does not divide tp {par.tp}; the "
            "routed experts are split over adjacent ranks of the TP group (Megatron-Core's "
            "tp·cp·dp = expert_tp·ep·expert-dp) — choose a divisor of tp, or remove it"
        )
    if sorted(par.rank_order) != sorted(["tp", "cp", "ep", "dp", "pp"]):
        raise ValueError(
            f"parallelism.rank_order: {par.rank_order} must list each of tp, cp, ep, dp, pp "
            "exactly once"
        )
