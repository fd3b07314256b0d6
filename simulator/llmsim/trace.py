"""What the engine records of one step: a row per action, transfer or collective."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

from llmsim.blocks import Block, block_kind


@dataclass(frozen=True, slots=True)
class Record:
    """One entry of the trace: an action, a transfer or a collective on a stream.

    ``kind`` is the pass (``F``, ``B``, ``W``), ``O`` for the optimizer step and what runs
    around it, ``D`` for a gradient bucket's own kernels on the compute stream, or a
    collective's phase (a pipeline send's: ``F`` for activations, ``B`` for gradients)."""

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

    def block_of(self, r: Record) -> Block | None:
        """The ops a compute record of a pass ran (None for any other record)."""
        if r.stream != "compute" or r.kind not in ("F", "B", "W"):
            return None
        kind = block_kind(r.kind, r.microbatch, self.accumulate_from_microbatch)
        return self.blocks[(r.stage, r.chunk, kind)]

    def expand(self) -> Iterator[Record]:
        """Records with each action replaced by its per-op spans."""
        for r in self.records:
            block = self.block_of(r)
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
