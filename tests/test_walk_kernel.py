"""The walks replayed compiled (:mod:`llmsim.schedules.walk_kernel`) give the loop's numbers
bit for bit, and a batch priced with them gives each layout's own estimate."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import llmsim
from llmsim.schedules.walk import replay, rows_table
from llmsim.schedules.walk_kernel import replay_ends
from llmsim.search import two_pipelines, zb_v_walk
from llmsim.search.batching import batches, walk_key
from llmsim.search.estimate import Estimator
from llmsim.search.price import price_batch, state_fits
from llmsim.search.space import SpaceOptions, apply, cores, switch_variants
from llmsim.simulation import check_posted_units

ORDERS = [("zb-v", 4, 8), ("zb-v", 3, 5), ("chimera", 4, 8), ("dualpipe", 4, 8),
          ("zb-h1", 4, 6), ("zb-h2", 3, 9)]


def _rows(schedule: str, p: int, m: int) -> tuple:
    if schedule in ("chimera", "dualpipe"):
        return two_pipelines.compiled(schedule, p, m).passes
    chunks = 2 if schedule == "zb-v" else 1
    return tuple(map(tuple, zb_v_walk.compiled(p, m, schedule, chunks).rows.tolist()))


@settings(max_examples=40, deadline=None)
@given(order=st.sampled_from(ORDERS), seed=st.integers(0, 10**6), blocking=st.booleans())
def test_the_compiled_replay_equals_the_loop_bit_for_bit(order: tuple, seed: int,
                                                        blocking: bool) -> None:
    schedule, p, m = order
    rows = _rows(schedule, p, m)
    columns = 1 + max(column for _, column, _, _ in rows)
    rng = random.Random(seed)
    # some passes free (0.0): the ends' signs are compared too (repr)
    durations = [rng.choice([0.0, rng.uniform(0.1, 3.0)]) for _ in range(columns)]
    hops = [0.0] + [0.0 if blocking else rng.uniform(0.0, 0.5) for _ in range(2 * p)]
    picks = [rng.randint(0, len(rows)) for _ in range(rng.randint(0, 5))]
    ends, free = replay_ends(p, rows_table(rows), durations, hops, np.array(picks, dtype=np.int64))
    want_ends, want_free = replay(p, rows, durations, hops)
    assert [repr(x) for x in ends] == [repr(float(want_ends[k])) for k in picks]
    assert [repr(x) for x in free] == [repr(float(x)) for x in want_free]


def test_the_table_holds_the_rows_in_order() -> None:
    rows = ((0, 2, 0, 0), (1, 5, 1, 2), (0, 1, 2, 3))
    assert rows_table(rows).tolist() == [list(r) for r in rows]
    assert rows_table(()).shape == (0, 4)


@pytest.mark.parametrize("schedule", ["zb-v", "chimera", "dualpipe", "zb-h2"])
def test_a_walked_batch_equals_each_layout_priced_alone(schedule: str) -> None:
    """A whole batch of one walk key, priced by one warm estimator, prices each layout as
    a fresh estimator does alone."""
    base = llmsim.load_scenario("selene-gpt3").model_copy(update={"fidelity": "reduced"})
    fixed = {"schedule": schedule, "recompute": "selective"}
    space = list(cores(base, SpaceOptions(fixed=fixed, max_micro_batch=2),
                       state_fits(base, 0.1)))
    walked = [b for b in batches(space)  # ZB-H2 walks below 4(2p − 1) micro-batches
              if schedule != "zb-h2" or walk_key(b[0])[3] < 4 * (2 * b[0].pp - 1)]
    batch = max(walked, key=len)[:60]
    result = price_batch(base.model_copy(), batch, {}, 0.1)
    assert len(result) >= 8
    rows = {r["key"]: r for r in result.rows}
    checked = 0
    for core in batch:
        for layout in switch_variants(core, {}):
            if layout.key not in rows:
                continue
            sc = apply(base, layout)
            check_posted_units(sc)
            e = Estimator().estimate(sc)
            row = rows[layout.key]
            assert (row["est_step_time_s"], row["est_pipeline_s"], row["est_dp_tail_s"]) \
                == pytest.approx((e.step_time_s, e.pipeline_s, e.dp_tail_s), rel=1e-9)
            checked += 1
    assert checked == len(result)


def test_a_zb_h2_walk_is_not_a_zb_h1_walk_of_the_same_passes() -> None:
    """ZB-H1's and ZB-H2's orders of one p and m have as many passes and stages, so the
    same pass times and hops; the walk memo holds one order's walks only, so a ZB-H2
    walk after a ZB-H1 one with the same inputs is ZB-H2's own (it was ZB-H1's: a worker
    that priced ZB-H1's batch first priced some ZB-H2 layouts 4–7 % slow)."""
    p, m = 4, 8
    durations = [x for _ in range(p) for x in (1.0, 1.0, 0.5)]
    hops = [0.0] * (1 + 2 * p)
    h1, h2 = zb_v_walk.compiled(p, m, "zb-h1", 1), zb_v_walk.compiled(p, m, "zb-h2", 1)
    assert h1.passes == h2.passes
    free = replay_ends(p, h2.rows, durations, hops)[1]
    assert zb_v_walk.walk_s(h1, durations, hops)[0] != max(free)
    assert zb_v_walk.walk_s(h2, durations, hops) == (max(free), free)
