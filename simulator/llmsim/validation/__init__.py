"""Validation against published, measured training runs (design §10).

``workloads/validation/runs.csv`` holds the published rows llmsim can express (copied with
their sources from ``shared/validation``); ``workloads/validation/choices.yaml`` holds every
value a source leaves open, with the reason for the choice. A measured number is never an
input of the prediction it is compared with.

Each row is compared in its source's own convention (``flops_convention``):

* ``iteration_time_s``: the predicted step time, directly;
* ``tflops_per_gpu`` / ``mfu``: FLOPs per step over the *predicted* time, counted as the
  source counts them — ``narayanan96`` is eq. 3 of Narayanan et al. 2021,
  F = 96·B·s·l·h²·(1 + s/6h + V/16lh) (it includes the recompute forward pass);
  ``narayanan72`` the same without recomputation, 72·B·s·l·h²·(1 + s/6h + V/12lh);
  ``model`` llmsim's model FLOPs (:attr:`llmsim.Result.model_flops_per_step`), which for a
  GPT equal Megatron-Core's ``num_floating_point_operations``.

The parts: :mod:`~llmsim.validation.runs` (the rows and choices),
:mod:`~llmsim.validation.scenarios` (a row as a scenario),
:mod:`~llmsim.validation.predictions` (simulated and compared) and
:mod:`~llmsim.validation.reports` (summaries, the accuracy goal, tables and plot).
"""

from llmsim.validation.predictions import (
    Prediction,
    narayanan_flops,
    predict,
    predicted_metric,
    source_flops,
    validate,
)
from llmsim.validation.reports import (
    QUANTITY_UNITS,
    TARGET_MAPE_PCT,
    TARGET_WORST_PCT,
    AccuracyGoal,
    accuracy_goal,
    marginal_costs,
    markdown_tables,
    plot_validation,
    schedule_ranking,
    summary,
    summary_by_machine,
)
from llmsim.validation.runs import (
    METRICS,
    Choice,
    Run,
    load_runs,
    validation_dir,
)
from llmsim.validation.scenarios import (
    base_vocab,
    padded_vocab,
    scenario_for,
    scenario_mapping,
)

__all__ = [
    "METRICS",
    "QUANTITY_UNITS",
    "TARGET_MAPE_PCT",
    "TARGET_WORST_PCT",
    "AccuracyGoal",
    "Choice",
    "Prediction",
    "Run",
    "accuracy_goal",
    "base_vocab",
    "load_runs",
    "marginal_costs",
    "markdown_tables",
    "narayanan_flops",
    "padded_vocab",
    "plot_validation",
    "predict",
    "predicted_metric",
    "scenario_for",
    "scenario_mapping",
    "schedule_ranking",
    "source_flops",
    "summary",
    "summary_by_machine",
    "validate",
    "validation_dir",
]
