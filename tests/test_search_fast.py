"""The search's fast paths equal the plain ones: pricing a batch (interned base, peak
memory, switch variants by copy) gives the numbers a fresh estimator gives each layout's
fully validated scenario, and :class:`PeakMemory` equals :func:`memory_per_stage`."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import llmsim
from llmsim import catalog
from llmsim.errors import UserError
from llmsim.memory import memory_per_stage
from llmsim.schedules import build
from llmsim.search.estimate import Estimator
from llmsim.search.fit import PeakMemory
from llmsim.search.price import price_batch, state_fits
from llmsim.search.space import (
    SpaceOptions,
    apply,
    cores,
    parallelism_of,
    switch_variants,
    switched,
)
from llmsim.simulation import check_posted_units

SAMPLE = 60
"""Core layouts drawn (seeded) from each catalog scenario's space."""


def _sample(name: str, n: int = SAMPLE) -> tuple[llmsim.specs.Scenario, list]:
    """A seeded sample of the scenario's core layouts (an MoE model's at its own tp and
    micro-batch 1: its whole space is too large for a quick test)."""
    scenario = llmsim.load_scenario(name).model_copy(update={"fidelity": "reduced"})
    fixed = {"tp": scenario.parallelism.tp, "micro_batch": 1} if scenario.model.moe else {}
    space = list(cores(scenario, SpaceOptions(fixed=fixed), state_fits(scenario, 0.1)))
    return scenario, sorted(random.Random(7).sample(space, min(n, len(space))))


DENSE = [name for name in catalog.names("scenarios")
         if "moe" not in name and llmsim.load_scenario(name).placement is None]
"""The catalog's dense scenarios (an MoE model's peak is memory_per_stage's own), but for
a heterogeneous job's (the search refuses a placement of stages on node groups)."""


def check_peak_memory(scenario, sample, rel: float = 1e-12) -> int:
    """:class:`PeakMemory` against :func:`memory_per_stage`'s largest stage for each core
    layout of ``sample`` (within ``rel``; 0: exactly), the same refusals included; the
    number of layouts that fit and were compared."""
    peak, checked = PeakMemory(scenario), 0
    accelerator = scenario.system.node.accelerator
    for core in sample:
        par, training = parallelism_of(scenario, core)
        try:
            want = max(s.total_bytes for s in memory_per_stage(scenario.model, par, training,
                                                                core.dp, accelerator))
        except UserError:
            with pytest.raises(UserError):
                peak.peak_bytes(par, training, core.dp)
            continue
        got = peak.peak_bytes(par, training, core.dp)
        assert got == want if rel == 0 else got == pytest.approx(want, rel=rel), core.key
        checked += 1
    return checked


@pytest.mark.parametrize("name", DENSE)
def test_peak_memory_equals_the_memory_model(name: str) -> None:
    scenario, sample = _sample(name, 2 * SAMPLE)
    check_peak_memory(scenario, sample)


@pytest.mark.parametrize("name", ["selene-gpt3", "frontier", "frontier-moe"])
def test_a_priced_batch_equals_each_layout_priced_alone(name: str) -> None:
    """Before/after: every row of :func:`price_batch` equals a fresh estimator on the
    layout's fully validated scenario (to 1e-9), and it prices exactly the layouts that
    validate and fit."""
    scenario, sample = _sample(name, SAMPLE)
    result = price_batch(scenario.model_copy(), sample, {}, 0.1)
    capacity = scenario.system.node.accelerator.hbm_bytes * 0.9
    want: dict[str, tuple[float, float, float]] = {}
    for layout, sc in _valid_layouts(scenario, sample):
        memory = max(s.total_bytes for s in memory_per_stage(
            sc.model, sc.parallelism, sc.training, sc.dp, sc.system.node.accelerator))
        if memory > capacity:
            continue
        e = Estimator().estimate(sc)
        want[layout.key] = (e.step_time_s, e.mfu, memory / 1e9)
    got = {r["key"]: (r["est_step_time_s"], r["est_mfu"], r["memory_gb"])
           for r in result.rows}
    assert set(got) == set(want) and want
    for key, values in want.items():
        assert got[key] == pytest.approx(values, rel=1e-9), key


def test_switch_variants_by_copy_equal_validated_ones() -> None:
    from llmsim.search.price import applied, with_switches

    scenario, sample = _sample("selene-gpt3", 120)
    checked = 0
    for core in sample:
        par, training = parallelism_of(scenario, core)
        try:
            core_scenario = applied(scenario, core, par, training)
        except ValueError:
            continue
        for layout in switch_variants(core, {}):
            try:
                want = switched(core_scenario, scenario, layout)
            except ValueError:
                with pytest.raises(ValueError):
                    with_switches(core_scenario, layout)
                continue
            assert with_switches(core_scenario, layout) == want
            checked += 1
    assert checked > 100


def test_a_search_s_estimates_do_not_depend_on_the_batches() -> None:
    """One estimator across batches (memo tables kept) gives what a fresh one gives."""
    scenario, sample = _sample("selene-gpt3", 40)
    whole = price_batch(scenario, sample, {}, 0.1).rows
    split = [r for i in range(0, len(sample), 7)
             for r in price_batch(scenario.model_copy(), sample[i:i + 7], {}, 0.1).rows]
    assert whole == split
    one = Estimator()
    for r in whole[:10]:
        layout = next(v for c in sample for v in switch_variants(c, {}) if v.key == r["key"])
        assert one.estimate(apply(scenario, layout)).step_time_s == r["est_step_time_s"]


def test_the_bound_skips_layouts_but_keeps_the_estimator_s_best() -> None:
    """Skipping by the bound leaves the estimator's top best unchanged (days of a run in
    FLOPs), and skips something; no estimate beats the bound (MFU ≤ 1)."""
    from test_search import TINY

    from llmsim.search import search
    from llmsim.search.bound import DaysBound

    scenario = llmsim.load_scenario(dict(TINY, training=dict(TINY["training"], tokens=None,
                                                             flops=1e19)))
    fix = ["parallelism.recompute=selective", "parallelism.sequence_parallel=false"]
    whole = search(scenario, fix=fix, top=0, workers=1)
    bounded = search(scenario, fix=fix, top=3, workers=1, bound=True)
    assert bounded.attrs["summary"].skipped > 0
    assert len(bounded) < len(whole)
    best = whole.sort_values(["est_days", "key"]).head(3)["key"].tolist()
    assert bounded.sort_values(["est_days", "key"]).head(3)["key"].tolist() == best
    assert bounded.iloc[0]["key"] in best  # the engine's pick is one of them
    floor = DaysBound(scenario, 1, {})
    assert (whole["est_days"] >= [floor.lower_days(d) for d in whole["devices"]]).all()
    assert (whole["est_mfu"] <= 1).all()


def test_an_engine_run_over_the_timeout_is_given_up_and_the_next_tried() -> None:
    from test_search import TINY, TINY_FIX

    from llmsim.search import search

    table = search(llmsim.load_scenario(TINY), fix=TINY_FIX, top=2, workers=1,
                   confirm_timeout_s=1e-4)
    summary = table.attrs["summary"]
    assert summary.timed_out == 4 and summary.confirmed == 0  # 2·top tried, none in time
    assert table["timed_out"].sum() == 4
    assert table.attrs["best"] is None


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe", "interleaved-1f1b", "zb-h1", "zb-h2",
                                      "zb-v"])
def test_chunks_at_peak_counted_in_one_pass_equals_the_held_lists(schedule: str) -> None:
    """The memory model's peak in flight per chunk (one pass over a stage's order) is the
    first largest of the held counts after each action (the lists it replaced)."""
    from llmsim.schedules.timing import chunks_at_peak, held_per_chunk

    for p, m in [(1, 1), (2, 3), (4, 4), (4, 9), (6, 24)]:
        chunks = 2 if schedule in ("zb-v", "interleaved-1f1b") else 1
        if schedule == "interleaved-1f1b" and (m % p or p == 1):
            continue
        for row in build(schedule, p, m, chunks):
            assert chunks_at_peak(row) == max(held_per_chunk(row), key=sum)


def test_the_compiled_orders_memo_keeps_at_most_its_passes() -> None:
    """Least recently used dropped past the bound; the newest always kept; a hit makes
    nothing again."""
    from llmsim.search.pass_cache import PassBoundedCache

    made: list[str] = []

    def make(key: str, passes: int):
        return lambda: made.append(key) or (key, passes)

    cache = PassBoundedCache(10, lambda v: v[1])
    cache.get("a", make("a", 4))
    cache.get("b", make("b", 4))
    cache.get("a", make("a", 4))  # a hit: "a" most recent
    cache.get("c", make("c", 4))  # 12 > 10: "b" (least recent) dropped
    assert made == ["a", "b", "c"] and cache.passes == 8 and len(cache) == 2
    cache.get("a", make("a", 4))
    assert made == ["a", "b", "c"]
    cache.get("big", make("big", 50))  # over the bound alone, still kept
    assert len(cache) == 1 and cache.passes == 50


def _estimates(estimator: Estimator, scenarios: list) -> list[tuple[float, ...]]:
    return [(e.step_time_s, e.pipeline_s, e.dp_tail_s, e.optimizer_s)
            for e in map(estimator.estimate, scenarios)]


def _valid_layouts(scenario: llmsim.specs.Scenario, layouts: list) -> list[tuple]:
    """(layout, its validated scenario) of every switch variant of ``layouts`` that
    validates."""
    out = []
    for core in layouts:
        for layout in switch_variants(core, {}):
            try:
                sc = apply(scenario, layout)
                check_posted_units(sc)
            except (ValueError, UserError):
                continue
            out.append((layout, sc))
    return out


def _valid_scenarios(scenario: llmsim.specs.Scenario, layouts: list) -> list:
    return [sc for _, sc in _valid_layouts(scenario, layouts)]


@pytest.mark.parametrize("name", ["selene-gpt3", "frontier-moe"])
def test_one_warm_estimator_equals_a_fresh_one_per_layout(name: str) -> None:
    """The estimator's memos (the optimizer per stage, the pipeline messages, a stage's
    chunks grouped into runs of equal ones) give exactly what a fresh estimator gives each
    layout alone, on layouts chosen to share them: every schedule, interleaved ones of
    many chunks, ZeRO 0–3 and the overlap switches, in the search's order."""
    scenario, sample = _sample(name, 400)
    interleaved = [c for c in sample if c.virtual_stages > 2][:12]
    layouts = sorted(interleaved + sample[:40])
    scenarios = _valid_scenarios(scenario, layouts)
    assert len({sc.parallelism.schedule for sc in scenarios}) >= 4
    assert any(sc.parallelism.virtual_stages > 2 for sc in scenarios)
    warm = _estimates(Estimator(), scenarios)
    fresh = [_estimates(Estimator(), [sc])[0] for sc in scenarios]
    assert warm == fresh


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), size=st.integers(2, 12))
def test_a_family_priced_together_equals_its_members_priced_alone(seed: int,
                                                                  size: int) -> None:
    """Property: a random family of layouts (one tp·pp·virtual stages·micro-batch·
    recompute·sequence parallelism, its dp, ZeRO stage, schedule and switches varying)
    priced by one estimator, in a random order, equals each member priced by a fresh one
    (the memos are keyed on exactly what they read)."""
    scenario, sample = _FAMILY_SPACE
    rng = random.Random(seed)
    anchor = rng.choice(sample)
    family = [c for c in sample if (c.tp, c.pp, c.virtual_stages, c.micro_batch,
                                    c.recompute, c.sequence_parallel) ==
              (anchor.tp, anchor.pp, anchor.virtual_stages, anchor.micro_batch,
               anchor.recompute, anchor.sequence_parallel)]
    members = _valid_scenarios(scenario, rng.sample(family, min(size, len(family))))
    rng.shuffle(members)
    assert _estimates(Estimator(), members) == [_estimates(Estimator(), [sc])[0]
                                                for sc in members]


def _family_space() -> tuple[llmsim.specs.Scenario, list]:
    scenario = llmsim.load_scenario("selene-gpt3").model_copy(update={"fidelity": "reduced"})
    space = list(cores(scenario, SpaceOptions(fixed={"nodes": 16}),
                       state_fits(scenario, 0.1)))
    return scenario, space


_FAMILY_SPACE = _family_space()


def _row_of(layout, estimate, peak_bytes: float, capacity_bytes: float,
            machine_devices: int) -> dict:
    """One layout's row by the scalar path (:func:`llmsim.search.price.row`)."""
    from llmsim.search.price import ROW_COLUMNS, row

    columns: dict[str, list] = {name: [] for name in ROW_COLUMNS}
    row(columns, layout, estimate, peak_bytes, capacity_bytes, machine_devices)
    return {name: values[0] for name, values in columns.items()}


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), size=st.integers(1, 10))
def test_a_family_s_columns_equal_each_member_s_scalar_row(seed: int, size: int) -> None:
    """Property: a random family (as above) priced by one warm estimator, its rows built
    as numpy columns over the members (:func:`llmsim.search.price.columns`: memory share,
    MFU, tokens/s, days), equals each member's row by the scalar path from a fresh
    estimator, bit for bit."""
    from llmsim.search.price import columns

    scenario, sample = _FAMILY_SPACE
    rng = random.Random(seed)
    anchor = rng.choice(sample)
    family = [c for c in sample if (c.tp, c.pp, c.micro_batch, c.recompute) ==
              (anchor.tp, anchor.pp, anchor.micro_batch, anchor.recompute)]
    members = _valid_layouts(scenario, rng.sample(family, min(size, len(family))))
    rng.shuffle(members)
    warm = Estimator()
    peaks = [rng.uniform(1e9, 8e10) for _ in members]
    got = columns([[layout, warm.estimate(sc), peak]
                   for (layout, sc), peak in zip(members, peaks, strict=True)], 8e10, 1024)
    for i, ((layout, sc), peak) in enumerate(zip(members, peaks, strict=True)):
        want = _row_of(layout, Estimator().estimate(sc), peak, 8e10, 1024)
        assert {name: got[name][i] for name in want} == want, layout.key


def test_the_members_of_a_family_share_one_pipeline_phase() -> None:
    """Layouts that differ only in their ZeRO stage below 3 (the stages' passes and sends
    alike, their gradients not read by the pipeline's closed form) are given one pipeline
    phase (one entry of the family memo), and each equals a fresh estimator's."""
    scenario, sample = _FAMILY_SPACE
    core = next(c for c in sample if c.schedule == "1f1b" and c.pp > 1 and c.zero == 0
                and c.dp > 1 and c.recompute == "full")
    members = [replace(core, zero=z) for z in (0, 1, 2)]
    scenarios = _valid_scenarios(scenario, members)
    scenarios = [sc for sc in scenarios if not sc.parallelism.overlap_param_gather]
    assert len(scenarios) == 3
    est = Estimator()
    assert _estimates(est, scenarios) == [_estimates(Estimator(), [sc])[0]
                                          for sc in scenarios]
    assert len(est._pipelines) == 1


_TAILS = Estimator()
"""One estimator for every example below: its tail memo fills across them, so a key that
missed something a tail reads would hand one example another's tail."""


@settings(max_examples=200, deadline=None)
@given(chunks=st.lists(st.tuples(st.integers(0, 4), st.sampled_from([0.0, 0.25, 1.5, 3.0]),
                                 st.sampled_from([0.5, 1.0, 2.0]),
                                 st.sampled_from([0.0, 0.5, 1.0])), min_size=1, max_size=8),
       p=st.integers(1, 4), overlap=st.booleans(), split=st.booleans(), zero3=st.booleans())
def test_a_memoised_gradient_tail_equals_the_fifo(chunks: list, p: int, overlap: bool,
                                                  split: bool, zero3: bool) -> None:
    """Property: the estimator's gradient tail of a kind (memoised from
    ``TAIL_MEMO_FROM_CHUNKS`` chunks on) is :func:`reduction_tail_s`'s, whatever tails
    the memo already holds (few values drawn, so keys repeat and near-misses meet)."""
    from llmsim.search.pipeline import StageTimes, reduction_tail_s

    times = StageTimes(1.0, 1.0, 1.0, grad_buckets=[(n, s) for n, s, _, _ in chunks],
                       chunk_backward=[(b, w) for _, _, b, w in chunks])
    want = reduction_tail_s(times, p, overlap=overlap, split_backward=split, zero3=zero3)
    assert _TAILS._tail_s(times, p, overlap, split, zero3) == want


@pytest.mark.parametrize("name", ["selene-gpt3", "frontier-moe"])
def test_a_memoised_layer_gather_equals_the_workload_s_gathers(name: str) -> None:
    """A chunk's one-layer weight gather, memoised across layouts (``_layer_gather_s``),
    is the sum of its :meth:`Workload.gather_parts` priced by the layout's costs, each
    ``gather_messages`` times, on every chunk of layouts that gather (ZeRO-3, and ZeRO-1/2
    with the overlapped gather; with expert parallelism on the MoE model), in the
    search's order with one estimator."""
    from llmsim.workload import build_workload, step_traffic

    scenario, sample = _sample(name, 400)
    gathering = [c for c in sample if c.zero == 3 or c.zero in (1, 2)][:40]
    scenarios = [sc for sc in _valid_scenarios(scenario, gathering)
                 if sc.parallelism.zero == 3 or sc.parallelism.overlap_param_gather]
    assert len(scenarios) >= 5
    est, checked = Estimator(), 0
    for sc in scenarios:
        par, trn = sc.parallelism, sc.training
        _, costs = est.plan_costs(sc)
        traffic = step_traffic(sc.model, par, trn, sc.dp)
        for chunk in build_workload(sc.model, par, trn, sc.dp).chunks.values():
            gather = traffic.weight_gather(chunk)
            want = (sum(costs.comm_s(op) for op in traffic.gather_parts(chunk, gather))
                    * traffic.gather_messages if gather is not None else 0.0)
            assert est._layer_gather_s(costs, traffic, chunk) == want
            checked += want > 0
    assert checked
