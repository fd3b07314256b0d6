"""Gradient buckets (:mod:`llmsim.workload.grad_buckets`): the groups of equal buckets and
the ops they expand to agree, and cover each chunk's gradients exactly once. Closed forms of
particular layouts (whole-matrix buckets, staging copies, bucket checks) are in
tests/test_workload.py."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from helpers import make_scenario
from hypothesis import given, settings
from hypothesis import strategies as st

from llmsim.workload import build_workload


def _workload(zero: int, bucket_mb: float, whole: bool, server: bool):
    s = make_scenario(nodes=2, parallelism__tp=2, parallelism__pp=2, parallelism__zero=zero,
                      parallelism__dp_bucket_mb=bucket_mb,
                      parallelism__grad_buckets_whole_matrices=whole,
                      **({"parallelism__dp_mode": "parameter_server"} if server else {}))
    return build_workload(s.model, s.parallelism, s.training, s.dp)


@settings(max_examples=25, deadline=None)
@given(zero=st.sampled_from([0, 1, 2, 3]), bucket_mb=st.floats(0.05, 2000.0),
       whole=st.booleans())
def test_bucket_groups_expand_to_the_ops_and_cover_the_gradients(zero, bucket_mb, whole):
    work = _workload(zero, bucket_mb, whole, server=False)
    for chunk in work.chunks.values():
        groups = work.dp_grad_buckets(chunk)
        ops = work.dp_grad_ops(chunk)
        assert len(ops) == sum(count for count, _ in groups)
        names = [op.name for op in ops]
        assert len(set(names)) == len(names)  # one name per bucket, "..._b{i}"
        at = 0
        for count, first in groups:
            for op in ops[at:at + count]:
                assert op == replace(first, name=op.name)  # the same but its name
            at += count
        total = chunk.params * work.grad_bytes_per_param
        assert math.isclose(sum(op.bytes for op in ops), total, rel_tol=1e-12)
        if not whole:  # split by bytes: equal buckets of at most the bucket size
            assert all(op.bytes <= bucket_mb * 1e6 * (1 + 1e-12) for op in ops)
            assert len(ops) == max(1, math.ceil(total / (bucket_mb * 1e6)))


@pytest.mark.parametrize(("zero", "server", "collective", "prefix"), [
    (0, False, "all_reduce", "dp_ar"), (1, False, "reduce_scatter", "dp_rs"),
    (0, True, "push_pull", "dp_ps")])
def test_the_reduction_follows_zero_and_the_dp_mode(zero, server, collective, prefix):
    work = _workload(zero, 25.0, False, server)
    ops = work.dp_grad_ops(work.chunks[(0, 0)])
    assert {op.collective for op in ops} == {collective}
    assert all(op.name.startswith(f"{prefix}_c0_b") for op in ops)


def test_no_prep_kernels_unless_a_check_or_a_scaling_is_on():
    work = _workload(1, 25.0, False, server=False)
    assert not work.has_grad_sync_prep
    bucket = work.dp_grad_ops(work.chunks[(0, 0)])[0]
    assert work.grad_sync_prep(bucket) == ()
