"""Pricing a batch of layouts: validate, prune for memory, estimate (one worker's job).

:func:`price_batch` is what a process of the local pool or a Dask worker runs: a pure
function of picklable values, with one :class:`~llmsim.search.estimate.Estimator` per
process kept between batches so that the parts layouts share are priced once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

from llmsim.errors import UserError
from llmsim.memory import state_bytes_per_param
from llmsim.params import (
    embedding_params_per_device,
    head_params_per_device,
    layers_params_per_device,
)
from llmsim.result import SECONDS_PER_DAY
from llmsim.search.estimate import Estimator
from llmsim.search.fast_rules import copied
from llmsim.search.fit import PeakMemory
from llmsim.search.space import (
    LAYOUT_FIELDS,
    SWITCHES,
    Layout,
    parallelism_of,
    switch_variants,
    variant_count,
    with_layout,
)
from llmsim.simulation import check_posted_units, collector_paused
from llmsim.specs import Scenario

_ESTIMATOR: Estimator | None = None
_BASES: dict[str, tuple[Scenario, PeakMemory]] = {}
"""This process's copy of each base scenario (by its JSON) and its memory model: a batch
arrives with its own unpickled copy, and the memo tables key on the objects."""
_LAST_BASE: list[tuple[Scenario, tuple[Scenario, PeakMemory]] | None] = [None]
"""The last base :func:`interned` was given (held: its id stays its own) and its entry."""

ROW_COLUMNS = ("key", *LAYOUT_FIELDS, "dp_mode", "devices", "idle_devices", "micro_batches",
               "memory_gb", "memory_fraction", "est_step_time_s", "est_pipeline_s",
               "est_dp_tail_s", "est_optimizer_s", "est_mfu", "est_tokens_per_s",
               "est_tokens_per_device_s", "est_days")
"""The columns of a priced layout's row (:func:`row`), in order."""


def estimator() -> Estimator:
    """This process's estimator (its memo tables live as long as the process)."""
    global _ESTIMATOR
    if _ESTIMATOR is None:
        _ESTIMATOR = Estimator()
    return _ESTIMATOR


def interned(base: Scenario) -> tuple[Scenario, PeakMemory]:
    """The process's own copy of ``base`` (equal by value) and its :class:`PeakMemory`;
    the same object as the last call's (a pool worker's every batch, :mod:`.runner`) is
    looked up without its JSON (half a millisecond a batch)."""
    last = _LAST_BASE[0]
    if last is not None and last[0] is base:
        return last[1]
    key = base.model_dump_json()
    hit = _BASES.get(key)
    if hit is None:
        hit = _BASES[key] = (base, PeakMemory(base))
    _LAST_BASE[0] = (base, hit)
    return hit


@dataclass
class BatchResult:
    """What pricing one batch of core layouts gave."""

    columns: dict[str, Any] = field(
        default_factory=lambda: {name: [] for name in ROW_COLUMNS})
    """Per column of :data:`ROW_COLUMNS`, one value per priced layout (:func:`row`): a
    list while the batch is priced, a numpy array once it is (:func:`packed`)."""
    invalid: int = 0
    """Layouts a scenario rule rejected."""
    out_of_memory: int = 0
    """Layouts rejected for memory (over the capacity less the headroom)."""

    def __len__(self) -> int:
        return len(self.columns["key"])

    @property
    def rows(self) -> list[dict[str, Any]]:
        """The priced layouts as one dict per row."""
        names = list(self.columns)
        return [dict(zip(names, values, strict=True))
                for values in zip(*(list(c) for c in self.columns.values()), strict=True)]


def state_fits(scenario: Scenario,
               headroom: float) -> Callable[[int, int, int, int, int, int], bool]:
    """A lower bound of the model state per device, as a filter of
    (tp, pp, dp, ep, cp, zero).

    The busiest stage holds at least the average stage's parameters; its weights,
    gradients and optimizer state (sharded by ZeRO as :func:`memory_per_stage` shards
    them: the dense weights over dp·ep·cp ranks, the routed experts' over dp·cp; the
    fewer of split and whole experts) alone must fit in the capacity less the headroom,
    or no layout of the branch can fit.
    """
    model, precision = scenario.model, scenario.training.precision
    capacity = scenario.system.node.accelerator.hbm_bytes * (1 - headroom)
    w, g, o = state_bytes_per_param(precision)
    totals: dict[tuple[int, int, int], tuple[float, float]] = {}

    def fits(tp: int, pp: int, dp: int, ep: int, cp: int, zero: int) -> bool:
        if (tp, pp, ep) not in totals:
            dense, expert = layers_params_per_device(model, tp, ep, 0, model.layers)
            if model.moe is not None and model.moe.experts % (tp * ep) == 0:
                # whole experts (expert_tp 1) hold no replicated bias per TP rank: fewer
                expert = min(expert, layers_params_per_device(model, tp, tp * ep, 0,
                                                              model.layers, 1)[1])
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
    """Validate, prune and estimate every switch variant of each core layout, with
    Python's cyclic garbage collector paused (:func:`~llmsim.simulation.collector_paused`):
    a batch's memo entries live on, and the pricing makes no reference cycles (tested),
    yet at Python's default threshold (``llmsim.search()`` called from Python; the command
    line raises it) the collector's passes over a worker's growing memo tables and the
    inherited enumeration were 13–15 % of its CPU (``docs/search.md``, Speed)."""
    with collector_paused():
        return _priced(base, cores, fixed, headroom)


def _priced(base: Scenario, cores: list[Layout], fixed: dict[str, Any],
            headroom: float) -> BatchResult:
    """:func:`price_batch`'s work."""
    est = estimator()
    base, peak_memory = interned(base)
    out = BatchResult()
    capacity_bytes = base.system.node.accelerator.hbm_bytes
    capacity = capacity_bytes * (1 - headroom)
    machine_devices = base.system.node.devices_per_node * base.nodes_used
    priced: list[list[Any]] = []  # [layout, its estimate, peak memory bytes]
    for core in cores:
        try:
            par, training = parallelism_of(base, core)
            peak = peak_memory.peak_bytes(par, training, core.dp)
        except (ValueError, UserError):
            out.invalid += 1
            continue
        if peak > capacity:
            out.out_of_memory += variant_count(core, fixed)
            continue
        core_scenario = None
        for layout in switch_variants(core, fixed):
            try:
                if core_scenario is None:
                    core_scenario = applied(base, core, par, training)
                scenario = with_switches(core_scenario, layout)
                check_posted_units(scenario)
            except (ValueError, UserError):
                out.invalid += 1
                continue
            priced.append([layout, est.estimate(scenario), peak])
    out.columns = packed(columns(priced, capacity_bytes, machine_devices))
    return out


ESTIMATE_NUMBERS = ("step_time_s", "model_flops_per_step", "pipeline_s", "dp_tail_s",
                    "optimizer_s", "devices", "peak_flops_per_device", "tokens_per_step",
                    "run_tokens", "run_flops")
"""The :class:`Estimate` fields :func:`columns` reads, as floats (a budget left None: NaN,
read only where every estimate has it)."""
_ESTIMATE_VALUES = attrgetter(*ESTIMATE_NUMBERS)
_LAYOUT_VALUES = attrgetter(*LAYOUT_FIELDS)


def columns(priced: list[list[Any]], capacity_bytes: float,
            machine_devices: int) -> dict[str, Any]:
    """The rows of ``priced`` ([layout, estimate, peak memory bytes] each) as columns
    (:data:`ROW_COLUMNS`): the layout's fields as lists, the estimates' and what follows
    from them (memory share, MFU, tokens/s, days) as numpy arrays over the batch, each
    by the same floating-point operations as :func:`row` and :class:`Estimate`'s
    properties in the same order (so the same numbers, bit for bit; tested)."""
    import numpy as np

    if not priced:
        return {name: [] for name in ROW_COLUMNS}
    layouts = [entry[0] for entry in priced]
    estimates = [entry[1] for entry in priced]
    out: dict[str, Any] = {"key": [layout.key for layout in layouts]}
    # Each field of every layout read at once (one C call a layout), then transposed
    for name, values in zip(LAYOUT_FIELDS, zip(*map(_LAYOUT_VALUES, layouts), strict=True),
                            strict=True):
        out[name] = list(values)
    out["dp_mode"] = ["parameter_server" if servers else "all_reduce"
                      for servers in out["parameter_servers"]]
    devices = np.array([layout.devices for layout in layouts])
    out["devices"] = devices
    out["idle_devices"] = machine_devices - devices
    out["micro_batches"] = np.array([layout.global_batch // (layout.micro_batch * layout.dp)
                                     for layout in layouts])
    memory = np.array([entry[2] for entry in priced], dtype=float)
    out["memory_gb"] = memory / 1e9
    out["memory_fraction"] = memory / capacity_bytes
    numbers = np.array(list(map(_ESTIMATE_VALUES, estimates)), dtype=float).T.copy()

    def of(name: str) -> np.ndarray:
        return numbers[ESTIMATE_NUMBERS.index(name)]

    step = of("step_time_s")
    flops = of("model_flops_per_step")
    out["est_step_time_s"] = step
    out["est_pipeline_s"] = of("pipeline_s")
    out["est_dp_tail_s"] = of("dp_tail_s")
    out["est_optimizer_s"] = of("optimizer_s")
    out["est_mfu"] = flops / step / of("devices") / of("peak_flops_per_device")
    tokens_per_s = of("tokens_per_step") / step
    out["est_tokens_per_s"] = tokens_per_s
    out["est_tokens_per_device_s"] = tokens_per_s / devices
    budgets = {(e.run_tokens is None, e.run_flops is None) for e in estimates}
    if budgets == {(False, False)} or budgets == {(False, True)}:  # tokens: as days_to_train
        out["est_days"] = of("run_tokens") / tokens_per_s / SECONDS_PER_DAY
    elif budgets == {(True, False)}:
        out["est_days"] = of("run_flops") / (flops / step) / SECONDS_PER_DAY
    else:
        out["est_days"] = [e.days_to_train for e in estimates]
    return {name: out[name] for name in ROW_COLUMNS}


def packed(columns: dict[str, list[Any]]) -> dict[str, Any]:
    """Each column as one numpy array (8 bytes a number, not a Python object of 32: the
    main process holds every priced layout's row); a list holding a None as an object
    array, and :func:`columns`' numpy arrays as they are (they hold no None)."""
    import numpy as np

    return {name: values if isinstance(values, np.ndarray)
            else np.asarray(values, dtype=object if None in values else None)
            for name, values in columns.items()}


def applied(base: Scenario, layout: Layout, par: Any, training: Any) -> Scenario:
    """:func:`~llmsim.search.space.apply` of ``layout`` whose ``parallelism_of`` is
    already validated (``par``, ``training``): only the scenario's own rules are checked."""
    return with_layout(base, layout.nodes, par, training)


def with_switches(core: Scenario, layout: Layout) -> Scenario:
    """``core`` (a validated scenario) with the overlap switches of ``layout``, one of its
    :func:`switch_variants`, checked by the parallelism's and the scenario's own rules
    (raises ValueError); equal to :func:`~llmsim.search.space.switched` (tested)."""
    par = core.parallelism
    updates = {name: getattr(layout, name) for name in (*SWITCHES, "moe_a2a_overlap")
               if getattr(par, name) != getattr(layout, name)}
    if not updates:
        return core
    if updates.get("moe_a2a_overlap") is False:  # as parallelism_of drops them
        updates["moe_comm_units"] = 0
    elif updates.get("moe_a2a_overlap"):
        updates["moe_shared_expert_overlap"] = False
    new_par = copied(par, updates)  # every field set, as the core's (.fast_rules)
    new_par._check()  # the parallelism's rules (field types are unchanged: booleans)
    scenario = copied(core, {"parallelism": new_par})
    scenario.check_switch_rules()  # the scenario's rules that read the switches
    return scenario


def row(columns: dict[str, list[Any]], layout: Layout, e: Any, memory_bytes: float,
        capacity_bytes: float, machine_devices: int) -> None:
    """Append a table row to ``columns``: the layout, the estimate and the memory, units
    in the names (:data:`ROW_COLUMNS`)."""
    tokens_per_s = e.tokens_per_s
    values = (layout.key, *(getattr(layout, name) for name in LAYOUT_FIELDS),
              "parameter_server" if layout.parameter_servers else "all_reduce",
              layout.devices, machine_devices - layout.devices,
              layout.global_batch // (layout.micro_batch * layout.dp),
              memory_bytes / 1e9, memory_bytes / capacity_bytes, e.step_time_s,
              e.pipeline_s, e.dp_tail_s, e.optimizer_s, e.mfu, tokens_per_s,
              tokens_per_s / layout.devices, e.days_to_train)
    for column, value in zip(columns.values(), values, strict=True):
        column.append(value)
