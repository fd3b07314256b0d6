"""PipeDream in the layout search (llmsim.search.space.ASYNCHRONOUS): its estimate against
its steady state replayed by the engine (llmsim.steady_state.pipedream_step_s), its
stashed weights' memory, and the option that lets its stale updates compete."""

from __future__ import annotations

import random

import pytest
from test_cli import run_cli
from test_search import TINY, TINY_FIX, _tiny

from llmsim.errors import UserError
from llmsim.memory import memory_per_stage
from llmsim.search import search
from llmsim.search.estimate import Estimator
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
