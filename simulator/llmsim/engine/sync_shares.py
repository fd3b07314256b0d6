"""Where a gathered pass's layers reach their first device-wide host sync.

A ZeRO-3 pass runs layer by layer, each layer a part of its block (the block split evenly,
:meth:`~llmsim.engine.gathers.WeightGathers._gathered_units`); a ``torch.cuda.synchronize()``
inside a layer (:attr:`llmsim.ops.ComputeOp.device_sync`) waits for the next layer's gather
then in flight (:meth:`~llmsim.engine.gathers.WeightGathers._gathered_pass`). This module
says how far into its part a layer's first such sync is, as a share of the part: the time
of the layer's own ops before the sync, read from the block's spans, where the layers
repeat the same ops (the embedding and LM head before and after them do not), and not the
place the even split would give the sync (which drifts by the embedding's and head's time
spread over the layers). A backward's block holds its recompute (phase R)
ops first and its backward ops after (:attr:`llmsim.workload.Chunk.backward`): a layer's
recompute and its backward are measured apart and put together as the engine lays out
its parts (one part a layer, or the recompute and the backward each a part with
``regather_for_recompute``).
"""

from __future__ import annotations

from llmsim.blocks import Block


def _layer(block: Block, layers: int, recompute: bool) -> tuple[float, float | None]:
    """One layer's ops of one phase group (recompute, or the rest) in ``block``: (their
    time a layer, s: the group's spans over ``layers``; the time from the layer's first op
    to its first device-wide sync, s, or None without one)."""
    spans = block.spans
    group = [i for i, span in enumerate(spans) if (span.phase == "R") == recompute]
    layer_s = sum(spans[i].duration_s for i in group) / layers
    syncs = [i for i in block.device_syncs if (spans[i].phase == "R") == recompute]
    if not syncs:
        return layer_s, None
    first = group[0]
    if len(syncs) < 2:  # one layer: from the group's first op
        return layer_s, spans[syncs[0]].offset_s - spans[first].offset_s
    # the second layer's sync, from that layer's first op of the group: the layers' ops
    # repeat every ``period`` spans and the ops before them (the embedding, the LM head's
    # backward) do not, so the first layer begins at the earliest span of the group back
    # from its sync that the span a period later repeats (at most a period back; where a
    # layer's recompute and backward ops alternate, the other group's ops end the walk)
    period = syncs[1] - syncs[0]
    start = syncs[0]
    while start - 1 >= first and syncs[0] - (start - 1) < period \
            and (spans[start - 1].phase == "R") == recompute \
            and spans[start - 1].name == spans[start - 1 + period].name:
        start -= 1
    return layer_s, spans[syncs[1]].offset_s - spans[start + period].offset_s


def sync_shares(block: Block, layers: int, parts: int) -> list[float | None]:
    """For each of a gathered pass's ``parts`` (``layers`` of them, or twice that when the
    backward gathers for its recompute too), the share of the part before the layer's
    first device-wide host sync; None where its layer has none (or the block has no
    device-wide sync)."""
    if not block.device_syncs:
        return [None] * parts
    rest_s, rest_sync = _layer(block, layers, recompute=False)
    recompute_s, recompute_sync = _layer(block, layers, recompute=True)
    if parts == layers:  # a whole layer a part: its recompute ops, then the rest
        whole_s = recompute_s + rest_s
        if recompute_sync is not None:
            share = recompute_sync / whole_s
        elif rest_sync is not None:
            share = (recompute_s + rest_sync) / whole_s
        else:
            share = None
        return [share] * parts
    recompute_share = None if recompute_sync is None else recompute_sync / recompute_s
    rest_share = None if rest_sync is None else rest_sync / rest_s
    return [recompute_share, rest_share] * layers
