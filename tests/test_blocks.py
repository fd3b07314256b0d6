"""Pass templates (llmsim.blocks): ops laid out back to back, TP overlap's exposed part."""

from __future__ import annotations

import pytest
from helpers import LayerOnlyCosts, make_scenario

from llmsim.blocks import Block, exposed_overlap_s
from llmsim.workload import build_workload


def test_tp_overlap_closed_form():
    assert exposed_overlap_s(1.0, 4.0, 4) == pytest.approx(0.25)  # hidden but one piece
    assert exposed_overlap_s(4.0, 1.0, 4) == pytest.approx(3.25)  # the excess + a piece
    assert exposed_overlap_s(0.0, 1.0, 8) == 0.0
    assert exposed_overlap_s(1.0, 4.0, 1) == 0.0  # in bulk beside a longer GEMM: hidden
    assert exposed_overlap_s(4.0, 1.0, 1) == pytest.approx(3.0)  # only the excess


def test_a_block_lays_its_ops_back_to_back_and_splits_compute_from_tp():
    s = make_scenario(parallelism__tp=2, parallelism__pp=2)
    work = build_workload(s.model, s.parallelism, s.training, s.dp)
    costs = LayerOnlyCosts()
    block = Block.of(work.chunks[(0, 0)].forward, costs)
    ends = [span.offset_s + span.duration_s for span in block.spans]
    assert [span.offset_s for span in block.spans[1:]] == pytest.approx(ends[:-1])
    assert block.duration_s == pytest.approx(ends[-1])
    assert block.compute_s + block.tp_s == pytest.approx(block.duration_s)
    assert block.compute_s > 0
    assert {span.stream for span in block.spans} <= {"compute", "tp"}
