"""Streams and contention: what one simulated device's work waits for and shares.

A :class:`Fifo` is a stream that runs one transfer at a time in the order queued (the
``pp`` link, the ``dp`` stream, a pair's communicator); a :class:`Barrier` is a
collective's rendezvous among its group's members (``fidelity="full"``); a
:class:`Contention` is the compute stream of a device whose passes run slower while other
kernels hold compute units. :func:`timeout_until` ends a wait at a time computed in
closed form.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Iterator, Sequence

import simpy


class Barrier:
    """Collective rendezvous for ``fidelity="full"``: fires when all members arrived."""

    def __init__(self, env: simpy.Environment) -> None:
        self.env = env
        self.waiting: dict[object, tuple[int, simpy.Event]] = {}

    def arrive(self, key: object, members: int) -> simpy.Event:
        count, event = self.waiting.get(key, (0, self.env.event()))
        count += 1
        self.waiting[key] = (count, event)
        if count == members:
            del self.waiting[key]
            event.succeed()
        return event


class Fifo:
    """A stream that runs one transfer at a time, in the order they were queued (a
    lighter ``simpy.Resource(capacity=1)``: one event per transfer)."""

    def __init__(self, env: simpy.Environment) -> None:
        self.env = env
        self.last: simpy.Event | None = None

    def queue(self) -> tuple[simpy.Event | None, simpy.Event]:
        """Join the queue: (the end to wait for first, or None when the stream is free;
        the event to succeed when this transfer ends)."""
        before, self.last = self.last, self.env.event()
        return (before if before is not None and not before.triggered else None), self.last


def timeout_until(env: simpy.Environment, time_s: float) -> simpy.Timeout:
    """A timeout that ends at ``time_s`` exactly (``now + delay`` rounds: the delay is
    moved by an ulp at a time until the sum is ``time_s``), so that a time computed in
    closed form is the one a chain of timeouts would reach."""
    delay = time_s - env.now
    while env.now + delay < time_s:
        delay = math.nextafter(delay, math.inf)
    while env.now + delay > time_s:
        delay = math.nextafter(delay, -math.inf)
    return env.timeout(delay)


def _first_of(env: simpy.Environment, a: simpy.Event, b: simpy.Event) -> simpy.Event:
    """An event that succeeds when the first of ``a`` and ``b`` has been processed: what
    ``a | b`` (a ``simpy.AnyOf``) does, scheduled at the same points (so every event of a
    step keeps its order), without building the condition's value, which a pass slowed
    by every hold and release of compute units paid once per change."""
    first = env.event()

    def wake(_: simpy.Event) -> None:
        if not first.triggered:
            first.succeed()

    a.callbacks.append(wake)
    b.callbacks.append(wake)
    return first


Mark = tuple[float, Callable[[], Iterator[simpy.Event] | None]]
"""(share of a pass's work, what to call when the pass has done that share). The call may
return work that the compute stream runs first, the pass paused until it ends."""

Pause = tuple[float, float, float]
"""(share of the pass done, start, end) of a pause for a mark's compute-stream work."""


class Contention:
    """Compute on one device that runs slower while other kernels hold compute units.

    A data-parallel collective holds the node's ``collective_units`` while it runs; a
    posted pipeline send or receive holds its channels until it completes. A pass priced
    ``price(held)`` seconds with ``held`` units taken progresses at ``1/price(held)`` of its
    work per second; each hold or release changes the rate of the pass under way. The
    pass's time beyond ``price(0)`` is shared between the holders by their units;
    :attr:`p2p_slowed_s` sums the pipeline operations' share.
    """

    def __init__(self, env: simpy.Environment, variable: bool) -> None:
        self.env = env
        self.variable = variable
        """Whether anything ever holds units on this device (else passes run at once)."""
        self.collective = 0
        self.posted = 0
        self.p2p_slowed_s = 0.0
        self.change: simpy.Event | None = None

    def hold(self, collective: int = 0, posted: int = 0) -> None:
        """A collective (``collective``) or a pipeline operation (``posted``) takes
        (positive) or gives back (negative) that many compute units. Taking or giving
        none (a collective on a node whose collectives hold no units) changes nothing: the
        pass under way runs on, unsplit."""
        if not collective and not posted:
            return
        self.collective += collective
        self.posted += posted
        if self.change is not None:
            change, self.change = self.change, None
            change.succeed()

    def mark_times(self, duration_s: float, shares: Sequence[float]) -> tuple[list[float], float]:
        """When a pass of ``duration_s`` that nothing slows, starting now, has done each
        of ``shares`` (sorted) of its work, and when it ends: the times :meth:`run`
        reaches with one timeout from mark to mark (the same sums, in the same order)."""
        times: list[float] = []
        t, done, i = self.env.now, 0.0, 0
        while True:
            while i < len(shares) and shares[i] <= done + 1e-12:
                times.append(t)
                i += 1
            if done >= 1.0 - 1e-12:
                return times, t
            target = shares[i] if i < len(shares) else 1.0
            t += (target - done) * duration_s
            done = target

    def run(self, price: Callable[[int], float],
            marks: Sequence[Mark] = ()) -> Generator[simpy.Event, object, list[Pause]]:
        """Run a pass that takes ``price(held)`` seconds with ``held`` units taken; each
        ``(share, call)`` of ``marks`` is called when that share of the pass's work is
        done, and the work a call returns runs before the pass goes on. Returns the
        pauses that work made."""
        env = self.env
        pauses: list[Pause] = []
        if not self.variable and not marks:
            yield env.timeout(price(0))
            return pauses
        alone_s = price(0)
        pending = sorted(marks, key=lambda mark: mark[0])
        done = 0.0  # share of the pass's work done
        while True:
            while pending and pending[0][0] <= done + 1e-12:
                share, call = pending.pop(0)
                interlude = call()
                if interlude is not None:
                    paused = env.now
                    yield from interlude
                    pauses.append((min(share, 1.0), paused, env.now))
            if done >= 1.0 - 1e-12:
                return pauses
            target = pending[0][0] if pending else 1.0
            collective, posted = self.collective, self.posted
            rate_s = price(collective + posted)
            if not self.variable:
                yield env.timeout((target - done) * rate_s)
                done = target
                continue
            if self.change is None:
                self.change = env.event()
            start, reach = env.now, env.timeout((target - done) * rate_s)
            yield _first_of(env, reach, self.change)
            elapsed = env.now - start
            done = target if reach.processed else done + elapsed / rate_s
            if posted and rate_s > alone_s:
                excess = elapsed * (1.0 - alone_s / rate_s)
                self.p2p_slowed_s += excess * posted / (collective + posted)


