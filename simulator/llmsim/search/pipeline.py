"""Closed forms of a pipelined step, for the estimator (:mod:`llmsim.search.estimate`).

Each stage s is described by its per-micro-batch pass times (:class:`StageTimes`). With
``F_s``, ``B_s`` a stage's forward and backward per micro-batch (blocking sends, gathers
and ZeRO-3 waits included) and ``C_s = F_s + B_s`` its cycle, the step of ``m``
micro-batches over ``p`` stages takes

- 1F1B (PipeDream-Flush): ``(m−1)·max C + Σ_s C_s`` — the slowest stage's steady state,
  plus one micro-batch through every stage for the fill and drain (Narayanan et al.
  2021 §2.2, with unequal stages);
- GPipe: ``(m−1)·max F + Σ F_s + (m−1)·max B + Σ B_s``;
- interleaved 1F1B with ``v`` chunks: ``m·max C + (Σ C_s − max C)/v`` — the fill and
  drain shrink by v (Narayanan et al. 2021 §2.2: bubble (p−1)/(v·m));
- ZB-H1: ``(m−1)·max C + Σ_s (F_s + B_s) − (min(m, p)−2)·min W`` — with equal
  stages ``m·(F+B+W) + (p−1)(F+B−W)``, Qi et al. 2024 Table 2 (whose F, B and W are
  equal); where a stage's W is longer than its F or its B the deferred W passes outlast
  the cool-down the form counts (p 4, m 8, F = B = 1, W = 3: the form 40, the schedule 43;
  W = 1.5: 1/2 short at p 2), and the schedule's order is walked as ZB-V's below;
- ZB-H2: ``m·max C + (p−1)·max_s max(F_s, F_s + B_s − 2W_s)`` — with equal stages the
  parallelogram of Qi et al. 2024 §2.2 closed by the optimizer's synchronisation
  (``llmsim.schedules.zb_h2``), for m ≥ 2p − 1 and W ≤ F, B; unequal stages are
  approximated by the costliest stage's lag, and every stage is taken to end with the
  last (its deferred W passes fill the tail); with fewer than ``4(2p − 1)``
  micro-batches (:data:`ZB_H2_WALKED_BELOW`) or a W longer than F or B the order is
  walked instead, as ZB-V's below;
- ZB-H1 and ZB-H2 at ZeRO-3: the waits for the reduce-scatters queued before the next
  pass's gathers (``StageTimes.queue_wait``) are in ``C_s`` but not in the W that the
  closed forms subtract, and ride on each W pass in a walk;
- PipeDream (asynchronous 1F1B, no flush; Narayanan et al. 2019 §3.2): ``m·max C`` —
  in the steady state the pipeline never fills or drains, and the slowest stage sets
  the pace (the registry's bubble 0; :func:`llmsim.steady_state.pipedream_step_s`
  replays it; the reduction and update after every backward:
  :mod:`llmsim.search.pipedream_updates`);
- ZB-V: no closed form — its greedy order (``llmsim.schedules.zb_v``) is irregular once
  F, B and W differ — so :func:`zb_v_walk_s` replays the schedule's action order with
  these pass times, half of a stage's per chunk (Qi et al. 2024 §6): each pass starts
  when its stage is free and its inputs have arrived, the engine's rule without its
  events;

plus the pipeline hops where sends do not block (a blocking send is in its stage's pass
time already): one per stage boundary each way, or, where an interleaved pipeline posts
its sends one by one, the chain of every virtual stage's send each way
(:mod:`llmsim.search.posted_sends`). With equal stages and free communication each equals
the bubble closed forms the schedules' tests check.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llmsim.search.posted_sends import chain_hops_s, gather_delay_s
from llmsim.search.zb_v_walk import compiled, walk_s
from llmsim.search.zero3_queue import stream_share
from llmsim.specs.parallelism import prefetched


@dataclass(slots=True)
class StageTimes:
    """One stage's work per micro-batch, seconds (read only, but not ``frozen``: a frozen
    dataclass sets each field through ``object.__setattr__`` in its ``__init__``, about
    four times a plain one's time for these 17 fields, and the estimator makes several a
    layout; it holds lists, so it was never hashable)."""

    f: float
    """Forward passes of every chunk."""
    b: float
    """Input-gradient passes (recompute included)."""
    w: float
    """Weight-gradient passes (gradient accumulation included, averaged over the step)."""
    sends_f: float = 0.0
    """Forward pipeline sends of every chunk."""
    sends_b: float = 0.0
    """Backward pipeline sends."""
    gathers: float = 0.0
    """All-gathers of sliced pipeline messages (``pp_scatter_gather``)."""
    hop_f: float = 0.0
    """One send to the next stage (0 on the last)."""
    hop_b: float = 0.0
    """One send to the previous stage (0 on the first)."""
    zero_gathers_f: float = 0.0
    """ZeRO-3 weight gathers before the forward passes (data-parallel stream)."""
    zero_gathers_b: float = 0.0
    """ZeRO-3 weight gathers before the backward passes."""
    grad_buckets: list[tuple[int, float]] = field(default_factory=list)
    """Per chunk, its gradient buckets: (count, seconds of each one's reduction with the
    compute-stream kernels before it)."""
    chunk_backward: list[tuple[float, float]] = field(default_factory=list)
    """Per chunk, (input-gradient, weight-gradient) seconds of one micro-batch."""
    first_forward_gather: float = 0.0
    """Time the first forwards wait for the weights the optimizer updated
    (``overlap_param_gather``)."""
    chunk_forward: list[float] = field(default_factory=list)
    """Per chunk, forward seconds of one micro-batch (ZB-V's walk splits ``f`` by them)."""
    queue_wait: float = 0.0
    """ZeRO-3 under ZB-H1 or ZB-H2: seconds per micro-batch the compute stream waits for
    reduce-scatters queued before gathers (:func:`llmsim.search.zero3_queue.deferred_wait_s`),
    counted in the stage's cycle and not in ``w``, which the closed forms subtract."""
    chunk_gathers: list[tuple[float, int]] = field(default_factory=list)
    """Per chunk, its first forward's weight gather (``overlap_param_gather``): seconds of
    one layer's and the chunk's layers (empty: none; :func:`llmsim.search.posted_sends.
    gather_delay_s`)."""

    @property
    def reduction_s(self) -> float:
        """Every gradient bucket's reduction of one step, back to back."""
        return sum(count * seconds for count, seconds in self.grad_buckets)


def _passes(st: StageTimes, blocking: bool, posted_singly: bool, zero3: bool,
            prefetch: bool | str) -> tuple[float, float, float]:
    """(forward, backward, weight-gradient) time of one micro-batch on a stage's compute
    stream, with what it waits for. ``prefetch``: ``prefetch_weights`` (true, false or
    ``forward``, :func:`~llmsim.specs.parallelism.prefetched`)."""
    f, b, w = st.f, st.b, st.w
    if zero3:  # a pass with each layer's gather one layer ahead: the slower of the two
        # streams; without, each layer waits for its own gather
        gf, gb = st.zero_gathers_f, st.zero_gathers_b
        f = max(f, gf) if prefetched(prefetch, "F") else f + gf
        b = max(b, gb) if prefetched(prefetch, "B") else b + gb
    if posted_singly:  # each step waits for the previous step's send of its direction
        f, b = max(f, st.sends_f), max(b + w, st.sends_b) - w
    elif blocking:
        f, b = f + st.sends_f, b + st.sends_b
    return f + st.gathers, b, w


ZB_H2_WALKED_BELOW = 4
"""ZB-H2's order is walked with fewer than this many times 2p − 1 micro-batches, its
closed form used with more. Measured on 300 sampled ZB-H2 layouts of ``selene-gpt3``
(seed 1), closed form over walk by m / (2p − 1): below 1 (where the form does not hold)
mean 0.898; 1–2 mean 1.013, max 1.059; 2–4 mean 1.013, max 1.131; 4–8 mean 1.008, max
1.026; above 8 mean 1.002, max 1.013. The walk's order is compiled once per (p, m)
(about 5 µs a pass): walking every ZB-H2 layout of that space compiles 3.0 M passes,
below 4 a quarter of them (0.76 M)."""


Run = tuple[StageTimes, int]
"""Consecutive stages that cost the same: their times and how many there are."""


def pipeline_s(schedule: str, stages: list[StageTimes], m: int, v: int, *, blocking: bool,
               posted_singly: bool, zero3: bool, prefetch: bool | str
               ) -> tuple[float, list[float]]:
    """The pipeline phase of one step: (its length, when each stage's last pass ends)."""
    total, ends = pipeline_runs_s(schedule, [(st, 1) for st in stages], m, v,
                                  blocking=blocking, posted_singly=posted_singly,
                                  zero3=zero3, prefetch=prefetch)
    return total, [first for first, _ in ends]


def pipeline_runs_s(schedule: str, runs: list[Run], m: int, v: int, *, blocking: bool,
                    posted_singly: bool, zero3: bool,
                    prefetch: bool | str) -> tuple[float, list[tuple[float, float]]]:
    """:func:`pipeline_s` over runs of equal stages, at a cost independent of their
    length: (the phase's length, per run the latest end of its stages and when its last
    stage ends).

    Within a run of a closed form the stages end one after another (the drain; ZB-H1's
    deferred weight passes can reverse it), so the latest end is its first or its last
    stage's; a walk's is the latest of the run's own. The run's stages share a gradient
    tail: the latest end plus the tail is the run's latest.
    """
    p = sum(count for _, count in runs)
    passes = [_passes(st, blocking, posted_singly, zero3, prefetch) for st, _ in runs]
    cycle = []
    for (st, _), (f, b, w) in zip(runs, passes, strict=True):
        c = f + b + w + st.queue_wait
        if not blocking and not posted_singly:  # non-blocking sends queue on one link
            c = max(c, st.sends_f + st.sends_b)
        if zero3:  # the data-parallel stream's own work per micro-batch
            per_mb = st.zero_gathers_f + st.zero_gathers_b + st.reduction_s
            c = max(c, per_mb * stream_share(schedule, p, m))
        cycle.append(c)
    counts = [count for _, count in runs]
    if posted_singly and schedule == "interleaved-1f1b" and not zero3:
        hops = chain_hops_s(runs)  # each step waits for its send (.posted_sends)
    else:
        hops = 0.0 if blocking else sum((st.hop_f + st.hop_b) * n for st, n in runs)
    top = max(cycle)
    # ZB-H1's and ZB-H2's closed forms below assume W ≤ F, B, and ZB-H2's m ≥ 2p − 1;
    # otherwise, and where ZB-H2's is not close enough (ZB_H2_WALKED_BELOW), the order
    # is walked
    walked_order = schedule in ("zb-h1", "zb-h2") and (
        any(w > min(f, b) for f, b, w in passes)
        or (schedule == "zb-h2" and m < ZB_H2_WALKED_BELOW * (2 * p - 1)))
    if schedule == "gpipe":
        fwd = [f for f, _, _ in passes]
        bwd = [b + w for _, b, w in passes]
        if zero3:  # all backwards back to back: each one's gathers and reduce-scatters
            bwd = [max(x, st.zero_gathers_b + st.reduction_s)
                   for x, (st, _) in zip(bwd, runs, strict=True)]
        total = ((m - 1) * max(fwd) + sum(x * n for x, n in zip(fwd, counts, strict=True))
                 + (m - 1) * max(bwd) + sum(x * n for x, n in zip(bwd, counts, strict=True)))
    elif schedule == "interleaved-1f1b":
        total = m * top + (sum(c * n for c, n in zip(cycle, counts, strict=True)) - top) / v
    elif schedule == "zb-h1" and not walked_order:
        # The deferred W passes fill the cool-down: min(m, p) − 2 of them hide (Qi et al.
        # 2023's p − 2 once m ≥ p; with fewer micro-batches than stages each stage has
        # only m, and with one the last W runs after the backward chain).
        ws = [w for _, _, w in passes]
        total = ((m - 1) * top + sum((f + b) * n for (f, b, _), n in zip(passes, counts,
                                                                         strict=True))
                 - (min(m, p) - 2) * min(ws))
        total = max(total, m * top)
    elif schedule == "zb-h2" and not walked_order:
        lag = max(max(f, f + b - 2 * w) for f, b, w in passes)
        total = m * top + (p - 1) * lag
    elif schedule == "pipedream":  # the steady state: no fill or drain, no hops waited
        total = m * top - hops
    elif schedule == "zb-v" or walked_order:
        # ZB-V's order, ZB-H2's, or ZB-H1's where a W outlasts F or B (its deferred W
        # passes then outlast the closed form's cool-down), walked with these passes
        stages = [(st, pass_times) for (st, n), pass_times in zip(runs, passes, strict=True)
                  for _ in range(n)]
        if schedule == "zb-v":
            walk, stage_ends = zb_v_walk_s(stages, m, blocking=blocking)
        else:
            walk, stage_ends = one_chunk_walk_s(schedule, stages, m, blocking=blocking)
        extra = (_fill_gather_delay_s(runs) if schedule != "zb-v" and runs[0][0].chunk_gathers
                 else max(st.first_forward_gather for st, _ in runs))
        total = max(walk, m * top) + extra
        ends, s = [], 0
        for _, n in runs:
            ends.append((max(stage_ends[s:s + n]) + extra, stage_ends[s + n - 1] + extra))
            s += n
        return total, ends
    else:  # 1f1b, and one stage of anything
        total = (m - 1) * top + sum(c * n for c, n in zip(cycle, counts, strict=True))
    if posted_singly and schedule == "interleaved-1f1b" and runs[0][0].chunk_gathers:
        total += hops + _posted_gather_delay_s(runs, v)
    elif schedule in ("1f1b", "gpipe", "zb-h1", "zb-h2") and runs[0][0].chunk_gathers:
        total += hops + _fill_gather_delay_s(runs)
    else:
        total += hops + max(st.first_forward_gather for st, _ in runs)
    # The drain: stage s ends its last pass once the stages before it have run their
    # last backward (the gradient flows from the last stage to the first).
    ends, behind, s = [], 0.0, 0
    for (st, n), (_, b, w) in zip(runs, passes, strict=True):
        step = (b + w) / v + (0.0 if blocking else st.hop_b)
        first_lag, last_lag = behind, behind + (n - 1) * step  # the run's first and last
        if schedule == "zb-h1":  # the deferred weight passes fill the cool-down
            first_lag = max(0.0, first_lag - s * w)
            last_lag = max(0.0, last_lag - (s + n - 1) * w)
        elif schedule in ("zb-h2", "pipedream"):  # the tail filled; PipeDream: no drain
            first_lag = last_lag = 0.0
        last = total - last_lag
        ends.append((max(total - first_lag, last), last))
        behind += n * step
        s += n
    return total, ends


def _fill_gather_delay_s(runs: list[Run]) -> float:
    """The first forwards' gathers' delay of a pipeline of one chunk a stage
    (``overlap_param_gather``; 1F1B, GPipe, ZB-H1, ZB-H2): each stage's first forward waits for its
    layers' weights, gathered one layer ahead as it runs (:mod:`llmsim.engine.gathers`),
    and the next stage starts only when that forward has sent its output, so the delays
    add up along the fill. Stage 0 waits its whole :attr:`StageTimes.first_forward_gather`;
    a later stage finds its first layer's weights gathered (issued at the step's start,
    earlier than the fill reaches it) and waits the rest."""
    first = runs[0][0].first_forward_gather
    later = [(st.first_forward_gather - st.chunk_gathers[0][0], n - (k == 0))
             for k, (st, n) in enumerate(runs)]
    return first + sum(max(0.0, wait) * n for wait, n in later)


def _posted_gather_delay_s(runs: list[Run], v: int) -> float:
    """The first forwards' gathers' delay of an interleaved pipeline whose sends are
    posted one by one (:func:`llmsim.search.posted_sends.gather_delay_s`), the stages
    expanded from their runs; the last stage's send to stage 0 is one of its ``v − 1``
    forward sends."""
    stages = [st for st, n in runs for _ in range(n)]
    hops = [st.hop_f for st in stages[:-1]] + [stages[-1].sends_f / (v - 1)]
    return gather_delay_s([st.chunk_forward for st in stages], hops,
                          [st.chunk_gathers for st in stages])


def zb_v_walk_s(stages: list[tuple[StageTimes, tuple[float, float, float]]], m: int,
                         *, blocking: bool) -> tuple[float, list[float]]:
    """ZB-V's pipeline phase: (its length, when each stage's last pass ends), seconds.

    ``stages`` is per stage its times and its (forward, backward, weight-gradient) time
    of one micro-batch over both chunks (:func:`_passes`), split over the two chunks in
    the ratio of their own passes (``chunk_forward``, ``chunk_backward``; halves when
    unknown): stage 0's second chunk holds the LM head, its first the embedding.
    Each stage runs its actions in the schedule's order; a pass starts when the stage is
    free and its input is in: F after the F of the previous virtual stage, B after the
    B of the next one (the last virtual stage's B after its own F), W after its B. The
    V (stage s holds virtual stages s and 2p − 1 − s, Qi et al. 2024 §6) sends chunk 0
    down and chunk 1 up; a non-blocking send adds its hop (``hop_f`` to the next stage,
    ``hop_b`` to the previous one), a blocking one is in the pass times already, and the
    turn at the last stage sends nothing. Replayed from the order compiled once per
    (p, m) (:mod:`.zb_v_walk`).
    """
    durations: list[float] = []
    for st, (f, b, w) in stages:
        for sf, sb, sw in zip(*_chunk_shares(st), strict=True):
            durations += (f * sf, b * sb, w * sw)
    return walk_s(compiled(len(stages), m), durations, _hops(stages, blocking))


def one_chunk_walk_s(schedule: str, stages: list[tuple[StageTimes, tuple[float, float, float]]],
                     m: int, *, blocking: bool) -> tuple[float, list[float]]:
    """ZB-H1's or ZB-H2's pipeline phase by a walk of its order (:func:`zb_v_walk_s`'s,
    one chunk a stage): (its length, when each stage's last pass ends), seconds. The walk
    subtracts nothing, so ZeRO-3's queue wait (``queue_wait``) rides on each W pass."""
    durations = [x for st, (f, b, w) in stages for x in (f, b, w + st.queue_wait)]
    return walk_s(compiled(len(stages), m, schedule, 1), durations, _hops(stages, blocking))


def _hops(stages: list[tuple[StageTimes, tuple[float, float, float]]],
          blocking: bool) -> list[float]:
    """A walk's hops: none where sends block (they are in the pass times), else each
    stage's send to the next and to the previous stage."""
    if blocking:
        return [0.0] * (1 + 2 * len(stages))
    return [0.0, *(st.hop_f for st, _ in stages), *(st.hop_b for st, _ in stages)]


def _chunk_shares(st: StageTimes) -> tuple[list[float], list[float], list[float]]:
    """Each of two chunks' share of a stage's forward, backward and weight-gradient
    passes."""
    def shares(parts: list[float]) -> list[float]:
        total = sum(parts)
        return [x / total for x in parts] if len(parts) == 2 and total > 0 else [0.5, 0.5]

    return (shares(st.chunk_forward), shares([b for b, _ in st.chunk_backward]),
            shares([w for _, w in st.chunk_backward]))


def reduction_tail_s(st: StageTimes, p: int, *, overlap: bool, split_backward: bool,
                     zero3: bool) -> float:
    """How long after a stage's last pass its gradient reduction ends, seconds.

    The buckets of a chunk go out on the stage's data-parallel stream one after another.
    With ``overlap`` they become ready evenly over the chunk's last backward (its weight
    pass with a split backward; ZeRO-3: after each micro-batch's weight pass); without
    it, all of them after the stage's last pass. A FIFO of ``n`` buckets of ``d`` seconds
    ready at ``t0 + k·T/n`` (k = 1..n) ends at ``max(t0 + T/n + n·d, t0 + T + d)``, or
    ``free + n·d`` when the stream is busy until ``free``. Chunk c's last backward comes
    c·p backward steps before the stage's last one: the interleaved cool-down visits the
    chunks in reverse, p micro-batches each (Narayanan et al. 2021 §2.2).
    """
    if not overlap:
        return st.reduction_s
    free, finish = -float("inf"), 0.0
    for c in reversed(range(len(st.grad_buckets))):  # chunk v−1's go out first
        count, seconds = st.grad_buckets[c]
        if not count:
            continue
        b, w = st.chunk_backward[c]
        window = 0.0 if zero3 else (w if split_backward else b + w)
        t0 = -c * p * (b + w) - window  # relative to the end of the stage's last pass
        total = count * seconds
        finish = free = max(free + total, t0 + window / count + total,
                            t0 + window + seconds)
    return max(finish, 0.0)
