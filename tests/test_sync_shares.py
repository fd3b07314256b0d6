"""A device-wide host sync (``torch.cuda.synchronize()``) waits for the weight gathers in
flight (llmsim.engine.sync_shares, WeightGathers._gathered_pass): where a gathered pass's
layers reach their first such sync, and what the engine makes of it on DistFlashAttn's
one-box rows (DFA24, docs/validation.md section 10)."""

from __future__ import annotations

from itertools import pairwise

import pytest

from llmsim import validation as v
from llmsim.blocks import Block, OpSpan
from llmsim.engine import uncontended
from llmsim.engine.sync_shares import sync_shares
from llmsim.simulation import build_engine

RUNS = {r.id: r for r in v.load_runs() if r.id.startswith("DFA24")}


def _block(layout: list[tuple[str, str, float, bool]]) -> Block:
    """A block of (name, phase, seconds, device-wide sync) ops laid end to end."""
    spans, syncs, t = [], [], 0.0
    for name, phase, duration_s, sync in layout:
        if sync:
            syncs.append(len(spans))
        spans.append(OpSpan(name, "compute", phase, t, duration_s))
        t += duration_s
    return Block(tuple(spans), t, t, 0.0, device_syncs=tuple(syncs))


def test_a_forward_layer_reaches_its_sync_after_its_own_ops_before_attention():
    """Embedding 1 s, three layers of norm 1 + QKV 2 + attention (synced) 3 + MLP 4, head
    5 s: each of the 12 s parts (the block split evenly) reaches its sync 3 s in, the time
    of a layer's own ops before its attention (not where the even split would put the
    attention: 4, 2 and 0 s in, the embedding's and head's time spread over the layers)."""
    layer = [("ln", "F", 1.0, False), ("qkv", "F", 2.0, False), ("attn", "F", 3.0, True),
             ("mlp", "F", 4.0, False)]
    block = _block([("embed", "F", 1.0, False), *layer * 3, ("head", "F", 5.0, False)])
    assert sync_shares(block, 3, 3) == pytest.approx([3 / 12] * 3)


def test_a_backward_s_recompute_and_backward_parts_reach_their_own_syncs():
    """The backward's block holds the recompute ops first (norm 1, attention forward synced
    2, MLP 1: 4 s a layer), then the backward's (MLP 3, attention synced 5, norm 1: 9 s),
    between the head's backward (2 s) and the embedding's (1 s): parts of 4 s and 10.5 s
    (the group's time over the layers). Regathered, the recompute part syncs 1 s in and
    the backward part 3 s in; one part a layer (14.5 s), 1 s in; without a sync in the
    recompute (DistFlashAttn's checkpointing keeps the attention), 4 + 3 s in."""
    def layers(recompute_sync: bool) -> list[tuple[str, str, float, bool]]:
        r = [("ln", "R", 1.0, False), ("attn", "R", 2.0, recompute_sync),
             ("mlp", "R", 1.0, False)]
        b = [("mlp_b", "B", 3.0, False), ("attn_b", "B", 5.0, True), ("ln_b", "B", 1.0, False)]
        return [("head_b", "B", 2.0, False), *r * 2, *b * 2, ("embed_b", "B", 1.0, False)]
    assert sync_shares(_block(layers(True)), 2, 4) == pytest.approx([1 / 4, 3 / 10.5] * 2)
    assert sync_shares(_block(layers(True)), 2, 2) == pytest.approx([1 / 14.5] * 2)
    assert sync_shares(_block(layers(False)), 2, 4) == [None, pytest.approx(3 / 10.5)] * 2
    assert sync_shares(_block(layers(False)), 2, 2) == pytest.approx([7 / 14.5] * 2)


def test_a_layer_s_backward_sync_is_timed_from_its_own_backward_ops():
    """The engine's backward block alternates each layer's recompute (norm 1, MLP 1 s; no
    attention: DistFlashAttn's checkpointing keeps it) and its backward (MLP 3, attention
    synced 5, norm 1 s), between the head's backward (2 s) and the embedding's (1 s).
    Regathered, the backward part (10.5 s, the group's time over the layers) reaches its
    sync 3 s in, from the layer's first backward op, not from its recompute's first op
    (5 s in: the recompute's ops repeat a period later too, and were walked into); one
    part a layer (12.5 s): the recompute, then 3 s."""
    r = [("ln", "R", 1.0, False), ("mlp", "R", 1.0, False)]
    b = [("mlp_b", "B", 3.0, False), ("attn_b", "B", 5.0, True), ("ln_b", "B", 1.0, False)]
    block = _block([("head_b", "B", 2.0, False), *(r + b) * 2, ("embed_b", "B", 1.0, False)])
    assert sync_shares(block, 2, 4) == [None, pytest.approx(3 / 10.5)] * 2
    assert sync_shares(block, 2, 2) == pytest.approx([5 / 12.5] * 2)


def test_a_block_without_a_device_wide_sync_has_no_share():
    block = _block([("ln", "F", 1.0, False), ("attn", "F", 2.0, False)])
    assert sync_shares(block, 1, 1) == [None]


def test_distflash_rows_run_on_simpy_where_their_syncs_meet_fsdp_s_gathers():
    """The tight and contended loops do not model a sync's wait for the dp stream: a row
    with both goes to SimPy, which does."""
    sc = v.scenario_for(RUNS["DFA24-13"])
    engine = build_engine(sc, None)
    assert engine.device_syncs_beside_gathers
    assert uncontended.simpy_reason(engine) == "device-wide host syncs beside weight gathers"


def _forward_waits(row: str) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """Device 0's waits inside its forward pass (compute idle between two of its parts)
    and its weight gathers, as (start, end) s."""
    records = v.predict(RUNS[row]).result.trace.records
    forward = sorted((r for r in records if r.device == 0 and r.stream == "compute"
                      and r.name == "F0"), key=lambda r: r.start_s)
    waits = [(a.end_s, b.start_s) for a, b in pairwise(forward)
             if b.start_s > a.end_s]
    gathers = [(r.start_s, r.end_s) for r in records
               if r.device == 0 and r.stream == "dp" and r.name.startswith("z3_ag")]
    return waits, gathers


def test_at_1k_tokens_each_layer_s_sync_waits_for_the_next_layer_s_gather():
    """DFA24-13 (1K tokens a GPU): a layer's kernels before its attention (about 0.8 ms)
    are shorter than the next layer's gather (404.8 MB, 1.6 ms), issued at the layer's
    start: the attention's first sync waits for it, once a layer but the last (layer 0's
    sync waits for layer 1's gather, issued with layer 0's own at the pass's start, so its
    wait is longer; the last layer's sync finds nothing in flight, the backward's first
    gather being its recompute's, issued when the recompute is reached under FSDP1's
    reentrant checkpointing, ``prefetch_recompute_gather`` false), and each wait ends as a
    gather ends."""
    waits, gathers = _forward_waits("DFA24-13")
    ends = {end for _, end in gathers}
    assert len(waits) == 31
    assert all(end in ends for _, end in waits)
    later = [end - start for start, end in waits[1:]]
    assert max(later) - min(later) < 1e-9
    assert 0.5e-3 < later[0] < 1.6e-3


@pytest.mark.parametrize("row", ["DFA24-16", "DFA24-01"])
def test_at_8k_tokens_a_layer_s_kernels_before_its_attention_hide_the_gather(row):
    """At 8K tokens a GPU the QKV projections alone outlast the gather: no forward wait."""
    waits, _ = _forward_waits(row)
    assert waits == []
