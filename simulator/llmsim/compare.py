"""Several results side by side: one row per result, the figures a comparison needs.

>>> from llmsim import load_scenario, simulate
>>> from llmsim.compare import compare
>>> runs = {"1f1b": simulate(load_scenario("selene-gpt3")),
...         "interleaved": simulate(load_scenario("selene-gpt3", [
...             "parallelism.schedule=interleaved-1f1b", "parallelism.virtual_stages=4"]))}
>>> compare(runs)[["step_time_s", "mfu", "days_to_train"]]  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from llmsim.result import Result

BREAKDOWN = ("compute", "tp_comm", "pp_comm", "dp_comm", "bubble", "optimizer")
"""Parts of the critical stage's step time, as in ``Result.breakdown_s``."""


def row(label: str, result: Result) -> dict[str, object]:
    """One result's figures: layout, step time and its breakdown (seconds), throughput,
    MFU, the most memory any stage needs (GB) and whether every stage fits, days."""
    s, par = result.scenario, result.scenario.parallelism
    worst = max(result.memory, key=lambda m: m.total_bytes)
    return {
        "label": label,
        "scenario": s.name,
        "model": s.model.name,
        "system": s.system.name,
        "devices": result.devices,
        "layout": f"tp {par.tp} · pp {par.pp} · dp {s.dp}, {par.schedule}"
                  + (f" v{par.virtual_stages}" if par.virtual_stages > 1 else "")
                  + f", mb {par.micro_batch} × {s.micro_batches}, ZeRO-{par.zero}",
        "step_time_s": result.step_time_s,
        **{f"{part}_s": t for part, t in result.breakdown_s.items()},
        "tokens_per_s": result.tokens_per_s,
        "mfu": result.mfu,
        "bubble_fraction": result.bubble_fraction,
        "memory_gb": worst.total_bytes / 1e9,
        "capacity_gb": worst.capacity_bytes / 1e9,
        "fits": result.fits,
        "days_to_train": result.days_to_train,
    }


def compare(results: Mapping[str, Result]) -> pd.DataFrame:
    """Label → result, as a DataFrame with one row per result (columns as :func:`row`)."""
    return pd.DataFrame([row(label, r) for label, r in results.items()])
