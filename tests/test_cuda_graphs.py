"""training.cuda_graphs: compute kernels replayed from CUDA graphs pay the board's per-kernel
cost in a graph (``graph_kernel_us``), not the eager launch."""

from __future__ import annotations

import pytest
from helpers import make_scenario

from llmsim import simulate
from llmsim.costs.compute import ComputeModel
from llmsim.loader import load_spec
from llmsim.ops import ComputeOp

H100 = load_spec("accelerators", "h100-sxm5-80gb")
OPS = [ComputeOp("m", "memory", "F", 0.0, 1e6),
       ComputeOp("g", "gemm", "F", 2.0 * 512**3, 0.0, mnk=(512, 512, 512)),
       ComputeOp("s", "gemm", "F", 2.0 * 4096**3, 0.0, mnk=(4096, 4096, 4096), splits=4)]


@pytest.mark.parametrize("op", OPS, ids=lambda op: op.name)
def test_graphs_replace_each_launch_by_the_graph_kernel_cost(op: ComputeOp) -> None:
    eager, graphs = ComputeModel(H100, "bf16"), ComputeModel(H100, "bf16", cuda_graphs=True)
    saved = eager.compute_s(op) - graphs.compute_s(op)
    assert 0 < H100.graph_kernel_us < H100.kernel_launch_us
    assert saved == pytest.approx(
        op.splits * (H100.kernel_launch_us - H100.graph_kernel_us) * 1e-6)
    unmeasured = ComputeModel(H100.model_copy(update={"graph_kernel_us": 0.0}), "bf16",
                              cuda_graphs=True)
    assert eager.compute_s(op) - unmeasured.compute_s(op) == pytest.approx(
        op.splits * H100.kernel_launch_us * 1e-6)


def test_graphs_shorten_the_step_and_are_off_by_default() -> None:
    eager = simulate(make_scenario(system="eos"))
    default = simulate(make_scenario(system="eos", training__cuda_graphs=False))
    graphs = simulate(make_scenario(system="eos", training__cuda_graphs=True))
    assert eager.step_time_s == default.step_time_s > graphs.step_time_s
