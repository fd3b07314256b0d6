"""PipeDream's weight updates, for the estimator: one after every backward pass.

PipeDream (Narayanan et al. 2019 §3.3; :mod:`llmsim.schedules.pipedream`) updates a
stage's weights after each backward pass and stashes the versions its in-flight
micro-batches' forwards used; a stage replicated over data-parallel ranks first averages
that backward's gradients over its replicas (stage replication, §3.1), which llmsim
prices as the stage's gradient reduction, its tail after the pass as for a step's last
backward (:func:`llmsim.search.pipeline.reduction_tail_s`). In the steady state a stage
thus runs, per micro-batch, its passes ``C_s``, waits the reduction's tail ``t_s`` and
runs its optimizer step ``o_s`` (with ZeRO-1/2, the weight gathers after it) before its
next forward, and the step of ``m`` micro-batches takes ``m·max_s(C_s + t_s + o_s)``
(less the hops, as :func:`~llmsim.search.pipeline.pipeline_runs_s`'s steady state).

The engine's replay of the steady state (:func:`llmsim.steady_state.pipedream_step_s`)
runs the passes only: ``m·max_s C_s`` with the engine's communication. The estimator
reports the rest as the step's reduction share, ``m·max(C + t) − m·max C``, and its
optimizer share, ``m·max(C + t + o) − m·max(C + t)`` (:func:`update_shares_s`), which the
confirmation adds to the replay (:func:`llmsim.search.confirm.steady_state_row`), so both
count one reduction and one update per backward.
"""

from __future__ import annotations

from dataclasses import replace

from llmsim.search.pipeline import Run, pipeline_runs_s


def update_shares_s(runs: list[Run], tails: list[float], updates: list[float], m: int, *,
                    tied_s: float, blocking: bool, zero3: bool,
                    prefetch: bool | str) -> tuple[float, float, float]:
    """(the steady state's passes, the per-backward reductions' share of the step, the
    per-backward updates' share), seconds, for runs of equal stages with, per run, the
    reduction tail ``tails`` and the optimizer step ``updates`` of one backward; the tied
    embedding's all-reduce ``tied_s`` is in the first and the last stage's tail."""
    tails = list(tails)
    tails[0] += tied_s
    tails[-1] += tied_s if len(tails) > 1 else 0.0
    kw = {"blocking": blocking, "posted_singly": False, "zero3": zero3, "prefetch": prefetch}
    passes, _ = pipeline_runs_s("pipedream", runs, m, 1, **kw)
    reduced_runs = [(replace(st, w=st.w + t), n)
                    for (st, n), t in zip(runs, tails, strict=True)]
    reduced, _ = pipeline_runs_s("pipedream", reduced_runs, m, 1, **kw)
    updated_runs = [(replace(st, w=st.w + o), n)
                    for (st, n), o in zip(reduced_runs, updates, strict=True)]
    updated, _ = pipeline_runs_s("pipedream", updated_runs, m, 1, **kw)
    return passes, reduced - passes, updated - reduced
