"""PipeDream in the layout search (llmsim.search.space.ASYNCHRONOUS): its estimate against
its steady state replayed by the engine (llmsim.steady_state.pipedream_step_s), its
stashed weights' memory, and the option that lets its stale updates compete."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from test_cli import run_cli
from test_search import TINY, TINY_FIX, _tiny

from llmsim.errors import UserError
from llmsim.memory import memory_per_stage
from llmsim.search import search
from llmsim.search.estimate import Estimator
from llmsim.search.pipedream_updates import update_shares_s
from llmsim.search.pipeline import StageTimes
from llmsim.search.space import ASYNCHRONOUS, SpaceOptions, apply, cores
from llmsim.steady_state import pipedream_step_s


def _pipedream_layouts(count: int, seed: int) -> list:
    layouts = [c for c in cores(_tiny(), SpaceOptions(fixed={}, asynchronous=True))
               if c.schedule == "pipedream"]
    return sorted(random.Random(seed).sample(layouts, count))


def test_pipedream_is_searched_only_with_the_asynchronous_option() -> None:
    """By default no layout runs PipeDream (its updates are stale: not the same
    training); with ``asynchronous`` it is tried at every pp ≥ 2 with at least pp
    micro-batches per step, each of the others' layouts still there."""
    base = _tiny()
    plain = list(cores(base, SpaceOptions(fixed={})))
    both = list(cores(base, SpaceOptions(fixed={}, asynchronous=True)))
    assert not any(c.schedule in ASYNCHRONOUS for c in plain)
    extra = [c for c in both if c.schedule == "pipedream"]
    assert extra and len(both) == len(plain) + len(extra)
    for c in extra:
        m = c.global_batch // (c.dp * c.micro_batch)
        assert c.pp >= 2 and m >= c.pp and c.virtual_stages == 1


@pytest.mark.parametrize("seed", [0, 1])
def test_the_estimate_of_pipedream_equals_its_replayed_steady_state(seed: int) -> None:
    """The estimator's pipeline phase (m·max_s C_s, the steady state's closed form) is
    within 5 % of the engine's replay of three steps without a flush, on sampled tiny
    layouts (pp 2–12, ZeRO 0–3, recompute, micro-batches)."""
    est = Estimator()
    for layout in _pipedream_layouts(6, seed):
        scenario = apply(_tiny(), layout)
        assert scenario.parallelism.schedule == "pipedream"
        estimate = est.estimate(scenario)
        assert estimate.pipeline_s == pytest.approx(pipedream_step_s(scenario), rel=0.05), \
            layout.key


def test_a_pipedream_layout_holds_its_stashed_weights() -> None:
    """Stage i holds p − i versions of its weights (Narayanan et al. 2019 §3.3), one
    version of everything else: the search's memory is the memory model's with them."""
    layout = next(c for c in _pipedream_layouts(40, 3) if c.pp >= 3)
    scenario = apply(_tiny(), layout)
    stashed = Estimator().memory(scenario)
    par = scenario.parallelism
    one = memory_per_stage(scenario.model, par.model_copy(update={"schedule": "1f1b"}),
                           scenario.training, scenario.dp, scenario.system.node.accelerator)
    for i, (s, plain) in enumerate(zip(stashed, one, strict=True)):
        assert s.weight_versions == par.pp - i
        assert s.weights_bytes == (par.pp - i) * plain.weights_bytes
        assert s.grads_bytes == plain.grads_bytes


def test_a_searched_pipedream_layout_is_confirmed_by_its_steady_state() -> None:
    """``search(asynchronous=True)`` confirms PipeDream's rows by the replayed steady
    state plus the estimator's reduction tail and optimizer; fixing the schedule without
    the option is refused with the reason."""
    fix = [*TINY_FIX, "parallelism.schedule=pipedream", "parallelism.pp=4",
           "parallelism.tp=1"]
    table = search(_tiny(), fix=fix, top=2, workers=1, objective="step_time",
                   asynchronous=True)
    confirmed = table[table["step_time_s"].notna()]
    assert len(confirmed) == 2 and (confirmed["schedule"] == "pipedream").all()
    assert confirmed["est_over_engine"].between(0.95, 1.05).all()
    with pytest.raises(UserError, match="add --asynchronous"):
        search(_tiny(), fix=fix, top=0, workers=1, objective="step_time")


def test_cli_search_marks_pipedream_rows_asynchronous(tmp_path, capsys) -> None:
    path = tmp_path / "tiny.yaml"
    import yaml

    path.write_text(yaml.safe_dump(TINY))
    fix = ["--fix", "parallelism.schedule=pipedream", "--fix", "parallelism.pp=2",
           "--fix", "parallelism.tp=2"] + [a for f in TINY_FIX for a in ("--fix", f)]
    code, stdout, _ = run_cli(["search", str(path), "--asynchronous", "--top", "1",
                               "--workers", "1", "--objective", "step_time", *fix], capsys)
    assert code == 0 and "pipedream (async)" in stdout
    code, _, stderr = run_cli(["search", str(path), "--top", "1", "--workers", "1",
                               "--objective", "step_time", *fix], capsys)
    assert code == 2 and "--asynchronous" in stderr


def test_a_reduction_and_an_update_follow_every_backward() -> None:
    """Each stage's cycle is its passes, its reduction's tail, its optimizer step
    (llmsim.search.pipedream_updates): stages of C = 3 and 2 s, tails 0 and 1.5 s, updates
    1 and 0.5 s, 4 micro-batches: passes 4·3, reductions 4·max(3, 3.5) − 12, updates
    4·max(4, 4) − 14; the tied embedding's all-reduce is in the first and last tails."""
    runs = [(StageTimes(f=1.0, b=1.0, w=1.0), 1), (StageTimes(f=0.5, b=1.0, w=0.5), 1)]
    kw = {"blocking": True, "zero3": False, "prefetch": True}
    assert update_shares_s(runs, [0.0, 1.5], [1.0, 0.5], 4, tied_s=0.0, **kw) == \
        pytest.approx((12.0, 2.0, 2.0))
    assert update_shares_s(runs, [0.0, 1.5], [1.0, 0.5], 4, tied_s=1.0, **kw) == \
        pytest.approx((12.0, 4 * 4.5 - 12, 4 * 5.0 - 4 * 4.5))


@pytest.mark.parametrize("seed", [0, 1])
def test_pipedream_prices_a_reduction_and_an_update_per_backward(seed: int) -> None:
    """PipeDream updates after every backward (Narayanan et al. 2019 §3.3): doubling the
    micro-batches of a step doubles its reductions' and updates' share, where 1F1B's one
    optimizer step per step stays; and the updates cost at most m of 1F1B's step (whose
    optimizer is the slowest stage's) and more than one."""
    est = Estimator()
    for layout in _pipedream_layouts(4, seed):
        one, two = (apply(_tiny(), replace(layout, global_batch=layout.global_batch * k))
                    for k in (1, 2))
        e1, e2 = est.estimate(one), est.estimate(two)
        # (within 1 %: a stage's passes per micro-batch average over the step's m, e.g.
        # ZeRO-3's queue waits, less the last one's)
        assert e2.optimizer_s == pytest.approx(2 * e1.optimizer_s, rel=0.01), layout.key
        assert e2.dp_tail_s == pytest.approx(2 * e1.dp_tail_s, rel=0.01), layout.key
        flush = est.estimate(apply(_tiny(), replace(layout, schedule="1f1b")))
        m = one.micro_batches
        assert flush.optimizer_s < e1.optimizer_s <= m * flush.optimizer_s * (1 + 1e-9), \
            layout.key
        assert e1.step_time_s == pytest.approx(
            e1.pipeline_s + e1.dp_tail_s + e1.optimizer_s + one.training.step_overhead_s)
