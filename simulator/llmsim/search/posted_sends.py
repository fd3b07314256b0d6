"""The chain of posted pipeline sends an interleaved pipeline's fill and drain wait for.

Megatron-LM's overlapped interleaved schedule posts each pipeline send and receive on
its own (the engine's ``rendezvous``, :meth:`llmsim.engine.Engine._recv_posts`): a
forward step posts the receive of the next forward's input with its own send, and
each forward step waits for the previous forward step's send to complete (each
backward step for the previous backward's). So the first micro-batch's forward crosses
all ``v·p`` virtual stages one pass and one send after another before the first
backward can start, and the last micro-batch's backward crosses them back: ``v·p − 1``
sends each way, not the ``p − 1`` of a pipeline whose sends are batched. Each stage
contributes its sends of one micro-batch (``StageTimes.sends_f``, ``sends_b``: one per
virtual stage it holds, but for the last virtual stage's forward and the first one's
backward), so the two chains are the sums of those over the stages
(:func:`chain_hops_s`).

Measured on the engine (``MLPERF-v3.0-CoreWeave-n3584``: tp 4, pp 8, v 12, 24
micro-batches; with no compute units held by collectives or posted operations and no
overlapped weight gather, so that only the pipeline's own timing differs): estimator
over engine 0.970 with one send per stage boundary each way, 0.994 with the chains.
The stage's sends are counted, not scaled.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llmsim.search.pipeline import StageTimes


def chain_hops_s(runs: Iterable[tuple[StageTimes, int]]) -> float:
    """Seconds of the sends the first micro-batch's forward chain and the last
    micro-batch's backward chain wait for where sends are posted one by one: every
    stage's forward and backward sends of one micro-batch, over runs of ``n`` equal
    stages, ``Σ (sends_f + sends_b)·n``."""
    return sum((st.sends_f + st.sends_b) * n for st, n in runs)
