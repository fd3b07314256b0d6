"""The options of ``llmsim search`` that narrow, widen or report the space: the batch
range, the layout cap, the default headroom, idle devices, the progress line, the
Parquet table and the Dask scheduler from the command line."""

from __future__ import annotations

import io
import tomllib
from pathlib import Path

import pytest
import yaml
from rich.console import Console
from test_cli import run_cli
from test_search import TINY, TINY_FIX

import llmsim
from llmsim.cli_search import _Progress
from llmsim.search import DEFAULT_HEADROOM, search

ROOT = Path(__file__).resolve().parents[1]


def _tiny(**changes: object) -> llmsim.specs.Scenario:
    return llmsim.load_scenario(TINY, changes or None)


def test_the_global_batch_stays_the_scenario_s_unless_a_range_is_given() -> None:
    fix = [*TINY_FIX, "parallelism.tp=2", "parallelism.pp=2"]
    fixed = search(_tiny(), fix=fix, top=0, workers=1, objective="step_time")
    assert set(fixed["global_batch"]) == {64}
    ranged = search(_tiny(), fix=fix, top=0, workers=1, objective="step_time",
                    batch_range=(32, 128))
    batches = set(ranged["global_batch"])
    assert 64 in batches and len(batches) > 1
    assert all(32 <= b <= 128 for b in batches)


def test_max_layouts_prices_a_sample_of_at_most_that_many_core_layouts() -> None:
    whole = search(_tiny(), fix=TINY_FIX[:2], top=0, workers=1)
    capped = search(_tiny(), fix=TINY_FIX[:2], top=0, workers=1, max_layouts=5)
    assert not whole.attrs["summary"].sampled
    assert capped.attrs["summary"].sampled and capped.attrs["summary"].core_layouts == 5
    assert len(capped) < len(whole)
    assert set(capped["key"]) <= set(whole["key"])


def test_the_default_headroom_is_ten_percent_of_device_memory() -> None:
    default = search(_tiny(), fix=TINY_FIX, top=0, workers=1)
    assert DEFAULT_HEADROOM == 0.10
    assert default.attrs["summary"].memory_headroom == DEFAULT_HEADROOM
    hbm = _tiny().system.node.accelerator.hbm_bytes
    assert (default["memory_gb"] * 1e9 <= 0.9 * hbm).all()


def test_a_machine_no_layout_fills_reports_its_idle_devices(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Three nodes of 8 (the scenario's own layout: tp 8 · pp 3) searched at tp 8 · pp 2:
    16 devices fill no third node, so the best layout runs on 2 nodes and says that 8 of
    the 24 devices stay idle."""
    path = tmp_path / "three.yaml"
    path.write_text(yaml.safe_dump({**TINY, "nodes": 3, "parallelism": {
        "tp": 8, "pp": 3, "dp": "auto", "micro_batch": 1}}))
    args = ["search", str(path), "--workers", "1", "--top", "1", "--fix", "parallelism.tp=8",
            "--fix", "parallelism.pp=2", *(a for f in TINY_FIX for a in ("--fix", f))]
    code, stdout, stderr = run_cli(args, capsys)
    assert code == 0, stdout + stderr
    assert "leaves 8 of 24 devices idle" in " ".join(stdout.split())


def test_the_progress_line_says_layouts_per_second_and_time_left() -> None:
    buffer = io.StringIO()
    progress = _Progress(Console(file=buffer, force_terminal=False, width=200))
    progress(1, 4, 100)
    progress(4, 4, 400)
    progress.close()
    lines = buffer.getvalue().splitlines()
    assert lines[0].startswith("pricing layouts: 1/4 batches, 100 layouts, ")
    assert all("layouts/s" in line and "s left" in line for line in lines)
    assert lines[-1].endswith("about 0 s left")


def test_the_table_is_written_as_parquet_equal_to_the_csv(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    import pandas as pd

    from llmsim.search.output import write_outputs

    table = search(_tiny(), fix=TINY_FIX, top=2, workers=1)
    write_outputs(table, tmp_path / "csv", "csv")
    write_outputs(table, tmp_path / "pq", "parquet")
    from_csv = pd.read_csv(tmp_path / "csv" / "layouts.csv")
    from_parquet = pd.read_parquet(tmp_path / "pq" / "layouts.parquet")
    assert list(from_parquet["key"]) == list(from_csv["key"])
    assert from_parquet["est_step_time_s"].tolist() == pytest.approx(
        from_csv["est_step_time_s"].tolist(), rel=1e-12)


def test_the_extras_the_messages_name_exist() -> None:
    """``--format parquet`` and ``--scheduler`` tell the user to install
    ``llmsim[parquet]`` / ``llmsim[dask]``: pyproject must define them."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert any(d.startswith("pyarrow") for d in extras["parquet"])
    assert any(d.startswith("distributed") for d in extras["dask"])


def test_cli_search_on_a_dask_scheduler_gives_the_local_result(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    distributed = pytest.importorskip("distributed")
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(TINY))
    args = ["search", str(path), "--top", "2", *(a for f in TINY_FIX for a in ("--fix", f))]
    code, local, err = run_cli([*args, "--workers", "1"], capsys)
    assert code == 0, local + err
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                                  dashboard_address=None) as cluster:
        code, remote, err = run_cli([*args, "--scheduler", cluster.scheduler_address], capsys)
    assert code == 0, remote + err
    table = local[local.index("best layouts"):]
    assert remote[remote.index("best layouts"):] == table


@pytest.mark.parametrize("args, message", [
    (["--max-micro-batch", "0"], "--max-micro-batch"),
    (["--max-tp", "0"], "--max-tp"),
    (["--show", "-1"], "--show"),
    (["--fix", "nodes=100000"], "--fix: nodes=100000 is more than"),
    (["--fix", "parallelism.zero=5"], "--fix: zero=5 is not a ZeRO stage; use 0, 1, 2 or 3"),
    (["--fix", "parallelism.zero=-1"], "--fix: zero=-1 must be 0 or more"),
    (["--fix", "parallelism.tp=0"], "--fix: tp=0 must be 1 or more"),
])
def test_more_bad_options_give_one_line_errors(args: list[str], message: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    code, stdout, stderr = run_cli(["search", "selene-gpt3", *args], capsys)
    assert code == 2, stdout + stderr
    assert message in stderr
    assert "Traceback" not in stderr and len(stderr.strip().splitlines()) <= 3


def test_a_scheduler_without_dask_installed_is_a_one_line_error(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "distributed" else real(name, *a))
    code, stdout, stderr = run_cli(["search", "selene-gpt3", "--scheduler",
                                    "tcp://127.0.0.1:8786"], capsys)
    assert code == 2, stdout + stderr
    assert "llmsim[dask]" in stderr and "Traceback" not in stderr


def test_parquet_without_pyarrow_names_the_extra(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import pandas as pd

    from llmsim.search.output import write_outputs

    def no_pyarrow(*args: object, **kwargs: object) -> None:
        raise ImportError("Unable to find a usable engine")

    monkeypatch.setattr(pd.DataFrame, "to_parquet", no_pyarrow)
    table = pd.DataFrame({"key": ["a"], "est_step_time_s": [1.0]})
    with pytest.raises(llmsim.UserError, match=r"llmsim\[parquet\]"):
        write_outputs(table, tmp_path, "parquet")


def test_the_progress_bar_on_a_terminal_shows_layouts_per_second_and_an_eta() -> None:
    import re
    import time

    buffer = io.StringIO()
    progress = _Progress(Console(file=buffer, force_terminal=True, width=160))
    assert progress.bar is not None
    for done in (1, 2):
        progress(done, 4, 100 * done)
        progress.bar.refresh()
        time.sleep(0.02)
    progress.close()
    shown = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", buffer.getvalue()).split("\r")
    last = [line for line in shown if "2/4" in line][-1]
    assert "200 layouts" in last and "layouts/s" in last
    assert re.search(r"\d+:\d\d:\d\d\s*$", last.strip())  # the time left, h:mm:ss
