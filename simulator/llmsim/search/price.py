"""Pricing a batch of layouts: validate, prune for memory, estimate (one worker's job).

:func:`price_batch` is what a process of the local pool or a Dask worker runs: a pure
function of picklable values, with one :class:`~llmsim.search.estimate.Estimator` per
process kept between batches so that the parts layouts share are priced once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from llmsim.errors import UserError
from llmsim.memory import state_bytes_per_param
from llmsim.params import (
    embedding_params_per_device,
    head_params_per_device,
    layers_params_per_device,
)
from llmsim.search.estimate import Estimator
from llmsim.search.space import Layout, apply, parallelism_of, switch_variants, switched
from llmsim.simulation import check_posted_units
from llmsim.specs import Scenario

_ESTIMATOR: Estimator | None = None


def estimator() -> Estimator:
    """This process's estimator (its memo tables live as long as the process)."""
    global _ESTIMATOR
    if _ESTIMATOR is None:
        _ESTIMATOR = Estimator()
    return _ESTIMATOR


@dataclass
class BatchResult:
    """What pricing one batch of core layouts gave."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    """One row per priced layout (:func:`row`)."""
    invalid: int = 0
    """Layouts a scenario rule rejected."""
    out_of_memory: int = 0
    """Layouts rejected for memory (over the capacity less the headroom)."""


def state_fits(scenario: Scenario,
               headroom: float) -> Callable[[int, int, int, int, int, int], bool]:
    """A lower bound of the model state per device, as a filter of
    (tp, pp, dp, ep, cp, zero).

    The busiest stage holds at least the average stage's parameters; its weights,
    gradients and optimizer state (sharded by ZeRO as :func:`memory_per_stage` shards
    them: the dense weights over dp·ep·cp ranks, the routed experts' over dp·cp) alone
    must fit in the capacity less the headroom, or no layout of the branch can fit.
    """
    model, precision = scenario.model, scenario.training.precision
    capacity = scenario.system.node.accelerator.hbm_bytes * (1 - headroom)
    w, g, o = state_bytes_per_param(precision)
    totals: dict[tuple[int, int, int], tuple[float, float]] = {}

    def fits(tp: int, pp: int, dp: int, ep: int, cp: int, zero: int) -> bool:
        if (tp, pp, ep) not in totals:
            dense, expert = layers_params_per_device(model, tp, ep, 0, model.layers)
            ends = embedding_params_per_device(model, tp) + head_params_per_device(model, tp, pp)
            totals[(tp, pp, ep)] = ((dense + ends) / pp, expert / pp)
        dense, expert = totals[(tp, pp, ep)]
        state = 0.0
        for params, ranks in ((dense, dp * ep * cp), (expert, dp * cp)):
            state += params * (w / (ranks if zero >= 3 else 1) + g / (ranks if zero >= 2 else 1)
                               + o / (ranks if zero >= 1 else 1))
        return state <= capacity

    return fits


def price_batch(base: Scenario, cores: list[Layout], fixed: dict[str, Any],
                headroom: float) -> BatchResult:
    """Validate, prune and estimate every switch variant of each core layout."""
    est = estimator()
    out = BatchResult()
    capacity = base.system.node.accelerator.hbm_bytes * (1 - headroom)
    per_node, total_nodes = base.system.node.devices_per_node, base.nodes_used
    for core in cores:
        try:
            par, training = parallelism_of(base, core)
            memory = est.memory_of(base, par, training, core.dp)
        except (ValueError, UserError):
            out.invalid += 1
            continue
        peak = max(memory, key=lambda m: m.total_bytes)
        variants = list(switch_variants(core, fixed))
        if peak.total_bytes > capacity:
            out.out_of_memory += len(variants)
            continue
        core_scenario = None
        for layout in variants:
            try:
                if core_scenario is None:
                    core_scenario = apply(base, replace(layout, overlap_tp_comm=False,
                                                        overlap_pp_comm=False,
                                                        overlap_param_gather=False))
                scenario = switched(core_scenario, base, layout)
                check_posted_units(scenario)
            except (ValueError, UserError):
                out.invalid += 1
                continue
            e = est.estimate(scenario)
            out.rows.append(row(layout, e, peak.total_bytes, peak.capacity_bytes,
                                total_nodes * per_node))
    return out


def row(layout: Layout, e: Any, memory_bytes: float, capacity_bytes: float,
        machine_devices: int) -> dict[str, Any]:
    """A table row: the layout, the estimate and the memory, units in the names."""
    return {
        "key": layout.key,
        **layout.as_dict(),
        "devices": layout.devices,
        "idle_devices": machine_devices - layout.devices,
        "micro_batches": layout.global_batch // (layout.micro_batch * layout.dp),
        "memory_gb": memory_bytes / 1e9,
        "memory_fraction": memory_bytes / capacity_bytes,
        "est_step_time_s": e.step_time_s,
        "est_pipeline_s": e.pipeline_s,
        "est_dp_tail_s": e.dp_tail_s,
        "est_optimizer_s": e.optimizer_s,
        "est_mfu": e.mfu,
        "est_tokens_per_s": e.tokens_per_s,
        "est_tokens_per_device_s": e.tokens_per_s / layout.devices,
        "est_days": e.days_to_train,
    }
