"""The estimator's share of ZeRO-3 gradient reductions issued inside the backward, layer by
layer (``parallelism.reduce_in_backward``, FSDP1's post-backward hook): the engine's
placement (:meth:`llmsim.engine.gathers.WeightGathers._reduce_unit`) against the
estimator's, which queues a chunk's reductions after its weight-gradient pass.

In the engine each backward layer's first reduction is queued as its backward part ends,
on the one ``dp`` stream, just before the next layer's recompute gather that is issued
when the recompute is reached (``prefetch_recompute_gather`` false) and that the compute
waits for: each of the ``L − 1`` later layers waits one reduction longer, and the last
layer's reductions run under the weight-gradient pass (exposed only where they outlast
it). A unit's further reductions (``reduce_scatters_per_unit``) are queued behind the next
unit's backward gathers and run under its backward. So the step is
``(L − 1) r + max(0, n r − W)`` longer than with no reduction at all, where the estimator
charges the whole reduction after the weight-gradient pass: the difference is returned.

Priced where the engine's order gives that closed form: ZeRO-3 without a pipeline, one
micro-batch a step, the recompute regathered and its gather issued when reached (each
stream idle when a backward part ends, which ``tests/test_search_unit_reductions.py``
checks against the engine on DistFlashAttn's rows). Zero elsewhere: the estimator then
keeps its reductions after the backward (no layout of the validation set is such a case).
"""

from __future__ import annotations

from llmsim.blocks import Block
from llmsim.costs import HardwareCosts
from llmsim.specs import Scenario
from llmsim.workload import build_workload


def unit_reductions_s(sc: Scenario, costs: HardwareCosts) -> float:
    """Seconds to add to the estimator's step for ``sc``'s reductions in the backward
    (module docstring; negative where the engine's placement hides more): 0 where the
    closed form does not apply."""
    par = sc.parallelism
    if (par.zero != 3 or not par.reduce_in_backward or par.pp != 1
            or not par.regather_for_recompute or par.prefetch_recompute_gather
            or par.recompute not in ("full", "full_keep_attention")
            or sc.dp * par.cp * par.ep <= 1):
        return 0.0
    work = build_workload(sc.model, par, sc.training, sc.dp)
    if work.microbatches != 1 or len(work.chunks) != 1:
        return 0.0
    chunk = work.chunks[(0, 0)]
    layer_s = sum(costs.comm_s(op) for op in work.unit_grad_ops(chunk))
    after_s = sum(costs.comm_s(op) for op in work.dp_grad_ops(chunk))
    weight_s = Block.of(chunk.weight, costs, par.overlap_tp_comm, 0).duration_s
    last_s = max(0.0, work.unit_reductions * layer_s - weight_s)
    return (chunk.units - 1) * layer_s + last_s - after_s
