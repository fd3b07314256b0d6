"""A layout's scenario: the base scenario with a :class:`~llmsim.search.layout.Layout`,
validated by the specs' own rules (and the framework settings the layout rules out
dropped, as the frameworks do).
"""

from __future__ import annotations

from typing import Any

from llmsim.search.fast_rules import revalidated
from llmsim.search.layout import Layout
from llmsim.specs import Scenario
from llmsim.specs.parallelism_rules import NOT_REPLAYED

FULL_RECOMPUTE = ("full", "full_keep_attention")
"""Recompute modes that recompute every norm of the layer (the spec refuses
``recompute_norms_and_up_proj`` with them)."""


def parallelism_of(scenario: Scenario, layout: Layout) -> tuple[Any, Any]:
    """The validated ``parallelism`` and ``training`` of ``scenario`` with ``layout``
    (raises ValueError when a rule of theirs rules it out).

    Framework settings of the scenario that a layout rules out are dropped, as the
    frameworks do: Megatron-Core's aligned gradient launch where its schedules do not
    run (GPipe, ZB-H1, ZeRO-3), its bucket checks at ZeRO-3, uneven first/last stage
    splits when pp differs from the scenario's, the MoE all-to-all overlap where no
    all-to-all is left (and the units it holds wherever it is off), the shared experts'
    overlap where the all-to-all overlap is on (Megatron-Core 4415119414 refuses the two
    together, ``TransformerConfig.__post_init__``), the recompute of the norms and MLA
    up-projections under full recompute (either of :data:`FULL_RECOMPUTE`), and the
    scenario's ``cp_schedule`` (DistFlashAttn's, say) where the layout's cp is 1 (nothing
    to schedule; kept at cp ≥ 2). A schedule the engine does not replay as one
    step (PipeDream, ``NOT_REPLAYED``; the search's ``--asynchronous``) is checked as the
    1F1B order it runs and then set: the estimator and the memory model read it. The
    layout's ``expert_tp`` (tp or 1) is set;
    where it leaves it (0), an ``expert_tp`` equal to the scenario's tp follows the
    layout's and 1 is kept.
    """
    par = scenario.parallelism
    updates = layout.parallelism_updates()
    if par.grad_reduce_launch == "pp_aligned" and (
            layout.schedule not in ("1f1b", "interleaved-1f1b") or layout.zero == 3):
        updates["grad_reduce_launch"] = "bucket_ready"
    if layout.zero == 3:
        updates["grad_bucket_nan_check"] = False
        updates["grad_bucket_prescale"] = False
    if layout.pp != par.pp or layout.virtual_stages != par.virtual_stages:
        updates["first_stage_layers"] = None
        updates["last_stage_layers"] = None
    # Experts split like the dense MLP follow the layout's tp; whole experts (expert_tp
    # 1) need tp·ep to divide them, and the all-to-all overlap an all-to-all.
    if not layout.expert_tp and par.expert_tp not in (None, 1):
        updates["expert_tp"] = None
    moe = scenario.model.moe
    etp = layout.expert_tp or par.expert_tp
    whole = etp == 1 and moe is not None
    if whole and moe.experts % (layout.tp * layout.ep):
        raise ValueError(f"expert_tp 1: tp·ep = {layout.tp * layout.ep} does not divide the "
                         f"{moe.experts} experts")
    if layout.moe_a2a_overlap and layout.ep * (layout.tp if whole else 1) == 1:
        updates["moe_a2a_overlap"] = False
    if not updates["moe_a2a_overlap"]:
        updates["moe_comm_units"] = 0  # held only while all-to-alls overlap
    elif par.moe_shared_expert_overlap:  # Megatron-Core refuses the two together
        updates["moe_shared_expert_overlap"] = False
    if layout.recompute in FULL_RECOMPUTE:  # recomputes the norms and up-projections already
        updates["recompute_norms_and_up_proj"] = False
    if layout.cp == 1 and par.cp_schedule != "te_ring":  # no context-parallel attention
        updates["cp_schedule"] = "te_ring"
    asynchronous = updates.get("schedule") in NOT_REPLAYED  # PipeDream (space.ASYNCHRONOUS)
    if asynchronous:  # checked as the 1F1B it runs, step by step (llmsim.steady_state)
        updates["schedule"] = "1f1b"
    new_par = revalidated(par, updates,
                          lambda: type(par).model_validate({**_dump(par), **updates}))
    if asynchronous:
        new_par = new_par.model_copy(update={"schedule": layout.schedule})
    training = scenario.training
    if layout.global_batch != training.global_batch:
        training = type(training).model_validate(
            {**training.model_dump(exclude_unset=True), "global_batch": layout.global_batch})
    return new_par, training


def apply(scenario: Scenario, layout: Layout) -> Scenario:
    """``scenario`` with ``layout``, validated (raises ValueError when it cannot run); see
    :func:`parallelism_of` for the settings a layout drops."""
    new_par, training = parallelism_of(scenario, layout)
    return with_layout(scenario, layout.nodes, new_par, training)


def with_layout(scenario: Scenario, nodes: int, par: Any, training: Any) -> Scenario:
    """``scenario`` (every field kept) on ``nodes`` nodes with ``par`` and ``training``,
    in reduced fidelity, validated by the scenario's own rules (a PipeDream ``par`` as
    the 1F1B it runs, :func:`parallelism_of`), without pydantic's pass over the fields it
    keeps (:func:`.fast_rules.revalidated`)."""
    unreplayed = par.schedule in NOT_REPLAYED
    checked = par.model_copy(update={"schedule": "1f1b"}) if unreplayed else par
    updates = {"nodes": nodes, "parallelism": checked, "training": training,
               "fidelity": "reduced"}
    out = revalidated(scenario, updates, lambda: type(scenario).model_validate(
        {**{name: getattr(scenario, name) for name in type(scenario).model_fields},
         **updates}))
    return out.model_copy(update={"parallelism": par}) if unreplayed else out


def switched(core: Scenario, base: Scenario, layout: Layout) -> Scenario:
    """``core`` (a validated scenario of a core layout) with the overlap switches of
    ``layout``, one of its :func:`switch_variants`: only the parallelism changes, so only
    it and the scenario's own rules are checked again (raises ValueError)."""
    new_par, _ = parallelism_of(base, layout)
    scenario = core.model_copy(update={"parallelism": new_par})
    scenario._check_layout()  # the scenario's rules: the TP overlap's compute units
    return scenario


_DUMPS: dict[int, tuple[Any, dict[str, Any]]] = {}


def _dump(par: Any) -> dict[str, Any]:
    """``par.model_dump()``, memoised per object (a search applies thousands of layouts to
    one base)."""
    hit = _DUMPS.get(id(par))
    if hit is None or hit[0] is not par:
        hit = _DUMPS[id(par)] = (par, par.model_dump())
    return hit[1]
