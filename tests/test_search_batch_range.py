"""``llmsim search --batch-range``: the space of a range of global batches, counted before it
is made (:mod:`llmsim.search.draw`), sampled by index with ``--max-layouts``, refused in
one line past the bound, resumed like any search."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_cli import run_cli
from test_search import TINY, TINY_FIX

import llmsim
from llmsim.search import draw as draw_module
from llmsim.search import search
from llmsim.search.draw import draw_layouts, pick
from llmsim.search.space import SpaceOptions, branches, cores

ROOT = Path(__file__).resolve().parents[1]
FIX = {"zero": 1, "recompute": "none", "sequence_parallel": False}
"""Narrows the tiny space (a few hundred core layouts a batch) for the brute force."""


def _tiny(global_batch: int = 64) -> llmsim.specs.Scenario:
    """The tiny scenario at ``global_batch`` (set without validation: its own layout need
    not make that batch, a searched one does)."""
    scenario = llmsim.load_scenario(TINY)
    training = scenario.training.model_copy(update={"global_batch": global_batch})
    return scenario.model_copy(update={"training": training})


@pytest.mark.parametrize("batch_range", [(40, 72), (32, 128, 32)])
def test_a_range_is_the_union_of_the_spaces_of_its_batches(
        batch_range: tuple[int, ...]) -> None:
    ranged = list(cores(_tiny(), SpaceOptions(fixed=FIX, batch_range=batch_range)))
    low, high, *step = batch_range
    one_by_one = [core for gb in range(low, high + 1, *step)
                  for core in cores(_tiny(gb), SpaceOptions(fixed=FIX))]
    assert ranged == one_by_one  # the same layouts, batch after batch
    assert {c.global_batch for c in ranged} == set(range(low, high + 1, *step))
    assert sum(b.size for b in branches(_tiny(), SpaceOptions(fixed=FIX,
                                                              batch_range=batch_range))) \
        == len(ranged)


SPACE_OPTIONS = SpaceOptions(fixed={"recompute": "none"}, batch_range=(48, 80))
SPACE = list(cores(_tiny(), SPACE_OPTIONS))


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, len(SPACE) - 1), max_size=40, unique=True))
def test_picking_by_index_makes_the_layouts_at_those_indices(indices: list[int]) -> None:
    indices.sort()
    assert list(pick(_tiny(), SPACE_OPTIONS, None, indices)) == [SPACE[i] for i in indices]


@pytest.mark.parametrize("max_layouts, seed", [(1, 0), (17, 1), (500, 7), (10**6, 3)])
def test_the_sample_is_the_one_drawn_from_the_whole_list(max_layouts: int,
                                                         seed: int) -> None:
    drawn, count, sampled = draw_layouts(_tiny(), SPACE_OPTIONS, None, max_layouts, seed)
    assert count == len(SPACE) and sampled == (max_layouts < len(SPACE))
    # what llmsim.search drew before the space was counted (c7b064b): the list, sampled
    before = sorted(random.Random(seed).sample(SPACE, max_layouts)) if sampled else SPACE
    assert drawn == before


def test_a_space_past_the_bound_is_refused_in_one_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, stdout, stderr = run_cli(["search", "selene-gpt3", "--batch-range", "1024..2048"],
                                   capsys)
    assert code == 2, stdout + stderr
    line = " ".join(stderr.split())
    assert "--batch-range: 1024..2048" in line and "50,220,684 core layouts" in line
    assert "--max-layouts" in line and "Traceback" not in stderr
    assert len(stderr.strip().splitlines()) == 1


def test_the_bounds_refuse_before_pricing(monkeypatch: pytest.MonkeyPatch) -> None:
    count = len(list(cores(_tiny(), SpaceOptions(fixed={}, batch_range=(32, 96)))))
    monkeypatch.setattr(draw_module, "MAX_CORE_LAYOUTS", count - 1)
    with pytest.raises(llmsim.UserError, match=rf"--batch-range: 32\.\.96 .* {count:,} core"):
        search(_tiny(), batch_range=(32, 96), top=0, workers=1)
    assert len(search(_tiny(), fix=TINY_FIX, top=0, workers=1))  # a smaller space runs
    with pytest.raises(llmsim.UserError, match="--max-layouts: "):  # a sample past it
        search(_tiny(), batch_range=(32, 200), max_layouts=count, top=0, workers=1)
    monkeypatch.setattr(draw_module, "MAX_BRANCHES", 3)
    with pytest.raises(llmsim.UserError, match="more than 3 branches"):
        search(_tiny(), batch_range=(32, 96), max_layouts=10, top=0, workers=1)


def test_a_killed_search_over_a_range_resumes(tmp_path: Path) -> None:
    scenario, fix = _tiny(), [*TINY_FIX, "parallelism.tp=2"]
    whole = search(scenario, fix=fix, batch_range=(48, 80, 8), top=2, workers=1,
                   out=tmp_path / "a")
    lines = (tmp_path / "a" / "priced.jsonl").read_text().splitlines()
    ends = [i for i, line in enumerate(lines) if '"batch"' in line]
    assert len(ends) >= 2
    killed = tmp_path / "b"
    killed.mkdir()
    (killed / "search.json").write_text((tmp_path / "a" / "search.json").read_text())
    (killed / "priced.jsonl").write_text("\n".join(lines[: ends[0] + 1]))
    resumed = search(scenario, fix=fix, batch_range=(48, 80, 8), top=2, workers=1,
                     out=killed, resume=True)
    assert sorted(resumed["key"]) == sorted(whole["key"])
    assert resumed.iloc[0]["key"] == whole.iloc[0]["key"]
    with pytest.raises(llmsim.UserError, match="different search"):
        search(scenario, fix=fix, batch_range=(48, 88, 8), top=2, workers=1, out=killed,
               resume=True)


PEAK_RSS_BYTES = 1.5e9
"""The docs' example's peak memory bound: measured 0.6 GB (selene-gpt3, 2026-11-27); before
the space was counted, it held 6.85 GB after 118 s of CPU and had not finished."""


MEASURED = """import re, sys
from pathlib import Path
from llmsim.cli import main
sys.argv = ["llmsim", *sys.argv[1:]]
try:
    main()
finally:
    print(re.search(r"VmHWM:\\s*(\\d+) kB", Path("/proc/self/status").read_text())[1])
"""
"""``llmsim`` run in a fresh interpreter that prints its peak RSS in kB: the kernel's
high-water mark of its own memory map (``VmHWM``), which an ``exec`` starts afresh;
``getrusage``'s ``ru_maxrss`` would also count the forked copy of the pytest process that
the interpreter replaced (Linux keeps the larger across ``exec``)."""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads Linux's VmHWM")
def test_the_docs_example_runs_in_bounded_memory(tmp_path: Path) -> None:
    docs = (ROOT / "docs" / "search.md").read_text()
    example = "llmsim search selene-gpt3 --batch-range 1024..2048 --max-layouts 2000"
    assert example in docs
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-c", MEASURED, *example.split()[1:], "--top", "1", "--workers", "1",
         "--out", str(out)], capture_output=True, text=True, check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT / "simulator")})
    assert done.returncode == 0, done.stderr[-2000:]
    peak_bytes = int(done.stdout.strip().splitlines()[-1]) * 1024
    assert peak_bytes < PEAK_RSS_BYTES
    assert "a random sample of 2,000 of the space's 50,220,684 core layouts" in \
        " ".join(done.stdout.split())
    manifest = json.loads((out / "search.json").read_text())
    assert manifest["batch_range"] == [1024, 2048] and manifest["max_layouts"] == 2000


@pytest.mark.parametrize("value, says", [
    ("1024..2048:0", "must be positive"), ("0..64", "must be positive"),
    ("1024..2048:x", "LOW..HIGH:STEP"), ("1024-2048", "LOW..HIGH:STEP"),
    ("1024..2048:64", "1024..2048:64 on selene-gpt3 has 5,225,505 core layouts"),
])
def test_bad_ranges_are_one_line_errors(value: str, says: str,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    code, stdout, stderr = run_cli(["search", "selene-gpt3", "--batch-range", value], capsys)
    assert code == 2, stdout + stderr
    assert says in " ".join(stderr.split()) and "--batch-range" in stderr
    assert len(stderr.strip().splitlines()) == 1
