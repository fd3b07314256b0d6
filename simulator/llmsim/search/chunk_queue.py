"""A chunk's passes as one host-issue queue, where the host's issue binds.

The engine lays out a chunk's whole pass (its layers, the embedding, the head and the
chunk's extras) as one :class:`~llmsim.blocks.Block`, so where the host issues the
kernels slower than the device runs them (``training.host_path: modules`` on short
passes) the host's backlog carries from layer to layer
(:func:`llmsim.costs.host_issue.queue_end_s`: ``max over k of (k·h + Σ_{i≥k} d_i)`` over
the whole pass). A sum of per-layer blocks restarts that queue at every layer, each as if
the host were at the pass's start, and comes out short (MOE-02 at sequence 512, one
forward of 8 layers: 7.10 ms against 9.93 ms). So the estimator prices such a chunk's
passes here, through the same :meth:`Block.of` over the same ops in the engine's order
(:func:`llmsim.workload.build_workload`), and keeps the per-layer sums where no layer's
pass would wait for the host even from an empty queue (:func:`host_binds`; then no op
waits in either, and both agree).
"""

from __future__ import annotations

from llmsim.blocks import Block, chained_passes_s
from llmsim.costs import HardwareCosts
from llmsim.costs.host_issue import pass_waits_s
from llmsim.specs import Model, Training
from llmsim.workload import Op, PassOps
from llmsim.workload.build import chunk_pass_ops


def host_binds(ops: tuple[Op, ...], block: Block, costs: HardwareCosts) -> bool:
    """Whether a chunk of passes like ``block`` (``ops`` laid out) may wait for the host's
    issue: whether ``ops``, queued from an empty queue (the host no further ahead than the
    device, :func:`pass_waits_s` without ``ahead``) over the block's spans (each op's time
    with any wait), wait anywhere. Where they do not, neither did the block (its first
    wait would be one here too: the spans before it are the ops' own times), nor does a
    chunk of such passes, whose host enters each pass at least as far ahead: the layers'
    blocks add up exactly."""
    issue = costs.host_issue
    if issue.interval_s <= 0:
        return False
    spans = [span.duration_s for span in block.spans]
    return any(pass_waits_s(ops, spans, issue.interval_s, False, issue.loop_interval_s))


def chunk_queue_s(model: Model, training: Training, ops: PassOps,
                  extras: tuple[tuple[Op, ...], tuple[Op, ...]], costs: HardwareCosts,
                  overlap_tp: bool, n: int, first: bool, last: bool,
                  start: int) -> tuple[float, float, float]:
    """Forward, backward (recompute and input gradient) and weight-gradient seconds of a
    chunk of ``n`` layers from layer ``start`` (``first`` / ``last``: it holds the
    embedding / the head), each pass one block: its ops in the engine's order, the
    chunk's FP8 amax reductions ``extras`` (forward, backward) included, its gradient
    accumulation not (the estimator adds it apart)."""
    passes = chunk_pass_ops(model, training, ops, n, first, last, start, extras)
    return chained_passes_s(passes, costs, overlap_tp, first and last)
