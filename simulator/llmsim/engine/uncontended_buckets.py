"""The tight loop's gradient buckets: each chunk's data-parallel reductions queued on a
device's ``dp`` stream without SimPy (:mod:`~llmsim.engine.uncontended`).

A chunk's buckets are priced once per group of equal ones (:meth:`Workload.dp_grad_buckets`)
and queued either all at one instant (a micro-batch's ZeRO-3 reduce-scatters, Megatron-Core's
aligned launches, the reductions after the last pass without overlap) — each starting when
the one before it ends, recorded by running sums — or as the last micro-batch's backward
makes them final (marks inside the pass, the shares :meth:`GradientTraffic._bucket_marks`
gives, at the times :meth:`Contention.mark_times` computes). A ZeRO gather in flight
(:class:`~llmsim.engine.uncontended_gathers.DeviceGathers`) has its all-gathers that join
the stream earlier queued first.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from itertools import accumulate, islice, repeat
from operator import itemgetter
from typing import TYPE_CHECKING

from llmsim.engine.devices import Device
from llmsim.engine.uncontended_gathers import DeviceGathers, new_record
from llmsim.trace import Record

if TYPE_CHECKING:
    from llmsim.engine.replay import Engine
    from llmsim.engine.uncontended import Stream


_name = itemgetter(1)
"""A launch's bucket name."""


class BucketTraffic:
    """The gradient buckets of a tight-loop replay: a part of its state (below)."""

    engine: Engine
    records: dict[int, list[Record]]
    dp: dict[int, Stream]
    gathers: dict[int, DeviceGathers]
    buckets: dict[tuple[int, int], tuple[list[str], list[float]]]

    def bucket_list(self, stage: int, chunk: int) -> tuple[list[str], list[float]]:
        """The names and seconds of a chunk's gradient buckets, last layer's first
        (:meth:`Workload.dp_grad_ops`'s names); a group of equal buckets priced once."""
        key = (stage, chunk)
        out = self.buckets.get(key)
        if out is None:
            out = self.buckets[key] = ([], [])
            for count, first in self.engine.work.dp_grad_buckets(self.engine.work.chunks[key]):
                stem, duration_s = first.name.removesuffix("_b0"), self.engine._comm_s(first, stage)
                prefix = f"{stem}_b"
                out[0].extend([prefix + str(i) for i in range(count)])
                out[1].extend([duration_s] * count)
        return out

    def queue_buckets(self, dev: Device, at_s: float, stage: int, chunk: int) -> float:
        """Queue a chunk's gradient buckets, all issued at ``at_s``, on ``dev``'s ``dp``
        stream, recording each; returns when the last ends (``at_s`` if it has none).

        Each starts when the one before it ends: the running sums
        :meth:`GradientTraffic._closed_form_run` makes, by ``accumulate``."""
        names, durations = self.bucket_list(stage, chunk)
        if not names:
            return at_s
        gathers = self.gathers.get(dev.id)
        if gathers is not None and gathers.pending is not None:
            gathers.advance(at_s)
        stream = self.dp[dev.id]
        ends = list(accumulate(durations, initial=at_s if at_s > stream.free_s
                               else stream.free_s))
        stream.free_s = ends[-1]
        self.records[dev.id].extend(map(new_record, repeat(Record), zip(
            repeat(dev.id), repeat(dev.stage), repeat("dp"), names, repeat("W"), repeat(-1),
            repeat(-1), ends, islice(ends, 1, None), repeat(0.0), repeat(math.inf))))
        return ends[-1]

    def marked_pass(self, dev: Device, now_s: float, duration_s: float,
                    launches: list[tuple[float, str, float]]) -> tuple[float, float]:
        """A pass of ``duration_s`` from ``now_s`` whose marks (share of the pass, name,
        seconds; shares sorted) launch gradient buckets onto ``dev``'s ``dp`` stream, each
        recorded: (the pass's end, the last bucket's end). The times are the sums
        :meth:`~llmsim.engine.streams.Contention.mark_times` makes, in one loop with the
        queueing."""
        stream, append = self.dp[dev.id], self.records[dev.id].append
        device, stage, inf = dev.id, dev.stage, math.inf
        gathers = self.gathers.get(dev.id)
        t, done, free = now_s, 0.0, stream.free_s
        if gathers is None:  # the loop below without a gather to advance, for speed:
            starts: list[float] = []  # the records made at the end, in one map
            ends: list[float] = []
            for share, _, bucket_s in launches:
                if share > done + 1e-12:
                    t += (share - done) * duration_s
                    done = share
                starts.append(t if t > free else free)
                free = starts[-1] + bucket_s
                ends.append(free)
            self.records[device].extend(map(new_record, repeat(Record), zip(
                repeat(device), repeat(stage), repeat("dp"), map(_name, launches), repeat("W"),
                repeat(-1), repeat(-1), starts, ends, repeat(0.0), repeat(inf))))
        for share, name, bucket_s in launches if gathers is not None else ():
            if share > done + 1e-12:
                t += (share - done) * duration_s
                done = share
            if gathers.pending is not None:  # its all-gathers first
                stream.free_s = free
                gathers.advance(t)
                free = stream.free_s
            start = t if t > free else free
            free = start + bucket_s
            append(new_record(Record, (device, stage, "dp", name, "W", -1, -1, start, free,
                                       0.0, inf)))
        stream.free_s = free
        if done < 1.0 - 1e-12:
            t += (1.0 - done) * duration_s
        return t, free

    def bucket_marks(self, dev: Device, actions: list, i: int,
                     carried: dict[tuple[int, int], list[tuple[float, str, float]]],
                     ) -> list[tuple[float, str, float]]:
        """The buckets the last micro-batch's backward launches as it makes them final,
        as (share of pass ``actions[i]``, name, seconds) — the shares
        :meth:`GradientTraffic._bucket_marks` gives; those of the W pass after a fused
        B go to ``carried``."""
        engine, act = self.engine, actions[i]
        names, durations = self.bucket_list(dev.stage, act.chunk)
        if not names:
            return []
        own_s, next_s = engine._block(dev, act).duration_s, 0.0
        if act.kind == "B":
            next_s = engine._block(dev, actions[i + 1]).duration_s
        n, both_s = len(names), own_s + next_s
        ats = [(k + 1) / n * both_s for k in range(n)]
        # The marks ascend (a product of ascending shares and both_s, each rounded once):
        # those up to own_s are this pass's, a prefix.
        cut = bisect_right(ats, own_s) if next_s != 0 else n
        shares = [at / own_s for at in ats[:cut]] if own_s > 0 else [1.0] * cut
        if cut < n:
            carried.setdefault((act.chunk, act.microbatch), []).extend(zip(
                [(at - own_s) / next_s for at in ats[cut:]], names[cut:], durations[cut:],
                strict=True))
        return list(zip(shares, names, durations, strict=False))  # the first cut buckets
