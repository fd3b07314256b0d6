"""The estimator's share of a ZeRO-3 pass's waits that its closed forms leave out: a
device-wide host sync waiting for the gathers in flight, a gather per call of a layer
called more than once, a recompute gathered when it is reached.

The estimator prices a pass's weight gathers in aggregate (a pass of ``f`` seconds and
gathers of ``g``: ``max(f, g)`` prefetched, ``f + g`` not; :mod:`llmsim.search.pipeline`),
which holds while each gather hides under the layer before it. Three mechanisms of the
engine's gathered pass (:meth:`llmsim.engine.gathers.WeightGathers._gathered_pass`) break
that, and only DistFlashAttn's rows of the validation set have them (docs/validation.md
section 10): a ``torch.cuda.synchronize()`` inside a layer waits for the next layer's
gather then in flight (``ComputeOp.device_sync``; where the layer's kernels before the
sync are shorter than the gather, at 1K–2K tokens a GPU); a layer called several times a
pass is gathered that many times (``parallelism.gathers_per_call``); a regathered
recompute's gather is issued when the recompute is reached, its compute waiting for the
first call's gather (``parallelism.prefetch_recompute_gather`` false). For such a layout
without a pipeline this module replays the engine's gathered forward and backward of one
micro-batch layer by layer, in closed form: the parts (a layer, or its recompute and its
backward), each gather queued on the one ``dp`` stream when its part's predecessor starts
(prefetched) or when the part is reached, each part waiting at its start for its gather
(the first call's only where queued as the part is reached) and at its sync
(:func:`llmsim.engine.sync_shares.sync_shares`) for every gather queued; and returns the
waits less what the aggregate form already charged. Zero for every other layout, so the
estimator is unchanged there. Left out: a pipeline (``pp`` > 1), whose gathered passes
interleave across micro-batches (no layout of the validation set has these mechanisms
there).
"""

from __future__ import annotations

from collections.abc import Sequence

from llmsim.blocks import Block
from llmsim.costs import HardwareCosts
from llmsim.engine.sync_shares import sync_shares
from llmsim.specs import Scenario
from llmsim.specs.parallelism import prefetched
from llmsim.workload import Workload, build_workload


def applies(sc: Scenario) -> bool:
    """Whether ``sc``'s gathered passes have a mechanism the aggregate form leaves out
    (module docstring), without a pipeline: a cheap test on the specs."""
    par, trn = sc.parallelism, sc.training
    if par.zero != 3 or par.pp != 1 or sc.dp * par.cp * par.ep <= 1:
        return False
    syncs = trn.host_syncs == "attention" or (par.cp_schedule == "distflash" and par.cp > 1)
    at_call = not par.prefetch_recompute_gather and par.regather_for_recompute
    return syncs or at_call or par.gathers_per_call > 1


def pass_waits_s(parts_s: Sequence[float], shares: Sequence[float | None],
                 gather_s: Sequence[float], first_s: Sequence[float],
                 ahead: Sequence[bool], issued_s: float | None = None,
                 free_s: float = 0.0) -> tuple[float, float, float, float]:
    """One gathered pass's compute waits, in closed form: (the waits, s; the pass's end, s,
    from its start at 0; when the ``dp`` stream is free, s; when its last part starts, s).

    Part ``j`` (``parts_s[j]`` of compute, its device-wide sync ``shares[j]`` of the way
    in, or None) needs gather ``j`` (``gather_s[j]`` on the stream); gather ``j`` is
    queued when part ``j − 1`` starts where ``ahead[j]``, the part then waiting for all of
    it, else when part ``j`` is reached, the part waiting for its first ``first_s[j]``
    (the first call's); the first at ``issued_s`` (None: when the pass starts, as if
    reached). The stream runs one gather at a time, in the order queued, from ``free_s``;
    a sync waits until the stream is free."""
    waits = t = 0.0
    free = free_s
    ready: dict[int, float] = {}

    def queue(j: int, at: float, reached: bool) -> None:
        nonlocal free
        start = max(at, free)
        ready[j] = start + (first_s[j] if reached else gather_s[j])
        free = start + gather_s[j]

    if issued_s is not None:
        queue(0, issued_s, False)
    last = 0.0
    for j, part in enumerate(parts_s):
        if j not in ready:
            queue(j, t, True)
        if ready[j] > t:
            waits += ready[j] - t
            t = ready[j]
        last = t
        if j + 1 < len(parts_s) and ahead[j + 1]:
            queue(j + 1, t, False)
        share = shares[j]
        if share is None:
            t += part
            continue
        t += share * part
        if free > t:
            waits += free - t
            t = free
        t += (1.0 - share) * part
    return waits, t, free, last


def _passes(sc: Scenario, costs: HardwareCosts, work: Workload) -> tuple[Block, Block]:
    """The chunk's forward and backward blocks as the engine prices them at ``pp`` 1 (the
    forward from a drained queue, the backward with the lead it left:
    :meth:`llmsim.engine.passes.Passes._entry_lead_s`)."""
    chunk = work.chunks[(0, 0)]
    issue = costs.host_issue
    earned = issue.ahead and issue.interval_s > 0
    overlap_tp = sc.parallelism.overlap_tp_comm
    forward = Block.of(chunk.forward, costs, overlap_tp, 0, 0.0 if earned else None)
    backward = Block.of(chunk.backward, costs, overlap_tp, 0,
                        forward.lead_out_s if earned else None)
    return forward, backward


def gathered_waits_s(sc: Scenario, costs: HardwareCosts) -> float:
    """Seconds the estimator's step leaves out of ``sc``'s gathered passes (module
    docstring): the replayed waits of each micro-batch's forward and backward less the
    aggregate form's charge for their gathers; 0 where :func:`applies` does not."""
    if not applies(sc):
        return 0.0
    par = sc.parallelism
    work = build_workload(sc.model, par, sc.training, sc.dp)
    chunk = work.chunks[(0, 0)]
    ops = work.weight_gathers(chunk)
    if not ops or len(work.chunks) != 1:
        return 0.0
    call_s = sum(costs.comm_s(op) for op in work.gather_parts(chunk, ops[0])) \
        * work.gather_messages
    layer_s = call_s * work.gather_calls
    layers = chunk.units
    forward, backward = _passes(sc, costs, work)
    regather = work.regather_for_recompute
    ahead_f, ahead_b = prefetched(par.prefetch_weights, "F"), prefetched(par.prefetch_weights,
                                                                         "B")
    f_parts = [forward.duration_s / layers] * layers
    # the step's first gather, queued as the step starts where prefetched (ahead)
    waits_f, end_f, free, last_f = pass_waits_s(
        f_parts, sync_shares(forward, layers, layers), [layer_s] * layers,
        [call_s] * layers, [ahead_f] * layers, 0.0 if ahead_f else None)
    if regather:
        recompute_s = sum(sp.duration_s for sp in backward.spans if sp.phase == "R") / layers
        b_parts = [recompute_s, backward.duration_s / layers - recompute_s] * layers
    else:
        b_parts = [backward.duration_s / layers] * layers
    at_call = [regather and work.recompute_gather_at_call and j % 2 == 0
               for j in range(len(b_parts))]
    # the backward's first gather, prefetched when the forward's last layer starts
    issued = last_f - end_f if ahead_b and not at_call[0] else None
    waits_b, _, _, _ = pass_waits_s(
        b_parts, sync_shares(backward, layers, len(b_parts)), [layer_s] * len(b_parts),
        [call_s] * len(b_parts), [ahead_b and not late for late in at_call], issued,
        free - end_f)
    # what the estimator's aggregate form charges: one call a gather, max(f, g) ahead
    gathers_f = layers * call_s
    gathers_b = layers * call_s * (1 + regather)
    charged = 0.0
    for pass_s, gathers_s, ahead in ((forward.duration_s, gathers_f, ahead_f),
                                     (backward.duration_s, gathers_b, ahead_b)):
        charged += max(0.0, gathers_s - pass_s) if ahead else gathers_s
    per_microbatch = max(0.0, waits_f + waits_b - charged)
    return per_microbatch * work.microbatches

