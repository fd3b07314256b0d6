"""The contended loop's pipeline messages: sends on a device's ``pp`` link, or posted one
by one on each pair's communicator (:mod:`~llmsim.engine.contended`).

A posted operation holds its units from when it reaches the head of its pair's stream
(:meth:`PipelineMessages._recv`, ``_send``); a send starts once its receive is posted
and, when it ends, gives back both halves' units and starts the next operation on both
streams. A send on the ``pp`` link is priced in closed form, as the tight loop's.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from llmsim.engine.contended_units import DeviceState, Op
from llmsim.engine.devices import Device
from llmsim.engine.uncontended_gathers import new_record
from llmsim.trace import Record

if TYPE_CHECKING:
    from llmsim.engine.replay import Engine
    from llmsim.engine.uncontended import MessageKey, Stream

_MESSAGE, _SENT = 1, 2
"""What a walk waits for (:data:`llmsim.engine.contended._PASS` …)."""


class PostedMessages:
    """The pipeline messages of a contended-loop replay: a part of its state
    (:class:`~llmsim.engine.contended._Contended`, below)."""

    engine: Engine
    records: dict[int, list[Record]]
    now: float
    ready: deque[DeviceState]
    links: dict[int, Stream]
    arrived: set[MessageKey]
    sent: set[MessageKey]
    message_start: dict[MessageKey, float]
    waits: dict[tuple[int, MessageKey], DeviceState]
    pair_streams: dict[tuple[int, int], deque[Op]]
    recv_posted: set[MessageKey]
    send_waiting: dict[MessageKey, Op]
    receiving: dict[MessageKey, Op]
    peers: dict[tuple[int, int], tuple[float, int]]
    at: Callable[..., None]
    hold: Callable[[DeviceState, int, int], None]

    def peer(self, dev: Device, stage: int) -> tuple[float, int]:
        """A send's seconds from ``dev`` to its pipeline's ``stage`` and the units a posted
        operation with that peer holds (:meth:`PipelineMessages._send_s`, ``p2p_units``)."""
        key = (dev.id, stage)
        known = self.peers.get(key)
        if known is None:
            engine = self.engine
            within = engine._within_node(dev, stage)
            known = self.peers[key] = (engine._send_s(dev.stage, stage, within),
                                       engine.p2p_units[within])
        return known

    def post(self, ds: DeviceState, peer_stage: int, op: Op) -> None:
        """Queue a posted send or receive on the stream of ``ds``'s pair with ``peer_stage``."""
        key = (ds.dev.id, peer_stage)
        stream = self.pair_streams.get(key)
        if stream is None:
            stream = self.pair_streams[key] = deque()
        stream.append(op)
        if len(stream) == 1:
            self.op_start(op)

    def op_start(self, op: Op) -> None:
        """An operation reaches the head of its stream: it holds its units; a receive is
        posted (its send may start), a send starts once its receive is."""
        self.hold(op.device, 0, op.units)
        key = op.key
        if op.microbatch < 0:  # a receive
            self.recv_posted.add(key)
            self.receiving[key] = op
            send = self.send_waiting.pop(key, None)
            if send is not None:
                self.transfer(send)
        elif key in self.recv_posted:
            self.transfer(op)
        else:
            self.send_waiting[key] = op

    def transfer(self, op: Op) -> None:
        op.start_s = self.message_start[op.key] = self.now
        self.at(self.now + op.duration_s, self.send_end, op)

    def _next_on(self, stream_key: tuple[int, int]) -> None:
        stream = self.pair_streams[stream_key]
        stream.popleft()
        if stream:
            self.op_start(stream[0])

    def send_end(self, op: Op, _: int) -> None:
        """A posted send ends: both halves give back their units, the next operations
        of both streams start, and the message is in."""
        ds, key = op.device, op.key
        dev = ds.dev
        self.records[dev.id].append(new_record(Record, (
            dev.id, dev.stage, "pp", "pp_send", key[1], op.microbatch, op.chunk, op.start_s,
            self.now, 0.0, math.inf)))
        self.hold(ds, 0, -op.units)
        self._next_on((dev.id, op.peer))
        recv = self.receiving.pop(key)
        self.hold(recv.device, 0, -recv.units)
        self._next_on((recv.device.dev.id, recv.peer))
        self.delivered(key)

    def delivered(self, key: MessageKey, _: int = 0) -> None:
        """Message ``key`` is in (and its send ended): wake who waits for either."""
        self.arrived.add(key)
        self.sent.add(key)
        for what in (_MESSAGE, _SENT):
            waiter = self.waits.pop((what, key), None)
            if waiter is not None:
                self.ready.append(waiter)

    def send(self, ds: DeviceState, key: MessageKey, mb: int, chunk: int, to_stage: int) -> None:
        """Send message ``key`` to ``to_stage`` now (:meth:`PipelineMessages._post_send`)."""
        dev = ds.dev
        send_s, units = self.peer(dev, to_stage)
        if self.engine.rendezvous:
            self.post(ds, to_stage, Op(ds, key, units, send_s, mb, chunk, to_stage))
            return
        start, end = self.links[dev.id].run(self.now, send_s)
        self.message_start[key] = start
        self.records[dev.id].append(new_record(Record, (
            dev.id, dev.stage, "pp", "pp_send", key[1], mb, chunk, start, end, 0.0,
            math.inf)))
        self.at(end, self.delivered, key)

    def receive(self, ds: DeviceState, key: MessageKey, from_stage: int) -> None:
        """Post the receive of message ``key`` from ``from_stage`` (:meth:`_recv`)."""
        self.post(ds, from_stage, Op(ds, key, self.peer(ds.dev, from_stage)[1], 0.0,
                                      peer=from_stage))
