"""Interleaved 1F1B (Narayanan et al. 2021 §2.2, Fig. 4 bottom), Megatron-LM's order."""

from __future__ import annotations

from llmsim.errors import UserError
from llmsim.schedules.action import Action, Kind
from llmsim.schedules.registry import register


def interleaved_peak(stages: int, stage: int, microbatches: int, chunks: int) -> int:
    """Warm-up forwards plus the first steady-state forward, Megatron-LM's interleaved
    ``forward_backward_pipelining_with_interleaving``: 2(p−i−1) + (v−1)·p warm-up passes
    (every pass in warm-up when m = p), capped at v·m."""
    total = microbatches * chunks
    if microbatches == stages:
        return total
    return min(2 * (stages - stage - 1) + (chunks - 1) * stages + 1, total)


@register("interleaved-1f1b",
          peak_forwards=interleaved_peak,
          bubble=lambda p, m, v, f, b, w: (p - 1) * (f + b + w) / v)
def interleaved_1f1b(stages: int, microbatches: int, chunks: int) -> list:
    """Interleaved 1F1B (Narayanan et al. 2021 §2.2, Fig. 4 bottom), Megatron-LM's order.

    Work item ``k`` of a stage (``k < v·m``) is micro-batch ``⌊k/(p·v)⌋·p + k mod p`` in
    forward chunk ``⌊(k mod p·v)/p⌋`` (backwards visit the chunks in reverse). Stage ``s``
    runs ``2(p−s−1) + (v−1)·p`` warm-up forwards (all ``v·m`` when ``m = p``), then one
    forward and one backward alternately, then the outstanding backwards — as in
    ``forward_backward_pipelining_with_interleaving`` of Megatron-LM.
    """
    if chunks < 2:
        raise UserError(
            f"chunks (virtual stages): {chunks} with schedule interleaved-1f1b; "
            "set chunks to 2 or more, or use schedule 1f1b"
        )
    if microbatches % stages:
        raise UserError(
            f"microbatches: {microbatches} is not divisible by stages ({stages}), which "
            "interleaved-1f1b needs (Megatron-LM's rule); change the number of micro-batches"
        )
    total = microbatches * chunks
    group = stages * chunks

    def action(stage: int, kind: Kind, k: int) -> Action:
        chunk = (k % group) // stages
        if kind == "B":
            chunk = chunks - 1 - chunk
        return Action(stage, kind, (k // group) * stages + k % stages, chunk)

    schedule: list[list[Action]] = []
    for s in range(stages):
        if microbatches == stages:
            warmup = total
        else:
            warmup = min(2 * (stages - s - 1) + (chunks - 1) * stages, total)
        actions = [action(s, "F", k) for k in range(warmup)]
        for k in range(total):
            if k + warmup < total:
                actions.append(action(s, "F", k + warmup))
            backward = action(s, "B", k)
            actions += [backward, Action(s, "W", backward.microbatch, backward.chunk)]
        schedule.append(actions)
    return schedule
