"""ZeRO-3's one data-parallel stream, for the estimator: the reduce-scatters of a weight
pass queued in front of the next pass's weight gathers.

The engine runs a device's ZeRO-3 traffic on one ``dp`` stream in the order it is
issued (:mod:`llmsim.engine.gathers`, :mod:`llmsim.engine.uncontended_gathers`): after
each weight-gradient pass (W) the chunk's gradient buckets are reduce-scattered, and
the next pass's layer gathers, issued one layer ahead (``prefetch_weights``) or when
each layer is reached, queue behind them. The next pass's first layer was gathered
while W ran, so its second layer starts ``R + g`` after the W ends instead of
``max(u, g)``: after each W but the stage's last (whose reduce-scatters are the step's
tail, :func:`llmsim.search.pipeline.reduction_tail_s`) the next pass ends later by

    wait = max(0, R − max(0, u − g))    with prefetch,
    wait = R                            without (the first layer's gather waits too),

``R`` the chunk's buckets back to back, ``g`` one layer's gather, ``u`` the next pass's
first layer: a forward layer in the steady state of 1F1B (F follows W), a backward
layer in its cool-down (B follows W), the two waits weighted by the share of each
(:func:`blended_wait_s`). Equal stages share one price, so the share is their least
(:func:`stage_cooldown_shares`): the one of them with the most W passes a forward
follows waits longest and sets the pace. A chunk of one layer has no second layer: the
wait falls on the pass after next instead, whose gather queues behind the same
reduce-scatters — the same ``R + g`` against the next pass ``u``. The estimator's
per-pass closed forms take each pass as the slower of its compute and its gathers, so
without this term they miss that wait:
measured on 12 sampled interleaved ZeRO-3 layouts of ``selene-gpt3`` the estimate was
0.66–0.94 of the engine (``docs/search.md``).

ZB-H1 and ZB-H2 defer W passes into the bubbles their closed forms subtract, so the
wait is not added to W there but to the stage's cycle (``StageTimes.queue_wait``), per
micro-batch the waits of the W passes a forward or a backward next follows
(:func:`deferred_w_follows`, :func:`deferred_wait_s`); the W passes followed by W
passes only end the stage, their reduce-scatters the step's tail.
"""

from __future__ import annotations

from functools import lru_cache

from llmsim.in_flight import schedule_order
from llmsim.specs.parallelism import prefetched


def reduce_scatter_wait_s(buckets: tuple[int, float], layer_gather_s: float,
                          next_layer_s: float, *, prefetch: bool) -> float:
    """Seconds the compute stream waits after one W pass of a chunk for that pass's
    reduce-scatters, queued before the next pass's gathers on the ``dp`` stream (module
    docstring): ``buckets`` is (count, seconds of each), ``layer_gather_s`` one layer's
    gather, ``next_layer_s`` the next pass's first layer."""
    count, seconds = buckets
    queued_s = count * seconds
    if not prefetch:
        return queued_s
    return max(0.0, queued_s - max(0.0, next_layer_s - layer_gather_s))


def one_layer_wait_s(buckets: tuple[int, float], layer_gather_s: float, forward_s: float,
                     backward_s: float, weight_s: float) -> float:
    """:func:`reduce_scatter_wait_s` where the chunks are one layer each and a forward
    follows the W (with prefetch): the forward's gather, issued as the W starts, runs
    before the reduce-scatters, so they start ``max(w, g)`` after the W does, and the
    backward after the forward waits for its gather behind them. From one W's start to
    the next the engine's stream takes ``max(w, g) + max(u, R + g) + b``; the estimator's
    passes count ``max(u, g) + max(b, g) + w`` of it, the rest is the wait."""
    count, seconds = buckets
    queued_s, g = count * seconds, layer_gather_s
    cycle = max(weight_s, g) + max(forward_s, queued_s + g) + backward_s
    return max(0.0, cycle - max(forward_s, g) - max(backward_s, g) - weight_s)


def blended_wait_s(buckets: tuple[int, float], layer_gather_s: float, forward_layer_s: float,
                   backward_layer_s: float, cooled: float, *, regather: bool,
                   prefetch: bool | str, weight_s: float | None = None) -> float:
    """:func:`reduce_scatter_wait_s` averaged over a stage's W passes: a share ``cooled``
    followed by a backward (the cool-down), the rest by a forward (the steady state), each
    pass's wait taken with its own next layer — the waits averaged, not the layers, as the
    wait is not linear in them (a backward outlasting ``R + g`` hides the queue, a forward
    may not). With ``regather`` (ZeRO-3's regather for the recompute) a backward starts by
    recomputing a forward layer, so every W is followed by forward work. ``weight_s``
    (the W) given: chunks of one layer, whose forward's wait is :func:`one_layer_wait_s`'s.
    ``prefetch`` ``forward`` (:func:`~llmsim.specs.parallelism.prefetched`): a next
    forward's gathers are ahead, a next backward's (its recompute's too) are not."""
    ahead_f, ahead_b = prefetched(prefetch, "F"), prefetched(prefetch, "B")
    if weight_s is not None and ahead_f and not regather:
        forward = one_layer_wait_s(buckets, layer_gather_s, forward_layer_s,
                                   backward_layer_s, weight_s)
    else:
        forward = reduce_scatter_wait_s(buckets, layer_gather_s, forward_layer_s,
                                        prefetch=ahead_f)
    if regather and ahead_f == ahead_b:
        return forward
    backward = reduce_scatter_wait_s(buckets, layer_gather_s,
                                     forward_layer_s if regather else backward_layer_s,
                                     prefetch=ahead_b)
    return cooled * backward + (1 - cooled) * forward


def per_microbatch_s(waits: list[float], m: int, schedule: str = "", p: int = 1) -> float:
    """The waits of one micro-batch's W passes (one per chunk, ``waits``) averaged over
    the step's ``m`` micro-batches, less the stage's last W (chunk 0's in the cool-down
    of a looping schedule), whose reduce-scatters are the step's tail instead.

    In 1F1B over ``p > 1`` stages (:func:`steady_state_share`) only the steady state's
    ``m − 1`` waits are on the step's path, so the waits are spread over the ``m − 1 + p``
    cycles the closed form counts."""
    if not waits:
        return 0.0
    if schedule == "1f1b" and p > 1:
        return sum(waits) * steady_state_share(p, m)
    return sum(waits) - waits[0] / m


def steady_state_share(p: int, m: int) -> float:
    """Of the ``m − 1 + p`` cycles that 1F1B's closed form ``(m−1)·max C + Σ_s C_s``
    (:mod:`llmsim.search.pipeline`) counts a per-micro-batch wait in, the share the engine
    waits: ``(m − 1) / (m − 1 + p)``.

    The step's path runs the first micro-batch's forwards down the stages, the slowest
    stage's ``m − 1`` cycles, each W there followed by a forward that waits behind its
    reduce-scatters, then the last micro-batch's backwards up the stages. In that drain
    stage s's backward waits anyway for stage s + 1's, which did a forward and waited
    its own queue first, so the reduce-scatters of s's W before it run in that idle time
    (the fill has no W before it). Counting the wait in every cycle made ZeRO-3 layouts
    of ``frontier`` at pp 8 with 4 micro-batches 1.21 of the engine, and 1.02 with 16
    (``tests/test_search_zero3_queue.py``)."""
    return (m - 1) / (m - 1 + p)


def stream_share(schedule: str, p: int, m: int) -> float:
    """The share of a stage's per-micro-batch ``dp``-stream work (its gathers and its
    reduce-scatters) that bounds each cycle of the closed form
    (:func:`llmsim.search.pipeline.pipeline_runs_s`): 1F1B over ``p > 1`` stages counts
    ``m − 1 + p`` cycles, but a stage's stream has only its ``m`` micro-batches' work, so
    the bound is that work spread over those cycles, ``m / (m − 1 + p)``; 1 otherwise.
    Bounding every cycle by all of it made a ZeRO-3 layout of ``frontier-moe`` (pp 8, two
    micro-batches, 42 s of reduce-scatters a W) 2.44 of the engine."""
    if schedule == "1f1b" and p > 1:
        return m / (m - 1 + p)
    return 1.0


def cooldown_share(schedule: str, p: int, m: int, v: int) -> float:
    """The share of a stage's W passes that a backward follows, averaged over the stages
    (:func:`stage_cooldown_shares`)."""
    return sum(stage_cooldown_shares(schedule, p, m, v)) / p


def stage_cooldown_shares(schedule: str, p: int, m: int, v: int) -> list[float]:
    """Per stage, the share of its W passes that a backward follows: those of the
    cool-down, as many as the warm-up's forwards — 1F1B's ``p − s − 1``, Megatron-LM's
    interleaved ``2(p − s − 1) + (v − 1)·p`` (Narayanan et al. 2021 §2.2), at most the
    stage's ``m·v`` passes —, all of GPipe's (its backwards run back to back), none of
    the others' (a forward follows, as in 1F1B's steady state)."""
    if schedule == "gpipe":
        return [1.0] * p
    if schedule == "1f1b":
        warm = [min(m, p - s - 1) for s in range(p)]
    elif schedule == "interleaved-1f1b":
        warm = [min(m * v, 2 * (p - s - 1) + (v - 1) * p) for s in range(p)]
    else:
        return [0.0] * p
    return [w / (m * v) for w in warm]


DEFERS_W = ("zb-h1", "zb-h2")
"""Schedules whose closed forms subtract the deferred W passes
(:func:`llmsim.search.pipeline.pipeline_runs_s`): their queue wait is the cycle's."""


@lru_cache(maxsize=1024)
def deferred_w_follows(schedule: str, p: int, m: int) -> tuple[tuple[int, int], ...]:
    """Per stage of ZB-H1 or ZB-H2 (one chunk, ``p`` stages, ``m`` micro-batches), how
    many of its ``m`` W passes the next pass other than a W is a forward after, and how
    many a backward; the rest are followed by W passes only (the stage's end).

    ZB-H1 (:mod:`llmsim.schedules.zb_h1`) is 1F1B with stage s's W(x) right after its
    B(x + s): with ``w = min(m, p − s − 1)`` warm-up forwards, B(j) is followed by a
    forward for ``j < m − w − 1``, so ``max(0, m − w − 1 − s)`` W passes by a forward and
    the rest of the ``m − s − 1`` that follow a B by a backward. ZB-H2's greedy order
    (:mod:`llmsim.schedules.zb_h2`), for ``m ≥ 2p − 1``: ``min(m, 2s + 1)`` W passes end the
    stage, ``min(3(p − 1 − s), m − min(m, 2s + 1))`` are followed by a backward; with fewer
    micro-batches the order itself is read (it is short). ``tests/test_search_zero3_queue.py``
    checks both against the orders."""
    if schedule == "zb-h1":
        out = []
        for s in range(p):
            forward = max(0, m - min(m, p - s - 1) - 1 - s)
            out.append((forward, max(0, m - s - 1) - forward))
        return tuple(out)
    if schedule == "zb-h2" and m >= 2 * p - 1:
        out = []
        for s in range(p):
            ends = min(m, 2 * s + 1)
            backward = min(3 * (p - 1 - s), m - ends)
            out.append((m - ends - backward, backward))
        return tuple(out)
    return tuple(_follows_in_order(row) for row in schedule_order(schedule, p, m, 1))


def _follows_in_order(row: tuple) -> tuple[int, int]:
    """(W passes a forward next follows, W passes a backward does) in one stage's order."""
    forward = backward = 0
    after = None  # the next pass other than a W, walking back from the end
    for action in reversed(row):
        if action.kind == "W":
            forward += after == "F"
            backward += after == "B"
        else:
            after = action.kind
    return forward, backward


def deferred_wait_s(buckets: tuple[int, float], layer_gather_s: float,
                    forward_layer_s: float, backward_layer_s: float,
                    follows: tuple[int, int], m: int, *, regather: bool, prefetch: bool | str,
                    weight_s: float | None = None) -> float:
    """Seconds per micro-batch a stage of ZB-H1 or ZB-H2 waits for its chunk's
    reduce-scatters: the waits of the W passes a forward follows and of those a backward
    follows (``follows``, :func:`deferred_w_follows`), each :func:`blended_wait_s`'s for
    its next pass, over the step's ``m`` micro-batches."""
    forward, backward = follows
    if not forward + backward:
        return 0.0
    args = (buckets, layer_gather_s, forward_layer_s, backward_layer_s)
    kw = {"regather": regather, "prefetch": prefetch, "weight_s": weight_s}
    return (forward * blended_wait_s(*args, 0.0, **kw)
            + backward * blended_wait_s(*args, 1.0, **kw)) / m
