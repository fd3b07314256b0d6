"""llmsim.costs.host_issue by framework path (``training.host_path``): the host's time per
eager kernel for bare PyTorch ops and for a model's layers as Python modules under
autograd, measured on one H100's host (docs/calibration.md, "Host issue")."""

from __future__ import annotations

import sys

import pytest
import yaml
from helpers import make_scenario, tiny_raw
from hypothesis import given, settings
from hypothesis import strategies as st

from llmsim import simulate
from llmsim.blocks import Block
from llmsim.cli import main
from llmsim.costs.host_issue import HostIssue, queue_end_s
from llmsim.errors import UserError
from llmsim.loader import load_spec
from llmsim.ops import ComputeOp

H100 = load_spec("accelerators", "h100-sxm5-80gb")
A100 = load_spec("accelerators", "a100-sxm4-80gb")


def test_each_path_takes_its_measured_host_time_and_graphs_take_none():
    for path, host_us in (("bare", 9.1), ("modules", 33.8)):
        issue = HostIssue.of(H100, False, path)
        assert issue.kernel_gap_s == pytest.approx(2.6e-6)
        assert issue.interval_s == pytest.approx(host_us * 1e-6)
    for path in ("bare", "modules"):
        issue = HostIssue.of(H100, True, path)
        assert issue.kernel_gap_s == pytest.approx(1.15e-6) and issue.interval_s == 0.0


def test_a_path_without_a_measurement_is_refused_in_one_sentence():
    assert A100.host_module_dispatch_us == 0.0
    with pytest.raises(UserError, match=r"training\.host_path: modules .* a100.*use bare"):
        HostIssue.of(A100, False, "modules")
    assert HostIssue.of(A100, True, "modules").interval_s == 0.0  # graphs: no host issue


def test_the_cli_refuses_the_unmeasured_path_with_exit_code_2(tmp_path, capsys):
    raw = tiny_raw()
    raw["training"]["host_path"] = "modules"  # Selene: A100s, no module measurement
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(raw))
    old, sys.argv = sys.argv, ["llmsim", "run", str(path)]
    try:
        with pytest.raises(SystemExit) as exc:
            main()
    finally:
        sys.argv = old
    err = " ".join(capsys.readouterr().err.split())
    assert exc.value.code == 2 and "Traceback" not in err
    assert "training.host_path: modules" in err and "host_module_dispatch_us" in err


class _Fixed:
    """Prices each op by its name from a table; the host issues every ``interval_s``."""

    def __init__(self, table_s: dict[str, float], interval_s: float) -> None:
        self.table_s, self.host_issue_s = table_s, interval_s

    def compute_s(self, op: ComputeOp) -> float:
        return self.table_s[op.name]

    def comm_s(self, op: object) -> float:
        raise AssertionError("no collectives here")


def test_an_op_of_n_short_kernels_ends_after_n_minus_1_dispatches():
    """Closed form at the modules rate: an op of ``n`` kernels of ``d/n`` each, each
    shorter than the host's 33.8 us, lasts (n − 1)·h + d/n — the host sets its pace; a
    20 us op after it that the host reached while it ran adds only its own time."""
    h = HostIssue.of(H100, False, "modules").interval_s
    n, d = 10, 50e-6
    ops = (ComputeOp("loop", "memory", "F", 0.0, 1.0, splits=n),
           ComputeOp("add", "memory", "F", 0.0, 1.0))
    block = Block.of(ops, _Fixed({"loop": d, "add": 20e-6}, h))
    assert block.spans[0].duration_s == pytest.approx((n - 1) * h + d / n)
    assert block.spans[1].duration_s == pytest.approx(h - d / n + 20e-6)
    assert block.duration_s == pytest.approx(queue_end_s([d / n] * n + [20e-6], h))


kernels = st.lists(st.tuples(st.floats(1e-7, 2e-4), st.integers(1, 6)), min_size=1,
                   max_size=25)


@settings(max_examples=150, deadline=None)
@given(kernels, st.floats(0.0, 6e-5), st.floats(0.0, 6e-5))
def test_more_host_time_per_dispatch_never_shortens_a_pass(ops_spec, h1, h2):
    low, high = sorted((h1, h2))
    ops = tuple(ComputeOp(f"op{i}", "memory", "F", 0.0, 1.0, splits=n)
                for i, (_, n) in enumerate(ops_spec))
    table = {op.name: d for op, (d, _) in zip(ops, ops_spec, strict=True)}
    fast, slow = Block.of(ops, _Fixed(table, low)), Block.of(ops, _Fixed(table, high))
    assert slow.duration_s >= fast.duration_s - 1e-15
    assert fast.duration_s >= sum(table.values()) - 1e-15


def test_a_step_on_the_modules_path_is_no_shorter_and_graphs_remove_the_path():
    """The tiny GPT on H100 nodes (kernels shorter than either dispatch): the modules path
    waits longer for the host than bare ops; under CUDA graphs the path changes nothing."""
    bare = simulate(make_scenario(system="eos"))
    modules = simulate(make_scenario(system="eos", training__host_path="modules"))
    assert modules.step_time_s > bare.step_time_s
    graphs = [simulate(make_scenario(system="eos", training__cuda_graphs=True,
                                     training__host_path=p)).step_time_s
              for p in ("bare", "modules")]
    assert graphs[0] == graphs[1] < bare.step_time_s
