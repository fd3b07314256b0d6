"""Pipeline messages: the activations and gradients passes send between stages.

A send runs on the device's ``pp`` link (blocking, or batched) or, in Megatron-LM's
overlapped interleaved schedule, on the two-rank communicator of the pair, posted with its
receive where Megatron-LM posts them and holding compute units until both halves are in
(docs/engine.md, "Posted pipeline operations hold compute units").
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterator

import simpy

from llmsim.blocks import CostModel
from llmsim.engine.devices import Device
from llmsim.engine.streams import Contention, Fifo, timeout_until
from llmsim.ops import CommOp
from llmsim.schedules import Action
from llmsim.trace import Record
from llmsim.workload import Workload


class PipelineMessages:
    """The :class:`~llmsim.engine.Engine`'s sends, receives and sliced-message gathers: a
    part of the engine, on the state :meth:`Engine.__init__` sets up (below) and the
    engine's :attr:`~llmsim.engine.Engine.backward_step`."""

    env: simpy.Environment
    work: Workload
    records: list[Record]
    pp_waits: list[tuple[int, float, float, float]]
    contention: dict[int, Contention]
    pp_link: dict[int, Fifo]
    pp_free_s: dict[int, float]
    closed_form_sends: bool
    p2p_stream: dict[tuple[int, int], Fifo]
    messages: dict[object, simpy.Event]
    message_start: dict[object, float]
    recv_posted: dict[object, simpy.Event]
    rendezvous: bool
    p2p_units: tuple[int, int]
    pp_send_op: dict[bool, CommOp]
    pair_send_s: dict[tuple[int, int, bool], float]
    pair_costs: Callable[[int, int], CostModel]
    pp_gather_s: float
    node_of: Callable[[Device, int], int] | None
    _within: dict[tuple[object, int, int], bool]
    backward_step: str

    def _message(self, key: object) -> simpy.Event:
        if key not in self.messages:
            self.messages[key] = self.env.event()
        return self.messages[key]

    def _post_send(self, dev: Device, key: tuple[object, str, int, int], mb: int, chunk: int,
                   to_stage: int) -> simpy.Event:
        """Send message ``key`` to ``to_stage``; the event fires when it is in.

        A send on the device's ``pp`` link (not posted on a pair's communicator) has
        nothing to wait for but the send before it, and holds nothing: it is priced in
        closed form, starting when it is sent and the link is free, and taking its priced
        time (the sums :meth:`_send` makes with a process, a timeout and two events); one
        event at its end delivers the message. A posted send runs as :meth:`_send`."""
        if self.rendezvous or not self.closed_form_sends:
            return self.env.process(self._send(dev, key, mb, chunk, to_stage))
        within = self._within_node(dev, to_stage)
        start_s = max(self.env.now, self.pp_free_s.get(dev.id, -math.inf))
        end_s = self.pp_free_s[dev.id] = start_s + self._send_s(dev.stage, to_stage, within)
        self.message_start[key] = start_s
        self.records.append(Record(dev.id, dev.stage, "pp", "pp_send", key[1], mb, chunk,
                                   start_s, end_s))
        message = self._message(key)
        timeout_until(self.env, end_s).callbacks.append(lambda _: message.succeed())
        return message

    def _send(self, dev: Device, key: tuple[object, str, int, int], mb: int, chunk: int,
              to_stage: int) -> Iterator[simpy.Event]:
        within = self._within_node(dev, to_stage)
        if self.rendezvous:  # on the pair's stream, once the receiver has posted
            before, sent = self._p2p_stream(dev, to_stage).queue()
        else:
            before, sent = self.pp_link[dev.id].queue()
        if before is not None:
            yield before
        units = self.p2p_units[within]  # (0, 0) unless sends rendezvous
        if self.rendezvous:
            self.contention[dev.id].hold(posted=units)
            yield self._recv_posted(key)
        start = self.env.now
        self.message_start[key] = start
        yield self.env.timeout(self._send_s(dev.stage, to_stage, within))
        self.records.append(Record(dev.id, dev.stage, "pp", "pp_send", key[1], mb, chunk,
                                   start, self.env.now))
        if self.rendezvous:
            self.contention[dev.id].hold(posted=-units)
        sent.succeed()
        self._message(key).succeed()

    def _recv(self, dev: Device, key: object, from_stage: int) -> Iterator[simpy.Event]:
        """A posted receive: it runs on the pair's stream after what was posted there
        before it, holds its channels' compute units, and ends when the message is in."""
        before, received = self._p2p_stream(dev, from_stage).queue()
        if before is not None:
            yield before
        units = self.p2p_units[self._within_node(dev, from_stage)]
        self.contention[dev.id].hold(posted=units)
        self._recv_posted(key).succeed()
        yield self._message(key)
        self.contention[dev.id].hold(posted=-units)
        received.succeed()

    def _recv_posted(self, key: object) -> simpy.Event:
        if key not in self.recv_posted:
            self.recv_posted[key] = self.env.event()
        return self.recv_posted[key]

    def _p2p_stream(self, dev: Device, peer_stage: int) -> Fifo:
        key = (dev.id, peer_stage)
        if key not in self.p2p_stream:
            self.p2p_stream[key] = Fifo(self.env)
        return self.p2p_stream[key]

    def _recv_posts(self, dev: Device,
                    actions: list[Action]) -> dict[int, list[tuple[object, int]]]:
        """Where ``dev`` posts the receive for each message its passes consume, as
        Megatron-LM's interleaved schedule with ``overlap_p2p_comm`` does: action index
        → [(message, peer stage)] posted after that action (−1: before the first).

        Each step posts the receive for the next step's input with its own send: after a
        forward pass, the next forward's activations (``send_forward_recv_forward``); after
        a backward step, the next backward's gradient (``send_backward_recv_backward``).
        The first forward's receive comes before any pass; the first backward's after the
        last warmup forward, the one before the first steady-state step's forward (or,
        when every forward is a warmup one, right before the backward)."""
        work = self.work
        last_vs = work.stages * work.chunks_per_stage - 1
        virtual = [work.chunks[(dev.stage, c)].virtual_stage
                   for c in range(work.chunks_per_stage)]
        stage_of = [work.stage_of(vs) for vs in range(last_vs + 1)]
        posts: dict[int, list[tuple[object, int]]] = defaultdict(list)
        last_f = last_b = -1
        forwards = sum(act.kind == "F" for act in actions)
        backward_step = self.backward_step
        for j, act in enumerate(actions):
            kind = act.kind
            vs = virtual[act.chunk]
            if kind == "F" and vs > 0:
                posts[last_f].append(((dev.pipe, "F", vs, act.microbatch), stage_of[vs - 1]))
            elif kind == "B" and vs < last_vs:
                after = last_b
                if after < 0:
                    warmup_only = sum(a.kind == "F" for a in actions[:j]) == forwards
                    after = j - 1 if warmup_only else j - 2
                posts[after].append(((dev.pipe, "B", vs, act.microbatch), stage_of[vs + 1]))
            if kind == "F":
                last_f = j
            elif kind == backward_step:
                last_b = j
        return posts

    def _gather_messages(self, dev: Device, act: Action, count: int) -> Iterator[simpy.Event]:
        """All-gather ``count`` sliced messages over the TP group before ``act`` runs
        (``parallelism.pp_scatter_gather``: the received one; with DeepSpeed also the
        stage's own output before its backward); the device waits, as Megatron's
        ``gather_split_1d_tensor`` and DeepSpeed's ``PartitionedTensor.full`` make it."""
        start = self.env.now
        yield self.env.timeout(count * self.pp_gather_s)
        self.records.append(Record(dev.id, dev.stage, "pp", "pp_gather", "recv",
                                   act.microbatch, act.chunk, start, self.env.now))
        self.pp_waits.append((dev.id, start, self.env.now, start))

    def _send_s(self, stage: int, to_stage: int, within: bool) -> float:
        """Seconds a pipeline send from ``stage`` to ``to_stage`` takes: priced on the pair's
        cost model (:attr:`pair_costs`, the slower group's path across node groups), once,
        as a pass's message (``pass_comm_s`` where the cost model has it: the jitter's mean
        over the step's micro-batches, :mod:`llmsim.costs.jitter`)."""
        key = (stage, to_stage, within)
        priced = self.pair_send_s.get(key)
        if priced is None:
            costs = self.pair_costs(stage, to_stage)
            price = getattr(costs, "pass_comm_s", costs.comm_s)
            priced = self.pair_send_s[key] = price(self.pp_send_op[within])
        return priced

    @property
    def pp_send_s(self) -> dict[bool, float]:
        """Seconds of a pipeline send between nodes (False) and within one (True) where
        every stage prices alike (the tight loop's, :mod:`~llmsim.engine.uncontended`)."""
        return {within: self._send_s(0, 0, within) for within in (False, True)}

    def _within_node(self, dev: Device, to_stage: int) -> bool:
        """Whether ``dev`` and its pipeline's ``to_stage`` share a node (memoised)."""
        if self.node_of is None:
            return False
        key = (dev.pipe, dev.stage, to_stage)
        within = self._within.get(key)
        if within is None:
            within = self._within[key] = (self.node_of(dev, dev.stage)
                                          == self.node_of(dev, to_stage))
        return within

