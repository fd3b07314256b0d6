"""The context-parallel schedules by ``parallelism.cp_schedule``: how each builds a block's
attention ops and how much of its exchange the attention kernel leaves exposed."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from llmsim.context import apply_context_parallel, ring_exposed_s
from llmsim.context_distflash import apply_distflash, distflash_exposed_s

if TYPE_CHECKING:
    from llmsim.workload import LayerBuilder, Op

Apply = Callable[[tuple[list["Op"], ...], "LayerBuilder"], tuple[list["Op"], ...]]

APPLY: dict[str, Apply] = {"te_ring": apply_context_parallel, "distflash": apply_distflash}
"""Each schedule's rewrite of a block's op lists (:func:`llmsim.context.apply_context_parallel`,
:func:`llmsim.context_distflash.apply_distflash`)."""

EXPOSED: dict[str, Callable[[float, float, int], float]] = {
    "te_ring": ring_exposed_s, "distflash": distflash_exposed_s}
"""Each schedule's exposed exchange: (one step's transfer, the attention kernel, steps) →
seconds the exchange adds to the kernel."""
