"""What the engine records of one step: a row per action, transfer or collective."""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from operator import itemgetter
from typing import NamedTuple

import numpy as np

from llmsim.blocks import Block, block_kind


class Record(NamedTuple):
    """One entry of the trace: an action, a transfer or a collective on a stream.

    ``kind`` is the pass (``F``, ``B``, ``W``), ``O`` for the optimizer step and what runs
    around it, ``D`` for a gradient bucket's own kernels on the compute stream, or a
    collective's phase (a pipeline send's: ``F`` for activations, ``B`` for gradients).
    A frozen row, a named tuple: a step records hundreds of thousands of them in full
    fidelity, and a tuple is made four times faster than a frozen dataclass."""

    device: int
    stage: int
    stream: str
    name: str
    kind: str
    microbatch: int
    chunk: int
    start_s: float
    end_s: float
    block_from_s: float = 0.0
    """For a compute record that runs only part of its block (a pass interrupted
    while a layer's weights arrive, or by a gradient bucket's kernels): where in the block
    it starts, seconds."""
    block_to_s: float = math.inf
    """… and where it ends (``inf``: the rest of the block)."""

    def block_share(self, block: Block) -> float:
        """Fraction of ``block``'s duration this record runs."""
        if block.duration_s <= 0:
            return 1.0
        return (min(self.block_to_s, block.duration_s) - self.block_from_s) / block.duration_s

    def slowed_s(self, block: Block) -> float:
        """Time this record ran beyond its share of ``block``: its compute slowed by the
        compute units a data-parallel collective or a posted pipeline send or receive
        held meanwhile (rounding noise of the clock counts as none)."""
        share_s = block.duration_s * self.block_share(block)
        excess = self.end_s - self.start_s - share_s
        return excess if excess > 1e-9 * share_s else 0.0

    def stretch(self, block: Block) -> float:
        """Wall time of this record over its share of ``block``'s time (1: not slowed)."""
        share_s = block.duration_s * self.block_share(block)
        return 1.0 + self.slowed_s(block) / share_s if share_s > 0 else 1.0


PASSES = frozenset(("F", "B", "W"))
"""The kinds of a pass's compute record, the records that run a block of ops."""


by_device_start_stream = itemgetter(0, 7, 2)
"""Sort key of the trace's records: (device, start_s, stream)."""


@dataclass
class Trace:
    """Everything the engine recorded, with the block templates to expand actions."""

    records: list[Record]
    blocks: dict[tuple[int, int, str], Block]
    """(stage, chunk, kind) → the pass's ops; see :func:`block_kind`."""
    stage_last_compute_s: dict[int, float]
    stage_dp_done_s: dict[int, float]
    optimizer_start_s: float
    step_end_s: float
    pp_waits: list[tuple[int, float, float, float]] = field(default_factory=list)
    """(device, wait start, wait end, transfer start) for every wait on a pipeline message."""
    dp_waits: list[tuple[int, float, float]] = field(default_factory=list)
    """(device, wait start, wait end) for every wait on a weight gather (ZeRO-3, or
    ZeRO-1/2 with ``overlap_param_gather``)."""
    pp_slowed_s: dict[int, float] = field(default_factory=dict)
    """Device → the time its passes ran slower while its posted pipeline sends and
    receives held compute units (part of the records' :meth:`Record.slowed_s`)."""

    accumulate_from_microbatch: int = 0
    replicas: dict[int, tuple[int, ...]] = field(default_factory=dict)
    """Device → the ids of the devices it stands for, its own first: full fidelity
    simulates one device of each group of provably identical ones
    (:func:`llmsim.engine.devices.fold_identical_tp_ranks`) and records only it; empty
    where every simulated device stands for itself alone."""

    pass_kinds: dict[tuple[int, str, int, int], str] = field(default_factory=dict)
    """(stage, kind, micro-batch, chunk) → the block kind of a pass run in an overlapped
    pair (:mod:`llmsim.engine.pairs`); empty where no pass is."""

    def devices(self) -> list[int]:
        """Every device of the step the records stand for, in order."""
        if self.replicas:
            return sorted(d for ids in self.replicas.values() for d in ids)
        return sorted({r.device for r in self.records})

    def block_of(self, r: Record) -> Block | None:
        """The ops a compute record of a pass ran (None for any other record)."""
        return self.block_finder()(r)

    def block_finder(self) -> Callable[[Record], Block | None]:
        """:meth:`block_of` as a function, its lookup (:meth:`pass_block`) taken once: for
        a loop over many records."""
        pass_block = self.pass_block()

        def block_of(r: Record) -> Block | None:
            if r.stream != "compute" or r.kind not in PASSES:
                return None
            return pass_block(r.stage, r.kind, r.microbatch, r.chunk)
        return block_of

    def pass_block(self) -> Callable[[int, str, int, int], Block]:
        """The function (stage, kind, micro-batch, chunk) of a pass → the ops its compute
        records ran: the kind of a pass run in an overlapped pair (``pass_kinds``) or
        :func:`block_kind`'s key. :meth:`block_of`'s lookup, which a loop over a step's
        10⁴–10⁵ records takes once and calls per record (with neither pairs nor passes
        before ``accumulate_from_microbatch``, a pass's block is its kind's)."""
        blocks, pass_kinds = self.blocks, self.pass_kinds
        accumulate_from = self.accumulate_from_microbatch
        if not pass_kinds and accumulate_from <= 0:
            def plain(stage: int, kind: str, microbatch: int, chunk: int) -> Block:
                return blocks[(stage, chunk, kind)]
            return plain

        def lookup(stage: int, kind: str, microbatch: int, chunk: int) -> Block:
            paired = pass_kinds.get((stage, kind, microbatch, chunk)) if pass_kinds else None
            return blocks[(stage, chunk, paired or block_kind(kind, microbatch, accumulate_from))]
        return lookup

    def shown(self, limit: int) -> Iterable[Record]:
        """What a trace file or a timeline shows: the per-op records (:meth:`expand`)
        when there are at most ``limit`` of them; otherwise every run of up to ``k``
        consecutive ops of one device and stream that share their kind, micro-batch and
        chunk becomes one record from the first op's start to the last one's end, named
        after the first with ``(+n)`` for the others, ``k`` the factor that brings the
        count near ``limit``. Every stream keeps its activity (TP communication, the MoE
        all-to-alls and the CP ring included)."""
        per_op = self.op_count()
        if per_op <= limit:
            return self.expand()
        return merged_runs(self.expand(), -(-per_op // limit))

    def op_count(self) -> int:
        """How many records :meth:`expand` gives: each action's per-op spans, one for a
        record without a block."""
        return sum(1 if block is None else len(block.spans)
                   for block in map(self.block_finder(), self.records))

    def expand(self) -> Iterator[Record]:
        """Records with each action replaced by its per-op spans."""
        block_of = self.block_finder()
        for r in self.records:
            block = block_of(r)
            if block is None:
                yield r
                continue
            stretch = r.stretch(block)
            for s in block.spans:
                if not r.block_from_s <= s.offset_s < r.block_to_s:
                    continue
                start = r.start_s + (s.offset_s - r.block_from_s) * stretch
                # The blocking collectives inside a pass run on the TP stream; the MoE
                # all-to-alls (ep) and the context-parallel ring (cp) keep their names.
                stream = s.stream if s.stream in ("compute", "ep", "cp") else "tp"
                yield Record(r.device, r.stage, stream,
                             s.name, s.phase, r.microbatch, r.chunk, start,
                             start + s.duration_s * stretch)

    def expand_columns(self) -> dict[str, np.ndarray]:
        """The rows of :meth:`expand` as columns, one numpy array per :class:`Record`
        field, with the same values computed a column at a time: a record's spans are a
        slice of its block's (those whose offset lies in ``[block_from_s, block_to_s)``),
        laid out once per block."""
        first: dict[int, int] = {}  # id(block) → index of its first span in the table
        names: list[str] = []
        streams: list[str] = []
        phases: list[str] = []
        offsets: list[float] = []
        durations: list[float] = []
        rec_of: list[int] = []  # per row: the record it comes from
        span_of: list[int] = []  # per row: its span in the table, −1 for a record's own row
        stretch = [1.0] * len(self.records)
        block_of = self.block_finder()
        for i, r in enumerate(self.records):
            block = block_of(r)
            if block is None:
                rec_of.append(i)
                span_of.append(-1)
                continue
            base = first.get(id(block))
            if base is None:
                base = first[id(block)] = len(offsets)
                for sp in block.spans:
                    names.append(sp.name)
                    streams.append("compute" if sp.stream == "compute" else "tp")
                    phases.append(sp.phase)
                    offsets.append(sp.offset_s)
                    durations.append(sp.duration_s)
            own = offsets[base:base + len(block.spans)]
            lo, hi = bisect_left(own, r.block_from_s), bisect_left(own, r.block_to_s)
            rec_of.extend([i] * (hi - lo))
            span_of.extend(range(base + lo, base + hi))
            stretch[i] = r.stretch(block)
        rec = np.array(rec_of, dtype=np.int64)
        span = np.array(span_of, dtype=np.int64)
        mine = span < 0  # a record's own row
        at = np.where(mine, 0, span)

        def field_of(name: str, dtype: type) -> np.ndarray:
            return np.array([getattr(r, name) for r in self.records], dtype=dtype)[rec]

        def of_span(values: list, dtype: type) -> np.ndarray:
            return np.array(values or [None], dtype=dtype)[at]

        scale = np.array(stretch)[rec]
        start = field_of("start_s", float)
        span_start = start + (of_span(offsets, float) - field_of("block_from_s", float)) * scale
        span_end = span_start + of_span(durations, float) * scale
        return {
            "device": field_of("device", int),
            "stage": field_of("stage", int),
            "stream": np.where(mine, field_of("stream", object), of_span(streams, object)),
            "name": np.where(mine, field_of("name", object), of_span(names, object)),
            "kind": np.where(mine, field_of("kind", object), of_span(phases, object)),
            "microbatch": field_of("microbatch", int),
            "chunk": field_of("chunk", int),
            "start_s": np.where(mine, start, span_start),
            "end_s": np.where(mine, field_of("end_s", float), span_end),
            "block_from_s": np.where(mine, field_of("block_from_s", float), 0.0),
            "block_to_s": np.where(mine, field_of("block_to_s", float), math.inf),
        }


def merged_runs(records: Iterable[Record], k: int) -> Iterable[Record]:
    """Runs of up to ``k`` adjacent records of one (device, stream) and kind, micro-batch
    and chunk, each as one record spanning them."""
    runs: dict[tuple[int, str], list[Record]] = {}

    def joined(run: list[Record]) -> Record:
        first = run[0]
        name = first.name if len(run) == 1 else f"{first.name} (+{len(run) - 1})"
        return Record(first.device, first.stage, first.stream, name, first.kind,
                      first.microbatch, first.chunk, min(r.start_s for r in run),
                      max(r.end_s for r in run))

    for r in records:
        key = (r.device, r.stream)
        run = runs.get(key)
        if run and (len(run) == k or (r.kind, r.microbatch, r.chunk) != (
                run[0].kind, run[0].microbatch, run[0].chunk)):
            yield joined(run)
            run = None
        if run:
            run.append(r)
        else:
            runs[key] = [r]
    for run in runs.values():
        yield joined(run)
