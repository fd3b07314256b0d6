"""PipeDream's asynchronous 1F1B with weight stashing (Narayanan et al. 2019 §3)."""

from __future__ import annotations

from llmsim.schedules.orders import one_f_one_b_order, require_one_chunk, with_weight_passes
from llmsim.schedules.registry import register


@register("pipedream",
          peak_forwards=lambda p, i, m, v: p - i,
          bubble=lambda p, m, v, f, b, w: 0.0,
          weight_versions=lambda p, i, m: p - i,
          replayed=False)
def pipedream(stages: int, microbatches: int, chunks: int) -> list:
    """PipeDream 1F1B without a flush (Narayanan et al. 2019 §3.2–3.3).

    Stage i admits p − i micro-batches (the number of optimal active mini-batches of a
    straight pipeline, §3.2), then alternates one forward and one backward for ever;
    each backward updates the stage's weights at once. The pipeline fills once per
    training run, not once per step, so in the steady state a stage is never idle with
    equal stages: m micro-batches take m·(t_F + t_B + t_W), and unequal stages run at
    the slowest one's pace. Weight stashing (§3.3) keeps the weight version each
    in-flight micro-batch's forward used for its backward: in the steady state stage i
    holds p − i versions of its weights (one per micro-batch in flight, the live one
    among them) and as many activation sets, whatever the micro-batches per step, as
    the micro-batches of consecutive steps overlap.

    One step's order is 1F1B's; the steady state is that order for a run of steps
    with no flush between them.
    """
    require_one_chunk("pipedream", chunks)
    return [
        with_weight_passes(s, one_f_one_b_order(stages, microbatches, s), lag=0)
        for s in range(stages)
    ]
