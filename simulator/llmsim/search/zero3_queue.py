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
"""

from __future__ import annotations


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
                   prefetch: bool, weight_s: float | None = None) -> float:
    """:func:`reduce_scatter_wait_s` averaged over a stage's W passes: a share ``cooled``
    followed by a backward (the cool-down), the rest by a forward (the steady state), each
    pass's wait taken with its own next layer — the waits averaged, not the layers, as the
    wait is not linear in them (a backward outlasting ``R + g`` hides the queue, a forward
    may not). With ``regather`` (ZeRO-3's regather for the recompute) a backward starts by
    recomputing a forward layer, so every W is followed by forward work. ``weight_s``
    (the W) given: chunks of one layer, whose forward's wait is :func:`one_layer_wait_s`'s."""
    if weight_s is not None and prefetch and not regather:
        forward = one_layer_wait_s(buckets, layer_gather_s, forward_layer_s,
                                   backward_layer_s, weight_s)
    else:
        forward = reduce_scatter_wait_s(buckets, layer_gather_s, forward_layer_s,
                                        prefetch=prefetch)
    if regather:
        return forward
    backward = reduce_scatter_wait_s(buckets, layer_gather_s, backward_layer_s,
                                     prefetch=prefetch)
    return cooled * backward + (1 - cooled) * forward


def per_microbatch_s(waits: list[float], m: int) -> float:
    """The waits of one micro-batch's W passes (one per chunk, ``waits``) averaged over
    the step's ``m`` micro-batches, less the stage's last W (chunk 0's in the cool-down
    of a looping schedule), whose reduce-scatters are the step's tail instead."""
    if not waits:
        return 0.0
    return sum(waits) - waits[0] / m


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
