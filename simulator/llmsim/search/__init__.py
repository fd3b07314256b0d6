"""The layout search: the best parallel layout of a scenario's model on its machine.

``enumerate → prune → estimate → confirm`` (design §13): :mod:`.space` lists every valid
layout, the memory model prunes those that do not fit with the headroom asked, the
estimator (:mod:`.estimate`, the engine's own cost models with a closed-form schedule)
prices the rest, and the SimPy engine re-runs the best ``top`` of them, which are then
ranked by the engine's numbers (:mod:`.confirm`). Results are stored as they are made
(:mod:`.store`), so a killed search resumes without pricing a layout twice; batches run
on a local process pool or a Dask cluster (:mod:`.runner`).

>>> import llmsim
>>> table = llmsim.search(llmsim.load_scenario("selene-gpt3"), top=5)  # doctest: +SKIP
>>> table.head()  # doctest: +SKIP
"""

from __future__ import annotations

import os
import sys
import time
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmsim.errors import UserError
from llmsim.search.batch_range import check_batch_range
from llmsim.search.batching import widest
from llmsim.search.bound import DaysBound, applies
from llmsim.search.confirm import OBJECTIVES, confirm, objective_column
from llmsim.search.draw import draw_batches
from llmsim.search.fix import parse_fix
from llmsim.search.price import state_fits
from llmsim.search.runner import run_dask, run_pool, run_serial
from llmsim.search.space import (
    ASYNCHRONOUS,
    LAYOUT_FIELDS,
    Layout,
    SpaceOptions,
    apply,
    layout_of,
)
from llmsim.search.store import Store
from llmsim.simulation import collector_paused
from llmsim.specs import Scenario

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["OBJECTIVES", "Layout", "Progress", "SearchSummary", "apply", "layout_of",
           "search"]

Progress = Callable[[int, int, int], None]
"""``progress(batches_done, batches_total, layouts_priced)``."""


@dataclass(frozen=True)
class SearchSummary:
    """What a search looked at (``DataFrame.attrs["summary"]`` of its result)."""

    scenario: str
    objective: str
    machine_devices: int
    core_layouts: int
    """Layouts before the overlap switches, after the model-state bound."""
    sampled: bool
    """Whether ``max_layouts`` made the search price a random sample of them."""
    priced: int
    invalid: int
    out_of_memory: int
    confirmed: int
    memory_headroom: float
    wall_s: float
    estimate_wall_s: float
    layouts_per_s: float
    """Layouts priced per second by the estimator (the pricing phase's wall time)."""
    timed_out: int = 0
    """Engine runs of candidates that took longer than ``confirm_timeout_s``."""
    skipped: int = 0
    """Core layouts not priced because the bound shows that none of them can be among
    the ``top`` best (``bound``; 0 without it)."""
    space_layouts: int = 0
    """Core layouts in the whole space (``core_layouts`` is the sample of them that
    ``max_layouts`` drew, or all of them)."""


DEFAULT_HEADROOM = 0.10
"""Share of device memory a layout must leave free unless told otherwise (a heterogeneous
job's placements too: their balance leaves it, :mod:`.placement_search`)."""


def search(
    scenario: Scenario,
    *,
    objective: str = "days",
    fix: Mapping[str, Any] | list[str] | None = None,
    batch_range: tuple[int, ...] | None = None,
    max_layouts: int | None = None,
    memory_headroom: float | None = None,
    top: int = 20,
    workers: int | None = None,
    client: Any = None,
    out: str | Path | None = None,
    resume: bool = False,
    max_tp: int | None = None,
    max_micro_batch: int = 16,
    max_cp: int = 1,
    progress: Progress | None = None,
    confirm_timeout_s: float | None = None,
    bound: bool = False,
    max_parameter_servers: int = 0,
    asynchronous: bool = False,
) -> pd.DataFrame:
    """Search every valid layout of ``scenario`` and return them, best first.

    The table has one row per priced layout: its fields, memory and the estimator's
    numbers (``est_*``); the ``top`` best by the estimator also carry the engine's
    (``step_time_s``, ``mfu``, ``days``, ``bubble_fraction``, ``est_over_engine``) and
    come first, ranked by them; with ``confirm_timeout_s`` an engine run that takes longer
    is given up (its row ``timed_out``) and the next candidate confirmed instead.
    ``attrs["summary"]`` is a :class:`SearchSummary`, ``attrs["best"]`` the best layout's
    scenario. ``workers`` local processes price the layouts (default: every core), or
    ``client``'s Dask cluster when given. An MoE model's expert-parallel degree is
    searched over the divisors of its experts; the context-parallel degree up to
    ``max_cp``. With ``bound`` (objective days, a run given in FLOPs) the layouts are
    priced most devices first and those that provably cannot be among the estimator's
    ``top`` best are skipped (:mod:`.bound`; ``summary.skipped``). With
    ``max_parameter_servers``, parameter servers in place of the gradient all-reduce
    (``dp_mode: parameter_server``). ``memory_headroom`` is 0.1 unless given. With
    ``asynchronous``, PipeDream's layouts too, whose weight updates are stale
    (:data:`.space.ASYNCHRONOUS`; confirmed by their replayed steady state).
    ``batch_range`` (low, high) or (low, high, step) lets the global batch vary
    (:func:`.batch_range.global_batches`); a space of more than :data:`.draw.MAX_CORE_LAYOUTS`
    core layouts needs ``max_layouts`` (:mod:`.draw`).

    A scenario with a ``placement`` (a heterogeneous job) has its placement searched
    instead: stages or replicas on its system's node groups, each run by the engine
    (:func:`.placement_search.placement_table`; ``objective``, ``max_layouts`` and
    ``memory_headroom`` apply; the other options do not).
    """
    started = time.perf_counter()
    if objective not in OBJECTIVES:
        raise UserError(f"--objective: {objective!r} is not one of {', '.join(OBJECTIVES)}")
    if objective == "days" and scenario.training.tokens is None \
            and scenario.training.flops is None:
        raise UserError("--objective: days needs training.tokens or training.flops in the "
                        "scenario; set one, or use --objective step_time")
    if memory_headroom is not None and not 0 <= memory_headroom < 1:
        raise UserError(f"--memory-headroom: {memory_headroom} must be at least 0 and below 1 "
                        "(a share of device memory, e.g. 0.1)")
    if top < 0:
        raise UserError(f"--top: {top} must be 0 or more")
    if max_parameter_servers < 0:
        raise UserError(f"--max-parameter-servers: {max_parameter_servers} must be 0 (none) "
                        "or more")
    memory_headroom = DEFAULT_HEADROOM if memory_headroom is None else memory_headroom
    if scenario.placement is not None:  # a heterogeneous job: its placement is searched
        from llmsim.search.placement_search import placement_table

        return placement_table(scenario, objective=objective, max_layouts=max_layouts,
                               memory_headroom=memory_headroom)
    if confirm_timeout_s is not None and not confirm_timeout_s > 0:
        raise UserError(f"--confirm-timeout: {confirm_timeout_s} must be above 0 (seconds "
                        "one engine run may take)")
    if max_micro_batch < 1:
        raise UserError(f"--max-micro-batch: {max_micro_batch} must be 1 or more")
    if max_tp is not None and max_tp < 1:
        raise UserError(f"--max-tp: {max_tp} must be 1 or more")
    fixed = parse_fix(fix) if isinstance(fix, list) else dict(fix or {})
    if fixed.get("nodes", 0) > scenario.nodes_used:
        raise UserError(f"--fix: nodes={fixed['nodes']} is more than the scenario's "
                        f"{scenario.nodes_used} nodes; fix at most that, or raise the "
                        "scenario's nodes (--set nodes=N)")
    check_batch_range(batch_range)
    if fixed.get("schedule") in ASYNCHRONOUS and not asynchronous:
        raise UserError(f"--fix: schedule={fixed['schedule']} updates the weights "
                        "asynchronously (stale weights, not the same training); add "
                        "--asynchronous to search it")
    options = SpaceOptions(fixed=fixed, batch_range=batch_range, max_tp=max_tp,
                           max_micro_batch=max_micro_batch, max_cp=max_cp,
                           max_parameter_servers=max_parameter_servers,
                           asynchronous=asynchronous)
    base = scenario.model_copy(update={"fidelity": "reduced"})
    bounded = bound and applies(base, objective)
    with collector_paused():  # a sample's layouts live, and make no cycles
        # Counted first, then cut whole from its branches or sampled by index (.draw):
        # bounded memory; the whole space's layouts are made where they are priced
        drawn = draw_batches(base, options, state_fits(base, memory_headroom), max_layouts,
                             scenario.seed, bounded)
        batches = list(enumerate(drawn.batches))
    manifest = {"scenario": base.model_dump(mode="json"), "objective": objective,
                "fixed": {k: v for k, v in fixed.items()},
                "batch_range": list(batch_range) if batch_range is not None else None,
                "max_layouts": max_layouts, "memory_headroom": memory_headroom,
                "max_tp": max_tp, "max_micro_batch": max_micro_batch, "max_cp": max_cp,
                "bound": bounded, "layout_fields": list(LAYOUT_FIELDS),
                "batches": "walk_key"}
    # The batch range as a list: JSON gives one back, and a tuple never equals it (resume).
    # The batching too: a store kept with batches cut otherwise numbers them otherwise.
    # The layout fields too: a store kept before expert_tp was one has no such column.
    if max_parameter_servers:  # only then: a store kept before the option still resumes
        manifest["max_parameter_servers"] = max_parameter_servers
    if asynchronous:  # the same
        manifest["asynchronous"] = True
    store = Store(Path(out) if out is not None else None, manifest, resume)
    todo = [(i, c) for i, c in batches if i not in store.done_batches]
    estimate_started = time.perf_counter()
    priced_before = store.priced
    workers = workers or os.cpu_count() or 1
    # The bound reads a batch's most devices, which a layout that uses them stands for.
    days_bound = DaysBound(base, top, {i: widest(part, drawn.branches, fixed)
                                       for i, part in batches}) if bounded else None
    if days_bound is not None:
        days_bound.add(store.column("est_days"))
    keep = days_bound.keep if days_bound is not None else None
    if client is not None:
        results = run_dask(base, todo, fixed, memory_headroom, client, drawn.branches)
    elif workers > 1 and len(todo) > 1:
        results = run_pool(base, todo, fixed, memory_headroom, workers, keep, drawn.branches)
    else:
        results = run_serial(base, todo, fixed, memory_headroom, keep, drawn.branches)
    try:
        for index, batch in results:
            store.add(index, batch.columns, batch.invalid, batch.out_of_memory)
            if days_bound is not None:
                days_bound.add(batch.columns["est_days"])
            if progress is not None:
                progress(len(store.done_batches), len(batches), store.priced)
    finally:
        store.close()
    estimate_wall = time.perf_counter() - estimate_started
    # The table goes to confirm without another reference, so its sorted copies replace
    # it rather than add to it.
    table, best, timed_out = confirm(base, store.table(), objective, top,
                                     workers if client is None else 1, confirm_timeout_s)
    summary = SearchSummary(
        scenario=scenario.name, objective=objective,
        machine_devices=scenario.devices, core_layouts=drawn.core_layouts,
        sampled=drawn.sampled,
        priced=len(table), invalid=store.invalid, out_of_memory=store.out_of_memory,
        confirmed=int(table["step_time_s"].notna().sum()) if "step_time_s" in table else 0,
        memory_headroom=memory_headroom, wall_s=time.perf_counter() - started,
        estimate_wall_s=estimate_wall,
        layouts_per_s=(store.priced - priced_before) / estimate_wall if estimate_wall else 0.0,
        timed_out=timed_out,
        skipped=sum(len(c) for i, c in batches if i not in store.done_batches),
        space_layouts=drawn.space_layouts)
    table.attrs["summary"] = summary
    table.attrs["best"] = best
    table.attrs["objective_column"] = objective_column(objective)
    return table


class _CallableModule(types.ModuleType):
    """``llmsim.search`` stays a package and can be called: ``llmsim.search(scenario, …)``
    is :func:`search`."""

    def __call__(self, *args: Any, **kwargs: Any) -> pd.DataFrame:
        return search(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
