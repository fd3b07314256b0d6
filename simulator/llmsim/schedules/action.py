"""A pipeline action: one pass of one micro-batch through one model chunk on one stage."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["F", "B", "W"]


@dataclass(frozen=True, slots=True)
class Action:
    """One pass of one micro-batch through one model chunk on one pipeline stage.

    ``F`` is the forward, ``B`` the backward for the input gradient, ``W`` the backward
    for the weight gradient. Stage ``s`` holds chunks ``0..v-1``; which virtual stage
    chunk ``c`` of stage ``s`` is, the schedule's route says
    (:mod:`llmsim.schedules.route`): ``c·p + s`` for the looping placement of Narayanan
    et al. 2021 §2.2.
    """

    stage: int
    kind: Kind
    microbatch: int
    chunk: int = 0

    def __str__(self) -> str:
        """Compact form as in torchtitan: ``2F0`` = stage 2, forward, micro-batch 0.

        A chunk other than 0 is appended (``2F0c1``); :func:`format_grid` also shows
        chunk 0 when the schedule has several chunks.
        """
        suffix = f"c{self.chunk}" if self.chunk else ""
        return f"{self.stage}{self.kind}{self.microbatch}{suffix}"

    def cell(self, show_chunk: bool) -> str:
        """The action without its stage (``F3``, ``B3c1``), for a per-stage grid row."""
        suffix = f"c{self.chunk}" if show_chunk else ""
        return f"{self.kind}{self.microbatch}{suffix}"
