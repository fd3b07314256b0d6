"""A step's gradient buckets: how each chunk's weight gradients are split into equal
buckets, reduced over their data-parallel group (all-reduce, reduce-scatter or a parameter
server's push and pull), and the kernels a bucket runs before its reduction
(:class:`GradientBuckets`, the part of :class:`~llmsim.workload.step.Workload` that says it).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

from llmsim.ops import CommOp, ComputeOp

if TYPE_CHECKING:
    from llmsim.workload.step import Chunk


class GradientBuckets:
    """The gradient-bucket methods of :class:`~llmsim.workload.step.Workload`, which holds
    the fields they read (annotated here, documented there)."""

    grad_bytes_per_param: int
    zero: int
    bucket_bytes: float
    grad_all_reduce: bool
    parameter_server: bool
    grad_bucket_nan_check: bool
    grad_bucket_prescale: bool
    bucket_matrices: int
    unit_reductions: int
    grad_groups: tuple[tuple[str, int], tuple[str, int]]

    def dp_grad_buckets(self, chunk: Chunk) -> list[tuple[int, CommOp]]:
        """The gradient reduction of one chunk as groups of equal buckets: (count, the
        first bucket) for the dense weights (over their group, :attr:`grad_groups`), then,
        with expert parallelism, the routed experts' (over theirs); the ops of
        :meth:`dp_grad_ops` differ within a group only in their names."""
        (dense_axis, dense_ranks), (expert_axis, expert_ranks) = self.grad_groups
        if dense_axis == expert_axis:
            parts = [(dense_axis, dense_ranks, chunk.params, "")]
        else:
            parts = [(dense_axis, dense_ranks, chunk.params - chunk.expert_params, ""),
                     (expert_axis, expert_ranks, chunk.expert_params, "_experts")]
        all_reduce = self.zero == 0 or self.grad_all_reduce
        kind = "all_reduce" if all_reduce else "reduce_scatter"
        if self.parameter_server:
            kind = "push_pull"
        # DeepSpeed's allreduce_and_copy, Megatron's local DDP without contiguous buffers:
        # flatten the bucket, scale it, copy it back.
        staging = 3 if self.grad_all_reduce else 0
        groups = []
        for axis, ranks, params, tag in parts:
            if ranks == 1 or params == 0:
                continue
            total = params * self.grad_bytes_per_param
            buckets = self._bucket_count(total, chunk.units)
            groups.append((buckets, CommOp(
                f"dp_{'ps' if self.parameter_server else 'ar' if all_reduce else 'rs'}{tag}"
                f"_c{chunk.virtual_stage}_b0", kind,
                axis, "W", total / buckets, staging_passes=staging)))
        return groups

    def _bucket_count(self, total_bytes: float, layers: int) -> int:
        """Gradient buckets of ``total_bytes`` over ``layers`` layers: equal ones of at most
        :attr:`bucket_bytes`, or with :attr:`bucket_matrices` as many whole matrices per
        bucket as fit (at least one: DeepSpeed reduces an oversized matrix alone)."""
        if not self.bucket_matrices:
            return max(1, math.ceil(total_bytes / self.bucket_bytes))
        matrices = max(1, layers) * self.bucket_matrices
        per_bucket = max(1, math.floor(self.bucket_bytes * matrices / total_bytes))
        return math.ceil(matrices / per_bucket)

    def dp_grad_ops(self, chunk: Chunk) -> list[CommOp]:
        """The bucketed gradient reduction of one chunk, last layer's bucket first; with
        expert parallelism the dense weights' buckets, then the routed experts'."""
        ops = []
        for count, first in self.dp_grad_buckets(chunk):
            stem = first.name.removesuffix("_b0")
            ops += [replace(first, name=f"{stem}_b{i}") for i in range(count)]
        return ops

    def unit_grad_ops(self, chunk: Chunk) -> list[CommOp]:
        """One layer's gradient reduction when each layer is reduced as its backward ends
        (:attr:`unit_reductions`): each group of :meth:`dp_grad_buckets` as one op of the
        chunk's share a layer, the chunk's gradients split evenly over its layers as
        :meth:`weight_gathers` splits its weights."""
        return [replace(first, name=first.name.removesuffix("_b0") + "_unit",
                        bytes=first.bytes * count / chunk.units)
                for count, first in self.dp_grad_buckets(chunk)]

    @property
    def has_grad_sync_prep(self) -> bool:
        """Whether gradient buckets run kernels on the compute stream before their
        reduction (:meth:`grad_sync_prep` is empty for every bucket otherwise)."""
        return bool(self.grad_bucket_nan_check or self.grad_bucket_prescale)

    def grad_sync_prep(self, bucket: CommOp) -> tuple[ComputeOp, ...]:
        """Kernels the compute stream runs on a gradient bucket before its reduction.

        Megatron-Core's DDP (``start_grad_sync`` of its gradient buckets, 2024) first takes
        the L2 norm of the bucket and asserts it is not NaN: the norm reads the bucket,
        ``isnan`` and the copy of the flag to the host are two more kernels, and the host
        waits for the flag before it queues anything else, so none of the three launches
        hides behind the previous kernel. It then multiplies the bucket in place by its
        ``gradient_scaling_factor``, 1/dp (reads and writes it), and only then issues the
        collective.
        """
        ops = []
        if self.grad_bucket_nan_check:
            ops.append(ComputeOp("dp_grad_nan_check", "memory", "W", 0.0, bucket.bytes,
                                 splits=3))
        if self.grad_bucket_prescale:
            ops.append(ComputeOp("dp_grad_prescale", "memory", "W", 0.0, 2 * bucket.bytes))
        return tuple(ops)
