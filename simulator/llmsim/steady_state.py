"""PipeDream's steady state: the step time of asynchronous 1F1B with no flush between
steps (Narayanan et al. 2019 §3.2), replayed by the engine.

PipeDream admits ``p − i`` micro-batches on stage ``i`` once per training run, then each
stage alternates one forward and one backward for ever (:mod:`llmsim.schedules.pipedream`);
its order over several steps is 1F1B's over all their micro-batches. The engine replays
one step that ends with the optimizer, so :func:`pipedream_step_s` replays a run of
``steps`` steps as one 1F1B pipeline of ``steps·m`` micro-batches (PipeDream's order) and
measures the spacing of the steps' ends in its middle, where the fill is past and the
drain not begun.
"""

from __future__ import annotations

from llmsim.blocks import CostModel
from llmsim.errors import UserError
from llmsim.simulation import build_engine
from llmsim.specs import Scenario


def pipedream_step_s(scenario: Scenario, costs: CostModel | None = None,
                     steps: int = 3) -> float:
    """Seconds per step of ``scenario``'s layout under PipeDream in the steady state: the
    time between the ends of two consecutive steps' last backward on the first stage,
    in the middle of a replayed run of ``steps`` steps (≥ 3) without a flush.

    Each stage's passes are the engine's, priced by ``costs`` (the hardware's by default),
    with the pipeline messages and the order of every micro-batch; with equal stages and
    free communication it is ``m·(t_F + t_B + t_W)`` (no bubble, the registry's closed
    form), and unequal stages run at the slowest one's pace. Not included: the weight
    updates, which PipeDream makes after every backward on each stage (weight stashing,
    §3.3), and any data-parallel gradient reduction — the figure is the pipeline's
    throughput, the part the schedule decides.
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 3:
        raise UserError(f"steps: {steps!r} is not allowed; give a whole number ≥ 3 (one step "
                        "on each side of the one measured)")
    par, trn = scenario.parallelism, scenario.training
    m = scenario.micro_batches
    if par.pp < 2 or m < par.pp:
        raise UserError(
            f"parallelism.pp, micro-batches: {par.pp}, {m}; PipeDream's steady state needs "
            "a pipeline (pp ≥ 2) and at least pp micro-batches per step; change them")
    run = scenario.model_copy(update={
        "parallelism": par.model_copy(update={"schedule": "1f1b", "virtual_stages": 1}),
        "training": trn.model_copy(update={"global_batch": trn.global_batch * steps}),
    })
    trace = build_engine(run, costs).run()
    ends: dict[int, float] = {}  # micro-batch → end of its weight pass on stage 0
    for r in trace.records:
        if r.stream == "compute" and r.stage == 0 and r.kind == "W":
            ends[r.microbatch] = max(r.end_s, ends.get(r.microbatch, r.end_s))
    middle = steps // 2
    return ends[(middle + 1) * m - 1] - ends[middle * m - 1]
