"""ZeRO weight gathers: passes that wait, layer by layer, for their gathered weights.

ZeRO-3 gathers each layer's weights before its forward and again before its backward
(and its recompute, with ``regather_for_recompute``); ZeRO-1/2 with
``overlap_param_gather`` before the step's first forward of each chunk. Layer j's gather
is issued when layer j−1 starts (one layer of prefetch), on the ``dp`` stream. A
device-wide host sync inside a layer (``torch.cuda.synchronize()``,
:attr:`~llmsim.ops.ComputeOp.device_sync`) waits for the gather then in flight: the
compute stream idles from the sync until the ``dp`` stream has drained.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import simpy

from llmsim.blocks import Block
from llmsim.engine.devices import Device
from llmsim.engine.streams import Contention, Fifo
from llmsim.engine.sync_shares import sync_shares
from llmsim.ops import CommOp
from llmsim.schedules import Action
from llmsim.specs.parallelism import prefetched
from llmsim.workload import Workload


class WeightGathers:
    """The :class:`~llmsim.engine.Engine`'s gathered passes: a part of the engine, on the
    state :meth:`Engine.__init__` sets up (below), the engine's pricing (``_kind``,
    ``_priced``), its records (``_record_part``) and the gathers' collectives
    (:meth:`GradientTraffic._collective`)."""

    env: simpy.Environment
    work: Workload
    contention: dict[int, Contention]
    dp_waits: list[tuple[int, float, float]]
    dp_stream: dict[int, Fifo]
    gather_ops: dict[tuple[int, int], list[CommOp]]
    prefetch_weights: bool | str
    regather_for_recompute: bool

    def _gathered_pass(self, dev: Device, actions: list[Action], i: int, block: Block,
                       gathers: dict[tuple[int, int, str, int], simpy.Event],
                       grad_ops: list[simpy.Process] | None = None,
                       ) -> Iterator[simpy.Event]:
        """Run a pass layer by layer, each layer waiting for its gathered weights (ZeRO-3,
        or the first forward with ``overlap_param_gather``).

        Layer j's gather is issued when layer j−1 starts (one layer of prefetch, the
        in-flight limit the memory model assumes), the first layer's while the previous
        pass runs; without ``prefetch_weights`` for its pass (:meth:`prefetches`) it is
        issued when layer j is reached (a regathered recompute's too with
        :attr:`Workload.recompute_gather_at_call`). The pass's block is split evenly over
        its layers; a wait splits its compute record in two, and the wait is recorded as
        exposed DP time. A part with a device-wide host sync (:func:`.sync_shares.sync_shares`) runs
        to the sync, waits there for the device's ``dp`` work in flight (the next layer's
        gather, issued at the part's start), recorded the same way, and then runs the rest.
        With :attr:`Workload.unit_reductions`, each backward layer's gradient reductions are
        queued on the ``dp`` stream as its backward part ends (:meth:`_reduce_unit`), their
        processes added to ``grad_ops``.
        """
        env, act = self.env, actions[i]
        units = self._gathered_units(dev, act, block)
        kind = self._kind(act)

        parts = {0: units}  # units held → the parts' durations, split once

        def part_s(held: int, j: int) -> float:  # part j with ``held`` units taken
            if held not in parts:
                held_block = self._priced(dev.stage, act.chunk, kind, held)
                parts[held] = self._gathered_units(dev, act, held_block)
            return parts[held][j]

        ahead, ahead_next = self.prefetches(actions, i), self.prefetches(actions, i + 1)
        shares = sync_shares(block, self.work.chunks[(dev.stage, act.chunk)].units,
                             len(units))
        seg_start, seg_from, offset = env.now, 0.0, 0.0
        later: list[tuple[CommOp, object]] = []  # a unit's later reductions (_reduce_unit)
        for j, unit_s in enumerate(units):
            self._prefetch(dev, actions, i, j, gathers, reached=True)  # no-op when issued
            gather = gathers[(act.microbatch, act.chunk, act.kind, j)]
            if not gather.triggered:
                if env.now > seg_start:
                    self._record_part(dev, act, seg_start, seg_from, offset)
                wait_start = env.now
                yield gather
                self.dp_waits.append((dev.id, wait_start, env.now))
                seg_start, seg_from = env.now, offset
            if j + 1 < len(units):
                if ahead and not self._at_call(act, j + 1):
                    self._prefetch(dev, actions, i, j + 1, gathers)
            elif ahead_next and not self._at_call(actions[i + 1], 0):
                self._prefetch(dev, actions, i + 1, 0, gathers)
            # A unit's later reductions go behind the gathers issued so far for the part after
            # this one (the next unit's backward gathers), as FSDP1 issues them.
            if later:
                later = self._queue_reductions(dev, later, grad_ops, gathers.get(
                    (act.microbatch, act.chunk, act.kind, j + 1)))
            share = shares[j]
            in_flight = None if share is None else self._dp_in_flight(dev, gathers)
            if in_flight is None:
                yield from self.contention[dev.id].run(lambda held, j=j: part_s(held, j))
            else:  # to the sync, a wait for the other streams, the rest
                yield from self.contention[dev.id].run(
                    lambda held, j=j, share=share: part_s(held, j) * share)
                if not in_flight.triggered:
                    self._record_part(dev, act, seg_start, seg_from, offset + share * unit_s)
                    wait_start = env.now
                    yield in_flight
                    self.dp_waits.append((dev.id, wait_start, env.now))
                    seg_start, seg_from = env.now, offset + share * unit_s
                yield from self.contention[dev.id].run(
                    lambda held, j=j, share=share: part_s(held, j) * (1.0 - share))
            if grad_ops is not None and act.kind == "B" and self.work.unit_reductions:
                later = self._reduce_unit(dev, act, j, len(units), grad_ops)
            offset += unit_s
        self._queue_reductions(dev, later, grad_ops)
        self._record_part(dev, act, seg_start, seg_from, math.inf)

    def _reduce_unit(self, dev: Device, act: Action, part: int, parts: int,
                     grad_ops: list[simpy.Process]) -> list[tuple[CommOp, object]]:
        """Queue the first gradient reduction of the layer whose backward part ``part`` (of
        ``parts``) of ``act`` has just ended, and return its later ones
        (:attr:`Workload.unit_reductions` in all; none after a recompute part), which
        :meth:`_gathered_pass` queues behind the next part's gathers.

        FSDP1 runs a unit's post-backward hook, and reduce-scatters its gradient, once for
        each nested backward that reaches it. Under DistFlashAttn's patch a checkpoint holds
        one layer's feed-forward and the next one's attention: the unit's first reduction
        follows its feed-forward's backward and precedes the next checkpoint's recompute
        gathers; its second follows its attention's backward, after the next unit's
        backward gather has been prefetched, and runs under that unit's feed-forward
        backward. The weight-gradient GEMMs, which llmsim runs as the W pass after this
        one, are in the code inside each layer's backward."""
        if self._regathers(act) and part % 2 == 0:
            return []
        layer = (parts - 1 - part) // (2 if self._regathers(act) else 1)
        work = self.work
        calls = [(op, (act.microbatch, layer, call))
                 for call in range(work.unit_reductions)
                 for op in work.unit_grad_ops(work.chunks[(dev.stage, act.chunk)])]
        first = len(calls) // work.unit_reductions
        self._queue_reductions(dev, calls[:first], grad_ops)
        return calls[first:]

    def _queue_reductions(self, dev: Device, calls: list[tuple[CommOp, object]],
                          grad_ops: list[simpy.Process] | None,
                          after: simpy.Event | None = None) -> list[tuple[CommOp, object]]:
        """Queue gradient reductions ``calls`` (op, tag) on ``dev``'s ``dp`` stream, now or
        once ``after`` (a gather in flight) has ended, one process adding them in order, in
        ``grad_ops``; returns the empty list left."""
        if calls and (after is None or after.triggered):  # on the stream now, in order
            assert grad_ops is not None
            grad_ops += [self.env.process(self._collective(dev, op, tag=tag))
                         for op, tag in calls]
        elif calls:
            assert grad_ops is not None
            grad_ops.append(self.env.process(self._reductions(dev, calls, after)))
        return []

    def _reductions(self, dev: Device, calls: list[tuple[CommOp, object]],
                    after: simpy.Event | None) -> Iterator[simpy.Event]:
        """Gradient reductions ``calls`` queued on the ``dp`` stream, in order, once
        ``after`` has ended; ends when the last has."""
        if after is not None and not after.triggered:
            yield after
        done = [self.env.process(self._collective(dev, op, tag=tag)) for op, tag in calls]
        yield self.env.all_of(done)

    def _dp_in_flight(self, dev: Device, gathers: dict[tuple[int, int, str, int],
                                                        simpy.Event]) -> simpy.Event | None:
        """An event that succeeds when the work ``dev`` has issued to its ``dp`` stream so
        far has ended (the gathers issued, each of all its all-gathers, and whatever else
        was queued there); None when nothing is in flight."""
        events = [done for done in gathers.values() if not done.triggered]
        last = self.dp_stream[dev.id].last
        if last is not None and not last.triggered:
            events.append(last)
        return self.env.all_of(events) if events else None

    def prefetches(self, actions: list[Action], i: int) -> bool:
        """Whether action ``i``'s gathers are issued one layer ahead
        (:func:`~llmsim.specs.parallelism.prefetched`: all passes', or with ``forward``
        the forward passes' only); False past the last action."""
        return i < len(actions) and prefetched(self.prefetch_weights, actions[i].kind)

    def _at_call(self, act: Action, part: int) -> bool:
        """Whether part ``part`` of ``act``'s pass is a recompute whose gather is issued
        when the part is reached, not one part ahead
        (:attr:`Workload.recompute_gather_at_call`)."""
        return self.work.recompute_gather_at_call and self._regathers(act) and part % 2 == 0

    def _regathers(self, act: Action) -> bool:
        """Whether ``act``'s pass gathers each layer twice (recompute, then backward)."""
        return self.regather_for_recompute and act.kind == "B"

    def _gathered_units(self, dev: Device, act: Action, block: Block) -> list[float]:
        """Durations of the parts of a gathered pass, one gather before each: its layers
        (the block split evenly), or with :attr:`regather_for_recompute` each backward
        layer's recompute and then its backward."""
        layers = self.work.chunks[(dev.stage, act.chunk)].units
        layer_s = block.duration_s / layers
        if not self._regathers(act):
            return [layer_s] * layers
        recompute_s = sum(sp.duration_s for sp in block.spans if sp.phase == "R") / layers
        return [recompute_s, layer_s - recompute_s] * layers

    def _gather_ops(self, dev: Device, act: Action) -> list[CommOp]:
        """The per-layer weight gathers ``act``'s pass waits for (empty if none,
        :meth:`Workload.gathers_before`), built once per chunk."""
        if not self.work.gathers_before(act.kind, act.microbatch):
            return []
        chunk_key = (dev.stage, act.chunk)
        if chunk_key not in self.gather_ops:
            self.gather_ops[chunk_key] = self.work.weight_gathers(self.work.chunks[chunk_key])
        return self.gather_ops[chunk_key]

    def _prefetch(self, dev: Device, actions: list[Action], i: int, layer: int,
                  gathers: dict[tuple[int, int, str, int], simpy.Event],
                  reached: bool = False) -> None:
        """Issue the gather of one layer's weights for action ``i``, if it needs one
        (:meth:`Workload.gathers_before`); ``reached``: issued as its part is reached,
        whose compute then waits for the first call's all-gathers only (the later calls'
        gathered while the first call computes, as a framework that gathers at each call
        issues them), where one issued ahead is waited for whole.

        The backward walks the layers in reverse, so its j-th gather is of layer L−1−j
        (of layer L−1−⌊j/2⌋ when each layer is gathered for its recompute and again for
        its backward).
        """
        if i >= len(actions):
            return
        act = actions[i]
        key = (act.microbatch, act.chunk, act.kind, layer)
        ops = self._gather_ops(dev, act)
        if not ops or key in gathers:
            return
        if act.kind == "F":
            op = ops[layer]
        else:
            op = ops[len(ops) - 1 - layer // (2 if self._regathers(act) else 1)]
        done = self.env.event()
        gathers[key] = done
        parts = self.work.gather_parts(self.work.chunks[(dev.stage, act.chunk)], op)
        first = len(parts) * self.work.gather_messages if reached else 0
        self.env.process(self._gather(dev, parts, done, (act.microbatch, act.kind), first))

    def _gather(self, dev: Device, parts: tuple[CommOp, ...], done: simpy.Event,
                tag: object, first: int = 0) -> Iterator[simpy.Event]:
        """One layer's weights: :attr:`Workload.gather_messages` all-gathers back to back,
        of each of its parts (:meth:`Workload.gather_parts`) in turn, once for each of its
        calls (:attr:`Workload.gather_calls`). ``done`` succeeds after the last, or after
        the ``first`` ones where given: a part whose gather is issued when it is reached
        waits for its first call's only, each later call's gather running under the calls
        before it (:meth:`_prefetch`)."""
        sent = 0
        for i, op in enumerate(parts * self.work.gather_calls):
            for message in range(self.work.gather_messages):
                yield from self._collective(dev, op, tag=(tag, i, message) if i else
                                            (tag, message))
                sent += 1
                if sent == first:
                    done.succeed()
        if not done.triggered:
            done.succeed()
