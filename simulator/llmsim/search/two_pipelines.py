"""The estimator's form of the schedules with two pipelines: Chimera and DualPipe.

Chimera (Li & Hoefler 2021 §3) and DualPipe (DeepSeek-V3 report §3.2.1) run a down and
an up pipeline on the same ``p`` devices: device ``s`` holds stage ``s`` of the down
pipeline (chunk 0) and stage ``p − 1 − s`` of the up one (chunk 1), a second replica of
the weights, and half the micro-batches go each way (:mod:`llmsim.schedules.chimera`,
:mod:`llmsim.schedules.dualpipe`). Neither has a closed form once the stages differ
(the first and last stages' embedding and LM head sit on devices 0 and p − 1 twice
over), so, as for ZB-V (:mod:`.zb_v_walk`), the estimator walks the schedule's action
order with the layout's pass times: a pass starts when its device is free and its input
is in — F after the F of the previous stage of its micro-batch's route, B after the B of
the next one, W after its own B; with a fused backward (Chimera) the input gradient
leaves after W, with a split one (DualPipe) right after B. Which pass waits for which
depends only on (schedule, p, m), so :func:`compiled` works that out once per process
(the schedules' one walk, :mod:`llmsim.schedules.walk`).

After the walk, each device's gradient buckets go out on its data-parallel stream as
the estimator's FIFO has them (:func:`llmsim.search.pipeline.reduction_tail_s`'s rule,
here with each chunk's last backward taken from the walk), then the pair ``s``,
``p − 1 − s`` sums its two replicas' gradients
(:meth:`llmsim.workload.Workload.replica_grad_exchange`, the engine's
:mod:`llmsim.engine.replicas`), and the optimizer steps over both replicas' weights.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from llmsim.in_flight import schedule_rows
from llmsim.optimizer import optimizer_step
from llmsim.schedules import SCHEDULES, SPLIT_BACKWARD
from llmsim.schedules.walk import Row, replay
from llmsim.schedules.walk_kernel import replay_ends
from llmsim.search.memo import BoundedMemo
from llmsim.search.pairs import PairParts, paired_passes
from llmsim.search.pass_cache import PassBoundedCache
from llmsim.search.pipeline import StageTimes
from llmsim.workload import shard_ranks


def has_two_pipelines(schedule: str) -> bool:
    """Whether ``schedule`` runs two pipelines on the same devices (the registry's
    ``pipelines``)."""
    return SCHEDULES[schedule].pipelines > 1


def allows(schedule: str, p: int, m: int, zero: int = 0) -> bool:
    """Whether ``schedule`` can run ``m`` micro-batches on ``p`` stages at ZeRO stage
    ``zero``: for Chimera and DualPipe an even p and ZeRO 0–2 (both, the parallelism
    spec's rule) and whole units of p micro-batches (Chimera, Li & Hoefler 2021 §3.5) or
    an even m ≥ 2p (DualPipe, deepseek-ai/DualPipe's assertion); the schedules' own
    rules, checked here so that the search does not build a scenario to learn them.
    Every other schedule: True."""
    if has_two_pipelines(schedule) and zero == 3:
        return False
    if schedule == "chimera":
        return p % 2 == 0 and m % p == 0
    if schedule == "dualpipe":
        return p % 2 == 0 and m % 2 == 0 and m >= 2 * p
    return True


@dataclass(frozen=True, slots=True)
class CompiledOrder:
    """One (schedule, p, m)'s passes in an order in which each comes after the one it
    waits for: per pass (device, duration column ``6·s + 3·chunk + kind``, the 1-based
    index of the pass it waits for or 0, the hop its input takes: 0 none or blocking,
    ``1 + s`` device s's send to s + 1, ``1 + p + s`` its send to s − 1); and per
    (device, chunk) the index of its last weight-gradient pass."""

    p: int
    rows: np.ndarray
    """The passes as a (passes × 4) array (:func:`llmsim.schedules.walk.rows_table`)."""
    last_w: dict[tuple[int, int], int]

    @property
    def passes(self) -> tuple[Row, ...]:
        """The passes as :data:`~llmsim.schedules.walk.Row` tuples (for
        :func:`llmsim.schedules.walk.replay`)."""
        return tuple(map(tuple, self.rows.tolist()))


CACHE_PASSES = 3_000_000
"""Most passes of compiled orders one process keeps (least recently used dropped), as
:data:`llmsim.search.zb_v_walk.CACHE_PASSES`."""
_CACHE: PassBoundedCache[CompiledOrder] = PassBoundedCache(CACHE_PASSES,
                                                            lambda o: len(o.rows))


def compiled(schedule: str, p: int, m: int) -> CompiledOrder:
    """The compiled order of ``schedule`` (Chimera or DualPipe) over ``p`` stages and
    ``m`` micro-batches (memoised per process up to :data:`CACHE_PASSES` passes)."""
    return _CACHE.get((schedule, p, m), lambda: _compile(schedule, p, m))


def _compile(schedule: str, p: int, m: int) -> CompiledOrder:
    """The order's wait graph (:func:`llmsim.schedules.walk.wait_graph`), the input
    gradient leaving after W where the backward is fused; a pass of an overlapped pair
    (:attr:`llmsim.schedules.ScheduleInfo.overlapped_pairs`, DualPipe's) takes its
    duration from column ``6p + 4·s + 2·chunk`` (forward) or that ``+ 1`` (backward)."""
    order, rows = schedule_rows(  # Chimera's rows made with its order
        schedule, p, m, 1, gradient_after_weights=schedule not in SPLIT_BACKWARD)
    n = len(rows)
    stage, column, number = rows[:, 0], rows[:, 1], np.arange(1, n + 1)
    is_w = column % 3 == 2  # a W: column 6·s + 3·chunk + 2
    last_ws = np.zeros((p, 2), dtype=np.int64)
    np.maximum.at(last_ws, (stage[is_w], column[is_w] // 3 - 2 * stage[is_w]), number[is_w])
    last_w = {(s, c): int(last_ws[s, c]) for s in range(p) for c in (0, 1) if last_ws[s, c]}
    find_pairs = SCHEDULES[schedule].overlapped_pairs
    if find_pairs is not None:
        # per device, its passes' positions in its own order → their pair column (a
        # device's passes come in the graph in its order: a pass's position is the count
        # of its device's passes before it), as one array over the devices' orders
        sizes = np.array([len(actions) for actions in order], dtype=np.int64)
        first = np.concatenate(([0], np.cumsum(sizes)[:-1]))
        paired = np.full(int(sizes.sum()), -1, dtype=np.int64)
        for s, actions in enumerate(order):
            for pair in find_pairs(actions):
                for i in pair:
                    a = actions[i]
                    paired[first[s] + i] = 6 * p + 4 * a.stage + 2 * a.chunk + (a.kind == "B")
        by_stage = np.argsort(stage, kind="stable")
        position = np.empty(n, dtype=np.int64)
        position[by_stage] = np.arange(n) - np.repeat(first, sizes)
        pair_column = paired[first[stage] + position]
        rows = rows.copy()
        rows[:, 1] = np.where(pair_column >= 0, pair_column, column)
    return CompiledOrder(p, rows, last_w)


def walk(order: CompiledOrder, durations: list[float], hops: list[float]) -> list[float]:
    """Each pass's end (index 0: time 0), seconds, with ``durations`` and ``hops`` indexed
    as :class:`CompiledOrder` says (:func:`llmsim.schedules.walk.replay`)."""
    return replay(order.p, order.passes, durations, hops)[0]


WALK_MEMO = 4096
"""Walks whose results one process keeps, by their exact inputs (as
:data:`llmsim.search.zb_v_walk.WALK_MEMO`): layouts that differ only in what the walk
does not read (the ZeRO stage below 3, the parameter-gather overlap, the gradient
buckets) replay the same walk. Only the ends :func:`phase_s` reads are kept (3p numbers
a walk, not one per pass), and only for the order walked last (a search's batch holds
one order's layouts, :mod:`.batching`): the memo holds no order the order cache dropped."""

_WALKS = BoundedMemo(WALK_MEMO)


def walk_ends(order: CompiledOrder, durations: list[float],
              hops: list[float]) -> tuple[tuple[float, ...], dict[tuple[int, int], float]]:
    """Of :func:`walk`'s ends, each device's last pass's (0.0 for a device without
    passes) and, per (device, chunk), its last weight-gradient pass's; memoised on the
    exact inputs (:data:`WALK_MEMO`)."""
    _WALKS.keep_for(order)
    key = (*durations, *hops)
    hit = _WALKS.get(key)
    if hit is None:
        picked, free = replay_ends(order.p, order.rows, durations, hops,
                                   np.fromiter(order.last_w.values(), dtype=np.int64))
        hit = _WALKS.put(key, (tuple(free), dict(zip(order.last_w, picked, strict=True))))
    return hit


def _chunk_passes(own: StageTimes, sends_f: float, sends_b: float,
                  blocking: bool) -> tuple[float, float, float]:
    """(F, B, W) of one micro-batch of one chunk on a device, with its blocking sends."""
    if not blocking:
        sends_f = sends_b = 0.0
    return own.f + own.gathers + sends_f, own.b + sends_b, own.w


def _pair_columns(devices: list[Device], durations: list[float],
                  pairs: list[PairParts] | None, blocking: bool) -> list[float]:
    """The columns ``6p + 4·s + 2·chunk (+ 1)`` of the passes of overlapped pairs:
    per device and chunk (F, B) paired with the device's other chunk, or the chunk's own
    F and B when ``pairs`` is None."""
    p, out = len(devices), []
    for s, dev in enumerate(devices):
        if pairs is None:
            out += durations[6 * s: 6 * s + 2] + durations[6 * s + 3: 6 * s + 5]
            continue
        held = (pairs[s], pairs[p - 1 - s])  # chunk 0 is stage s's, chunk 1 its mirror's
        sends = ((dev.times.hop_f, dev.times.hop_b), (dev.times.hop_b, dev.times.hop_f))
        for c in (0, 1):
            f, b = paired_passes(held[c], held[1 - c])
            times = devices[s if c == 0 else p - 1 - s].times
            sends_f, sends_b = sends[c] if blocking else (0.0, 0.0)
            out += (f + times.gathers + sends_f, b + sends_b)
    return out


@dataclass(slots=True)
class Device:
    """What one device of a two-pipeline layout holds: its own stage's priced times and
    chunk (the down pipeline's) and its mirror's (the up pipeline's stage p − 1 − s).
    Read only; not ``frozen``, for its ``__init__``'s time (as :class:`StageTimes`)."""

    times: StageTimes
    """The stage's times with its pipeline sends (the estimator's ``runs`` entry)."""
    chunk: Any
    """The stage's :class:`~llmsim.workload.Chunk` (its parameters)."""
    tensors: int
    """Parameter tensors of the stage on one device."""
    bucket: tuple[int, float]
    """(count, seconds of each) of the stage's gradient buckets."""


def phase_s(devices: list[Device], schedule: str, m: int, *, blocking: bool,
            overlap_dp: bool, traffic: Any, costs: Any, par: Any, training: Any,
            node_of: list[int], pairs: list[PairParts] | None = None
            ) -> tuple[float, float, float]:
    """(pipeline phase, when the last device's gradients are summed, the slowest
    device's optimizer step), seconds, of a two-pipeline layout whose stage ``s`` is
    ``devices[s]``.

    Device ``s`` runs the down pipeline's stage ``s`` (chunk 0: its forward sends go to
    ``s + 1``, its backward ones to ``s − 1``) and the up pipeline's stage ``p − 1 − s``
    (chunk 1: the other way round) at ``devices[p − 1 − s]``'s pass times; a send to
    ``s + 1`` costs ``hop_f`` of device s, one to ``s − 1`` its ``hop_b`` (the link
    between the two, within a node or not). With ``pairs`` (per stage, its chunk's
    :class:`~llmsim.search.pairs.PairParts`; DualPipe's overlapped pairs) a pass of a
    pair takes the engine's paired duration (:func:`~llmsim.search.pairs.paired_passes`)
    with its sends; otherwise its own.
    """
    p = len(devices)
    order = compiled(schedule, p, m)
    durations: list[float] = []
    for s, dev in enumerate(devices):
        up = devices[p - 1 - s].times
        durations += _chunk_passes(dev.times, dev.times.hop_f, dev.times.hop_b, blocking)
        durations += _chunk_passes(up, dev.times.hop_b, dev.times.hop_f, blocking)
    durations += _pair_columns(devices, durations, pairs, blocking)
    hops = [0.0] * (1 + 2 * p) if blocking else \
        [0.0, *(d.times.hop_f for d in devices), *(d.times.hop_b for d in devices)]
    last_pass, last_w = walk_ends(order, durations, hops)
    # Each device's gradient buckets: chunk by chunk, as their last backward ends.
    split = schedule in SPLIT_BACKWARD
    done: list[float] = []
    for s, dev in enumerate(devices):
        chunks = []
        for c, held in ((0, dev), (1, devices[p - 1 - s])):
            count, seconds = held.bucket
            _, b, w = durations[6 * s + 3 * c: 6 * s + 3 * c + 3]
            window = (w if split else b + w) if overlap_dp else 0.0
            ready = last_w[(s, c)] if overlap_dp else last_pass[s]
            chunks.append((ready, window, count, seconds))
        free, finish = -float("inf"), last_pass[s]
        for ready, window, count, seconds in sorted(chunks):
            if not count:
                continue
            t0, total = ready - window, count * seconds
            free = max(free + total, t0 + window / count + total, t0 + window + seconds)
            finish = max(finish, free)
        done.append(finish)
    # The two replicas' gradients summed between s and p − 1 − s, then the optimizer. A
    # device's exchange and optimizer read only its two chunks' parameters, its tensors
    # and whether its mirror shares its node: devices alike are priced once.
    ready_all, opt_s = 0.0, 0.0
    priced: dict[tuple, tuple[float, float]] = {}
    for s, dev in enumerate(devices):
        mirror = p - 1 - s
        tensors = dev.tensors + devices[mirror].tensors
        within = node_of[s] == node_of[mirror]
        chunk, other = dev.chunk, devices[mirror].chunk
        key = (chunk.params, chunk.expert_params, other.params, other.expert_params,
               tensors, within)
        hit = priced.get(key)
        if hit is None:
            work = replace(traffic, chunks={(s, 0): chunk,
                                            (s, 1): replace(other, stage=s, chunk=1)},
                           pipelines=2)
            op = replace(work.replica_grad_exchange(s), within_node=within)
            opt = costs.compute_s(optimizer_step(par, training, work.stage_params(s),
                                                 tensors, shard_ranks(work, s)))
            opt += sum(costs.comm_s(g) for g in work.dp_param_gathers(s)) \
                if traffic.grad_ranks > 1 else 0.0
            hit = priced[key] = (costs.comm_s(op), opt)
        exchange_s, opt = hit
        ready_all = max(ready_all, max(done[s], done[mirror]) + exchange_s)
        opt_s = max(opt_s, opt)
    return max(last_pass), ready_all, opt_s
