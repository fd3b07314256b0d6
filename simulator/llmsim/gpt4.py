"""The days-to-GPT-4 table: the source documents' estimate next to llmsim's best layout.

The source documents (``brief.md``, "Scaling and the days-to-GPT-4 table": a Tokyo Tech
colloquium talk, 2024) put GPT-4 at about 3·10²⁵ training FLOPs and estimate the days
it would take on six machines from peak FLOP/s × accelerators, times an efficiency
factor ("×2" for OpenAI's A100 cluster, "×4" for Fugaku). :func:`days_table` answers the
same question with llmsim: for each machine it searches the layouts of the catalog
scenario's model (``gpt4-proxy-dense``, 3·10²⁵ FLOPs) at the accelerator count the
source gives, or the whole machine where that count exceeds it, confirms the best with
the SimPy engine, and sets the result beside the source's number and the source's
method recomputed with the catalog's peaks (:func:`source_method_days`).

Device units: an llmsim "device" of MI250X is one GCD (two per package) and one of
Ponte Vecchio a stack (two per GPU); the source counts packages, converted here once.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmsim.errors import UserError
from llmsim.gpt4_sources import (
    SourceRow,
    part_peak_flops,
    select,
    source_method_days,
)

if TYPE_CHECKING:
    import pandas as pd

    from llmsim.search.space import Layout
    from llmsim.specs import Scenario

MAX_SIM_PASSES = 100_000
"""Most layer passes a searched layout's step may take to simulate (``max_sim_passes``;
20–70 µs each on one core, docs/scenarios.md): the table confirms a few layouts per
machine with the engine, and a step of a million passes (e.g. pp 120 with 2,048
micro-batches) would take minutes alone. Layouts above it count as invalid."""

DEFAULT_MAX_LAYOUTS: int | None = None
"""Core layouts sampled per machine by default: None, the whole space (35,000–660,000
core layouts a machine), of which the search's bound (:mod:`llmsim.search.bound`) skips
those that cannot be among the ``top`` best."""


def whole_machine(row: SourceRow) -> tuple[Scenario, Scenario, int]:
    """The catalog scenario, the search's base (nodes for the source's count, or the whole
    machine where the count exceeds it) and the devices the source's count gives."""
    from llmsim import loader

    catalog = loader.load_scenario(row.scenario)
    part = row.parts[0]
    per_node = catalog.system.node.devices_per_node
    target = min(part.packages * part.devices_per_package, catalog.system.nodes * per_node)
    # model_copy does not re-validate: the catalog layout may not fill these nodes, and
    # the search only reads the base's nodes as the most it may use.
    base = catalog.model_copy(update={"nodes": target // per_node,
                                      "max_sim_passes": MAX_SIM_PASSES})
    return catalog, base, part.packages * part.devices_per_package


def largest_nodes(base: Scenario, max_tp: int | None) -> int:
    """The most nodes any layout of ``base`` can fill: tp·pp·dp whole nodes, at most the
    base's, with the search's degree rules (tp from the heads, pp dividing the layers,
    dp dividing the global batch)."""
    from llmsim.search.space import divisors, tp_candidates

    per_node, most = base.system.node.devices_per_node, 0
    for tp in tp_candidates(base, max_tp):
        for pp in divisors(base.model.layers):
            for dp in divisors(base.training.global_batch):
                devices = tp * pp * dp
                if devices % per_node == 0 and most < devices // per_node <= base.nodes_used:
                    most = devices // per_node
    return most


def compact(layout: Layout) -> str:
    """``tp8 pp15 dp8 · 1f1b mb1 · ZeRO-1 · full rc · sp`` — a layout on one line."""
    chunks = f" v{layout.virtual_stages}" if layout.virtual_stages > 1 else ""
    overlaps = [n for n, on in (("tp", layout.overlap_tp_comm), ("pp", layout.overlap_pp_comm),
                                ("gather", layout.overlap_param_gather)) if on]
    return (f"tp{layout.tp} pp{layout.pp} dp{layout.dp} · {layout.schedule}{chunks} "
            f"mb{layout.micro_batch} · ZeRO-{layout.zero} · {layout.recompute} rc"
            + (" · sp" if layout.sequence_parallel else "")
            + (f" · overlap {'+'.join(overlaps)}" if overlaps else ""))


def compact_of(scenario: Scenario) -> str:
    """:func:`compact` of a scenario's layout."""
    from llmsim.search.space import layout_of

    text = compact(layout_of(scenario))
    if scenario.placement is not None:  # a heterogeneous job's (search.placement_search)
        from llmsim.search.placement_search import describe_placement

        text += f" · {describe_placement(scenario.placement)}"
    return text


@dataclass(frozen=True)
class SystemResult:
    """One row of the table: the source's numbers and llmsim's best layout."""

    source: SourceRow
    source_devices: int
    """The source's count in llmsim devices (GCDs, stacks)."""
    machine_devices: int
    """Devices the search could use (the source's count, at most the whole machine)."""
    peak_flops: float
    """Peak FLOP/s of the source's accelerators at the method's precision (all parts)."""
    method_days: float
    """The source's method recomputed (:func:`source_method_days`)."""
    best: Scenario | None
    """llmsim's best layout as a scenario (None when no layout fits)."""
    engine: Mapping[str, Any]
    """The best row of the search table (layout, memory_gb, the engine's numbers)."""
    catalog_layout_won: bool
    """Whether the catalog scenario's hand-picked layout beat every searched one."""
    bottleneck: str
    """The largest part of the step besides compute, with its share."""
    layouts_priced: int
    """Layouts the estimator priced (the search's and the catalog layout's)."""
    timed_out: int
    """Candidates the engine did not finish within :data:`CONFIRM_TIMEOUT_S`."""
    wall_s: float
    """Seconds this machine's search took."""
    calendar: Mapping[str, float | None] = field(default_factory=dict)
    """The best layout's whole run: calendar days with their spread, goodput and MWh
    (:func:`llmsim.calendar.summary.table_columns`; empty when no layout fits)."""
    skipped: int = 0
    """Core layouts the search's bound skipped (none of them can be among the best)."""

    @property
    def days(self) -> float:
        """llmsim's days to train (the engine's, best layout)."""
        return float(self.engine.get("days", math.nan))

    @property
    def ratio(self) -> float:
        """llmsim's days over the source's."""
        return self.days / self.source.source_days

    def why(self) -> str:
        """One line on why llmsim's days differ from the source's."""
        s = self.source
        implied = self.method_days / s.factor / s.source_days  # days at peak / its days
        text = (f"the source's {s.source_days:,.0f} days mean {100 * implied:.0f} % of "
                f"{'+'.join(p.precision.upper() for p in s.parts)} peak on all its "
                "accelerators")
        if self.best is not None:
            text += (f"; llmsim reaches MFU {100 * float(self.engine['mfu']):.0f} % on "
                     f"{int(self.engine['devices']):,} devices ({self.bottleneck})")
        if self.source_devices > self.machine_devices:
            text += (f"; the source's {self.source_devices:,} devices exceed the machine's "
                     f"{self.machine_devices:,}")
        return text + (f"; {s.note}" if s.note else "")


Progress = Callable[[str], None]

CONFIRM_TIMEOUT_S = 30.0
"""Longest one engine run of a candidate layout may take before it is left unconfirmed
(the search's ``confirm_timeout_s``). Some layouts (ZeRO-3 with many micro-batches: a
gather per layer and micro-batch) take the engine minutes for one step, under its
``max_sim_passes`` bound; the table moves on to the estimator's next candidate instead."""


def run_system(row: SourceRow, *, max_layouts: int | None, top: int, workers: int | None,
               out: Path | None = None, confirm_timeout_s: float = CONFIRM_TIMEOUT_S
               ) -> SystemResult:
    """Search ``row``'s machine and return its row of the table.

    The search prices the whole space (or a seeded sample of ``max_layouts`` core layouts,
    and as many again on the most nodes a layout can fill (:func:`largest_nodes`); None:
    the row's own :attr:`SourceRow.max_layouts`),
    most devices first, skipping the layouts its bound shows cannot be among the
    estimator's ``top`` best (:mod:`llmsim.search.bound`), and the engine confirms
    those ``top`` (:func:`llmsim.search.confirm.confirm`, ``confirm_timeout_s`` a run).
    The catalog scenario's hand-picked layout is priced and confirmed too, so that the
    table's best is never worse than the scenario the catalog ships; the fewest days
    among the confirmed layouts that fit wins.
    """
    import os
    import time

    import pandas as pd

    if row.hand_layout:
        return run_hand_layout(row, max_layouts)
    from llmsim.calendar.summary import table_columns
    from llmsim.search import search
    from llmsim.search.confirm import layout_of_row
    from llmsim.search.space import apply, layout_of
    from llmsim.simulation import simulate

    started = time.perf_counter()
    workers = workers or os.cpu_count() or 1
    catalog, base, source_devices = whole_machine(row)
    max_layouts = max_layouts if max_layouts is not None else row.max_layouts
    table = search(base, objective="days", top=top, max_layouts=max_layouts, workers=workers,
                   out=None if out is None else out / "search", max_tp=row.max_tp,
                   confirm_timeout_s=confirm_timeout_s, bound=True)
    searches = [table]
    if max_layouts is not None:
        # Days fall with devices, and most of a random sample uses a small part of the
        # machine: as many layouts again on the most nodes a layout can fill.
        searches.append(search(
            base, objective="days", top=top, max_layouts=max_layouts, workers=workers,
            fix={"nodes": largest_nodes(base, row.max_tp)},
            out=None if out is None else out / "search-largest", max_tp=row.max_tp,
            confirm_timeout_s=confirm_timeout_s, bound=True))
    seed = search(base, objective="days", top=1, fix=layout_of(catalog).as_dict(), workers=1,
                  max_tp=max(row.max_tp or 0, catalog.parallelism.tp),
                  confirm_timeout_s=confirm_timeout_s)
    summaries = [t.attrs["summary"] for t in (*searches, seed)]
    timed_out = sum(s.timed_out for s in summaries)
    skipped = sum(s.skipped for s in summaries)
    confirmed = pd.concat([t[t["step_time_s"].notna() & t["fits"].astype(bool)]
                           for t in (*searches, seed) if "step_time_s" in t],
                          ignore_index=True)
    priced = sum(s.priced for s in summaries)
    peak = sum(part_peak_flops(p) for p in row.parts)
    method = source_method_days(catalog.training.flops or 0.0, peak, row.factor)
    machine = base.devices
    if confirmed.empty:
        return SystemResult(row, source_devices, machine, peak, method, None, {}, False,
                            "no layout fits", priced, timed_out,
                            time.perf_counter() - started, skipped=skipped)
    confirmed = confirmed.sort_values(["days", "key"], kind="mergesort")
    best_row = confirmed.iloc[0]
    best = apply(base, layout_of_row(best_row))
    searched = {k for t in searches if "key" in t for k in t["key"]}
    won = best_row["key"] == layout_of(catalog).key and best_row["key"] not in searched
    result = simulate(best.model_copy(update={"fidelity": "reduced"}))
    calendar = table_columns(result)  # failures, checkpoints, energy (llmsim.calendar)
    parts = {k: v for k, v in result.breakdown_s.items() if k != "compute"}
    name, seconds = max(parts.items(), key=lambda kv: kv[1])
    bottleneck = (f"most lost to {name.replace('_', ' ')}, "
                  f"{100 * seconds / result.step_time_s:.0f} % of the step")
    engine = {**best_row.to_dict(), "devices": int(best_row["devices"]),
              "idle_devices": machine - int(best_row["devices"])}
    return SystemResult(row, source_devices, machine, peak, method, best, engine, won,
                        bottleneck, priced, timed_out, time.perf_counter() - started,
                        calendar, skipped)


def to_frame(results: list[SystemResult]) -> pd.DataFrame:
    """The table as a DataFrame, one row per machine, units in the column names."""
    import pandas as pd

    from llmsim.calendar.summary import TABLE_COLUMNS
    from llmsim.search.confirm import layout_of_row

    rows = []
    for r in results:
        e = r.engine
        rows.append({
            "system": r.source.system, "source": r.source.label,
            "source_devices": r.source_devices, "machine_devices": r.machine_devices,
            "devices": e.get("devices"), "idle_devices": e.get("idle_devices"),
            "source_days": r.source.source_days, "source_doubtful": r.source.source_doubtful,
            "peak_eflops": r.peak_flops / 1e18, "factor": r.source.factor,
            "factor_stated": r.source.factor_stated, "method_days": r.method_days,
            "layout": (compact(layout_of_row(e)) + (f" · {e['placement']}" if e.get("placement")
                                                    else "")) if e else None,
            "catalog_layout_won": r.catalog_layout_won,
            "step_time_s": e.get("step_time_s"), "mfu": e.get("mfu"),
            "memory_gb": e.get("memory_gb"), "days": r.days if e else None,
            "days_over_source": r.ratio if e else None,
            "layouts_priced": r.layouts_priced, "skipped_core_layouts": r.skipped,
            "timed_out": r.timed_out,
            "wall_s": r.wall_s, "why": r.why(),
            **{k: r.calendar.get(k) for k in TABLE_COLUMNS},
        })
    return pd.DataFrame(rows)


def days_table(systems: str | None = None, *, max_layouts: int | None = DEFAULT_MAX_LAYOUTS,
               top: int = 3, workers: int | None = None, out: Path | None = None,
               confirm_timeout_s: float = CONFIRM_TIMEOUT_S, progress: Progress | None = None
               ) -> tuple[pd.DataFrame, list[SystemResult]]:
    """Run :func:`run_system` for each machine ``systems`` names (all by default);
    ``out`` keeps each machine's priced layouts under ``out/<system>/search``."""
    if max_layouts is not None and max_layouts < 1:
        raise UserError(f"--max-layouts: {max_layouts} must be 1 or more (core layouts "
                        "sampled per machine)")
    if top < 1:
        raise UserError(f"--top: {top} must be 1 or more (layouts the engine confirms per "
                        "machine)")
    if not confirm_timeout_s > 0:
        raise UserError(f"--confirm-timeout: {confirm_timeout_s} must be above 0 (seconds one "
                        "engine run may take)")
    results = []
    for row in select(systems):
        if progress is not None:
            progress(row.system)
        results.append(run_system(row, max_layouts=max_layouts, top=top, workers=workers,
                                  out=None if out is None else out / row.system,
                                  confirm_timeout_s=confirm_timeout_s))
    return to_frame(results), results


def run_hand_layout(row: SourceRow, max_layouts: int | None = None) -> SystemResult:
    """``row``'s heterogeneous machine (:attr:`SourceRow.hand_layout`): the catalog
    scenario's own placement and the best of the placements searched on its node groups
    (:mod:`llmsim.search.placement_search`: every candidate, or a seeded sample of
    ``max_layouts``), each run by the engine; the fewer days win."""
    import time

    from llmsim import loader
    from llmsim.calendar.summary import table_columns
    from llmsim.search.placement_search import describe_placement, search_placements
    from llmsim.search.space import layout_of
    from llmsim.simulation import simulate

    started = time.perf_counter()
    catalog = loader.load_scenario(row.scenario).model_copy(update={"fidelity": "reduced"})
    result = simulate(catalog)
    rows, searched, info = search_placements(catalog, max_candidates=max_layouts)
    won = searched is None or not result.fits or rows[0]["days"] >= result.days_to_train
    if not won:
        catalog, result = searched, simulate(searched)
    calendar = table_columns(result)  # failures, checkpoints, energy (llmsim.calendar)
    peak = sum(part_peak_flops(p) for p in row.parts)
    method = source_method_days(catalog.training.flops or 0.0, peak, row.factor)
    source_devices = sum(p.packages * p.devices_per_package for p in row.parts)
    parts = {k: v for k, v in result.breakdown_s.items() if k != "compute"}
    name, seconds = max(parts.items(), key=lambda kv: kv[1])
    bottleneck = (f"most lost to {name.replace('_', ' ')}, "
                  f"{100 * seconds / result.step_time_s:.0f} % of the step")
    layout = layout_of(catalog)
    engine = {**layout.as_dict(), "key": layout.key, "step_time_s": result.step_time_s,
              "mfu": result.mfu, "days": result.days_to_train,
              "memory_gb": max(m.total_bytes for m in result.memory) / 1e9,
              "fits": result.fits, "devices": catalog.devices,
              "idle_devices": source_devices - catalog.devices,
              "placement": describe_placement(catalog.placement)}
    return SystemResult(row, source_devices, source_devices, peak, method,
                        catalog if result.fits else None, engine, won, bottleneck,
                        info.priced + info.out_of_memory + info.invalid + 1, 0,
                        time.perf_counter() - started, calendar)
