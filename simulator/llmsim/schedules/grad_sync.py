"""Where Megatron-Core issues whole chunks' gradient reductions on a pipeline."""

from __future__ import annotations

from llmsim.schedules.action import Action


def aligned_grad_syncs(actions: list[Action], stage: int, stages: int, chunks: int,
                       microbatches: int) -> dict[int, list[int]] | None:
    """Where Megatron-Core issues each chunk's whole gradient reduction on a pipeline
    with ``grad_sync_func`` (``--delay-grad-reduce``, on by default from Megatron-LM's
    commit 299d8a5 of September 2023; ``--align-grad-reduce`` from August 2024):
    index of the action of ``stage`` after which it is issued → chunks, in order.
    None: the stage issues each bucket as the backward makes it final (its hooks).

    Interleaved (``forward_backward_pipelining_with_interleaving``): after backward step
    ``k`` of a stage, the chunk whose last micro-batch was backward step ``k − stage``;
    the chunks left when the backward steps run out after the last one, by chunk id, so
    that all stages issue a chunk's reduction about together. 1F1B
    (``forward_backward_pipelining_without_interleaving``): the first stage through its
    hooks in its last backward, the others after their last backward ("during pipeline
    bubble"). A backward step (fused, as in both) ends with its ``W`` pass. Without a
    pipeline the hooks issue every bucket.
    """
    if stages == 1 or (chunks == 1 and stage == 0):
        return None
    ends = [i for i, a in enumerate(actions) if a.kind == "W"]
    if chunks == 1:
        return {ends[-1]: [0]}
    last = {a.chunk: step for step, i in enumerate(ends)
            if (a := actions[i]).microbatch == microbatches - 1}
    out: dict[int, list[int]] = {}
    for chunk in sorted(last, key=lambda c: last[c]):
        if last[chunk] + stage < len(ends):
            out.setdefault(ends[last[chunk] + stage], []).append(chunk)
    issued = {c for chunks_at in out.values() for c in chunks_at}
    out.setdefault(ends[-1], []).extend(c for c in range(chunks) if c not in issued)
    return out

