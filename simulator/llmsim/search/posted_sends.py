"""What an interleaved pipeline whose sends are posted one by one waits for in its fill.

Megatron-LM's overlapped interleaved schedule posts each pipeline send and receive on
its own (the engine's ``rendezvous``, :meth:`llmsim.engine.Engine._recv_posts`): a
forward step posts the receive of the next forward's input with its own send, a send
starts once its receive is posted, and each forward step waits for the previous forward
step's send to complete (each backward step for the previous backward's). Two things
follow that the estimator's closed form (:func:`llmsim.search.pipeline.pipeline_runs_s`)
counts here.

**The chain of sends** (:func:`chain_hops_s`). The first micro-batch's forward crosses
all ``v·p`` virtual stages one pass and one send after another before the first backward
can start, and the last micro-batch's backward crosses them back: ``v·p − 1`` sends each
way, not the ``p − 1`` of a pipeline whose sends are batched. Each stage contributes its
sends of one micro-batch (``StageTimes.sends_f``, ``sends_b``: one per virtual stage it
holds, but the last virtual stage's forward and the first one's backward). Measured on
the engine (``MLPERF-v3.0-CoreWeave-n3584``: tp 4, pp 8, v 12, 24 micro-batches; no
compute units held by collectives or posted operations and no overlapped weight gather,
so that only the pipeline's own timing differs): estimator over engine 0.970 with one
send per stage boundary each way, 0.994 with the chains. Not at ZeRO-3, whose passes
wait for their layers' gathers and the queue of reduce-scatters
(:mod:`llmsim.search.zero3_queue`): there the chain overshot the engine (a deep layout,
tp 4 · pp 32 · v 3 at 32 micro-batches, 1.009 → 1.024), so ZeRO-3 keeps one send per stage
boundary each way; why the engine hides the chain there is not worked out.

**The first forwards' weight gathers** (ZeRO-1/2 with ``overlap_param_gather``,
:func:`gather_delay_s`). Each chunk's first forward waits layer by layer for its
weights; the engine issues a pass's first layer's gather when the action before it
starts and each further layer's when the layer before it starts
(:mod:`llmsim.engine.gathers`). A stage that waits for its gather posts its next
receive late, so its upstream neighbour, whose next forward waits for the send to it,
waits too: the waits do not add up per stage as a per-stage sum would count them, nor
hide as the stage's own passes would hide them. The warm-up is walked instead, forward
by forward on every stage, with the engine's rules, once with the gathers and once
without; the gathers delay the step by the difference of the last stage's first
backward, which the steady state then carries to the end (the engine on
``MLPERF-v3.0-CoreWeave-n3584``, ``MEGREADME-H100-08`` and ``MBRIDGE-2511-H100-01``:
the walk's delay equals the engine's to the microsecond: 0.1695, 0.2581 and 0.2773 s).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np
from numba import njit

from llmsim.search.memo import BoundedMemo

if TYPE_CHECKING:
    from llmsim.search.pipeline import StageTimes


def chain_hops_s(runs: Iterable[tuple[StageTimes, int]]) -> float:
    """Seconds of the sends the first micro-batch's forward chain and the last
    micro-batch's backward chain wait for where sends are posted one by one: every
    stage's forward and backward sends of one micro-batch, over runs of ``n`` equal
    stages, ``Σ (sends_f + sends_b)·n``."""
    return sum((st.sends_f + st.sends_b) * n for st, n in runs)


Gather = tuple[float, int]
"""A chunk's first-forward weight gather: (seconds of one layer's gather, its layers)."""

_DELAYS = BoundedMemo(4096)
""":func:`gather_delay_s` by its exact inputs, and :func:`first_backward_s` without gathers
by its passes and sends (a search's switch variants share them)."""


def gather_delay_s(forward_s: Sequence[Sequence[float]], hop_s: Sequence[float],
                   gathers: Sequence[Sequence[Gather]]) -> float:
    """Seconds the first forwards' weight gathers delay an interleaved pipeline whose
    sends are posted one by one: :func:`first_backward_s` with the gathers less without.

    ``forward_s[s][c]``: stage s's forward of chunk c, one micro-batch; ``hop_s[s]``: a
    send from stage s to the next (the last stage's: to stage 0); ``gathers[s][c]``:
    chunk c's gather (:data:`Gather`)."""
    passes = (tuple(map(tuple, forward_s)), tuple(hop_s))
    key = (passes, tuple(map(tuple, gathers)))
    hit = _DELAYS.get(key)
    if hit is None:
        alone = _DELAYS.get(passes)  # without gathers: shared by every data-parallel width
        if alone is None:
            alone = _DELAYS.put(passes, first_backward_s(forward_s, hop_s, None))
        hit = _DELAYS.put(key, first_backward_s(forward_s, hop_s, gathers) - alone)
    return hit


def first_backward_s(forward_s: Sequence[Sequence[float]], hop_s: Sequence[float],
                     gathers: Sequence[Sequence[Gather]] | None) -> float:
    """When the last stage's first backward can start, seconds from the step's start: the
    warm-up forwards of Megatron-LM's interleaved order walked with the engine's rules
    for posted sends (arguments as :func:`gather_delay_s`; ``gathers`` None: none).

    Forward j of every stage (j < v·p) is micro-batch j mod p of chunk ⌊j/p⌋; stage s's
    input of forward j is stage s−1's forward j (stage 0's of chunk c > 0: the last
    stage's forward j − p). Forward j starts when the stage's forward j − 1 has ended,
    its send has completed and its input is in; a send starts when its pass has ended,
    the stage's previous send has completed and the receiver has posted the receive,
    after its own previous forward. The first forward of a chunk (micro-batch 0) also
    waits for its first layer's gather, issued as forward j − 1 started (at 0 for the
    first), and each further layer for what its predecessor's compute does not hide.
    The last stage's first backward follows its forward (v − 1)·p, the first of its last
    chunk; every walked forward is a warm-up forward (stage s runs 2(p−s−1) + (v−1)·p of
    them), so no backward interleaves. A forward's times depend on the stages' times at
    j + s one less, a send's also on the receiver's pass at the same j + s: the walk
    goes by j + s, passes before sends. Compiled by numba (:func:`_walk`; the same IEEE
    double operations as the Python loop it replaced, ``tests/test_search_speed_g.py``'s
    reference).
    """
    forward = np.asarray(forward_s, dtype=np.float64)
    hops = np.asarray(hop_s, dtype=np.float64)
    if gathers is None:
        return _walk(forward, hops, False, _NONE_S, _NONE_LAYERS)
    layer_s = np.array([[g[0] for g in row] for row in gathers], dtype=np.float64)
    layers = np.array([[g[1] for g in row] for row in gathers], dtype=np.int64)
    return _walk(forward, hops, True, layer_s, layers)


_NONE_S = np.zeros((1, 1))
_NONE_LAYERS = np.zeros((1, 1), dtype=np.int64)


@njit(cache=True, nogil=True)
def _walk(forward_s, hop_s, gathered, gather_s, gather_layers):  # pragma: no cover - numba
    """:func:`first_backward_s`'s walk (``gathered`` False: no gathers)."""
    p, v = forward_s.shape
    last = (v - 1) * p
    size = last + p
    end = np.zeros((p, size))
    sent = np.zeros((p, size))  # when forward j's send has completed
    start = np.zeros((p, size))  # the forwards' starts: the gathers read them
    # stage s walks its forwards j <= last + p - 1 - s (k = j + s < size): their sends
    # and receives reach the last stage's forward ``last``; ties go to the first
    for k in range(size):
        top = min(p, k + 1)
        for s in range(top):
            j = k - s
            c = j // p
            if j:
                t = end[s, j - 1]
                d = sent[s, j - 1]
                if d > t:
                    t = d
            else:
                t = 0.0
            if s:
                arrival = sent[s - 1, j]
            elif c:
                arrival = sent[p - 1, j - p]
            else:
                arrival = 0.0
            if arrival > t:
                t = arrival
            f = forward_s[s, c]
            if gathered:
                if j % p == 0:
                    layer_s = gather_s[s, c]
                    layers = gather_layers[s, c]
                    ready = (start[s, j - 1] if j else 0.0) + layer_s
                    if ready > t:
                        t = ready
                    if layers > 1 and layer_s > f / layers:
                        f += (layers - 1) * (layer_s - f / layers)
                start[s, j] = t
            end[s, j] = t + f
        for s in range(top):
            j = k - s
            if s == p - 1:
                if j >= last:
                    continue  # the last virtual stage sends nothing forward
                posted = end[0, j + p - 1]
            else:
                posted = end[s + 1, j - 1] if j else 0.0
            t = end[s, j]
            if posted > t:
                t = posted
            if j and sent[s, j - 1] > t:
                t = sent[s, j - 1]
            sent[s, j] = t + hop_s[s]
    return end[p - 1, last]
