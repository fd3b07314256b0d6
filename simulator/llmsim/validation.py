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
"""

from __future__ import annotations

import csv
import itertools
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from llmsim import catalog
from llmsim.errors import UserError
from llmsim.loader import load_scenario, read_yaml
from llmsim.optimizer import grad_bytes_per_param
from llmsim.partition import stage_layers
from llmsim.result import Result
from llmsim.simulation import simulate
from llmsim.specs import Model, Parallelism, Scenario

METRICS = ("iteration_time_s", "tflops_per_gpu", "mfu")
"""Measured metrics the suite compares (``mfu`` in percent, as the sources print it)."""
TARGET_MAPE_PCT = 8.0
"""Accuracy target on the target set: mean absolute percentage error."""
TARGET_WORST_PCT = 20.0
"""Accuracy target on the target set: no row worse than this."""


def validation_dir() -> Path:
    """Folder holding ``runs.csv`` and ``choices.yaml`` (in the catalog, so wheels ship it)."""
    return catalog.catalog_root() / "workloads" / "validation"


@dataclass(frozen=True)
class Choice:
    """A value a source does not state (or states in words), and why it was chosen."""

    value: Any
    why: str


@dataclass(frozen=True)
class Run:
    """One published measurement, its source's row and the values chosen for it."""

    id: str
    source: str
    """Source prefix, e.g. ``NAR21-T1`` (the longest ``sources`` key the id starts with)."""
    row: Mapping[str, str]
    """The published row, as in ``runs.csv``."""
    choices: Mapping[str, Choice]
    target: bool
    """Whether the row belongs to the accuracy target set."""

    @property
    def metric(self) -> str:
        """What was measured: ``iteration_time_s``, ``tflops_per_gpu`` or ``mfu`` (%)."""
        return self.row["measured_metric"]

    @property
    def measured(self) -> float:
        """The published number, in the unit of :attr:`metric`."""
        return float(self.row["measured_value"])

    @property
    def gpus(self) -> int:
        """Devices of the run (A64FX: nodes)."""
        return int(self.row["gpus_total"])

    def value(self, key: str, default: Any = None) -> Any:
        """The chosen value of ``key``, or ``default``."""
        choice = self.choices.get(key)
        return default if choice is None else choice.value


# ---------------------------------------------------------------- loading


def _expand(ids: Iterable[str]) -> set[str]:
    """``["A-01..03", "B-7"]`` → ``{"A-01", "A-02", "A-03", "B-7"}`` (zero padding kept)."""
    out: set[str] = set()
    for item in ids:
        m = re.fullmatch(r"(.*?)(\d+)\.\.(\d+)", item)
        if not m:
            out.add(item)
            continue
        stem, lo, hi = m.group(1), m.group(2), m.group(3)
        out.update(f"{stem}{k:0{len(lo)}d}" for k in range(int(lo), int(hi) + 1))
    return out


def _choices(raw: Mapping[str, Any], where: str) -> dict[str, Choice]:
    out = {}
    for key, item in (raw or {}).items():
        if not isinstance(item, dict) or set(item) != {"value", "why"} or not item["why"]:
            raise UserError(f"{where}: choice {key!r} needs a value and a non-empty why")
        out[key] = Choice(item["value"], str(item["why"]))
    return out


def _read_rows() -> list[dict[str, str]]:
    with (validation_dir() / "runs.csv").open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def load_runs(subset: str | None = None, option: str = "--subset") -> list[Run]:
    """The validation rows (those whose id starts with ``subset``, if given); ``option``
    names the command-line option that gave ``subset`` when none matches."""
    spec = read_yaml(validation_dir() / "choices.yaml")
    sources: dict[str, Any] = spec["sources"]
    runs = []
    for row in _read_rows():
        rid = row["id"]
        if subset and not rid.startswith(subset):
            continue
        prefixes = [p for p in sources if rid.startswith(p)]
        if not prefixes:
            raise UserError(f"validation row {rid}: no source in choices.yaml; add its prefix")
        source = max(prefixes, key=len)
        choices = _choices(sources[source].get("choices"), source)
        target = bool(sources[source].get("target", False))
        for i, group in enumerate(spec.get("groups", [])):
            hit = (
                rid.startswith(group["match"])
                if "match" in group
                else (rid in _expand(group.get("ids", [])))
            )
            if hit:
                choices |= _choices(group.get("choices"), f"groups[{i}]")
                target = bool(group.get("target", target))
        runs.append(Run(rid, source, row, choices, target))
    if subset and not runs:
        known = sorted(spec["sources"])
        raise UserError(
            f"{option} {subset!r} matches no validation row; use a prefix such as "
            f"{', '.join(known)}"
        )
    return runs


# ---------------------------------------------------------------- scenario


def _int(text: str) -> int | None:
    m = re.match(r"\s*(\d+)", text or "")
    return int(m.group(1)) if m else None


def base_vocab(run: Run) -> int:
    """The vocabulary before padding: the row's (``32K`` = 32·``vocab_k``) or the chosen one."""
    text = run.row["vocab"].strip()
    m = re.fullmatch(r"(\d+)K", text)
    if m:
        return int(m.group(1)) * int(run.value("vocab_k"))
    return _int(text) or int(run.value("model.vocab"))


def padded_vocab(vocab: int, multiple: int, tp: int) -> int:
    """Megatron-LM's padding: up to a multiple of ``multiple·tp``.

    ``_vocab_size_with_padding`` (megatron/tokenizer), ``--make-vocab-size-divisible-by``
    (default 128): e.g. GPT-2's 50,257 → 51,200 at tp 8, BLOOM's 250,680 → 250,880 at tp 4.
    """
    step = multiple * tp
    return -(-vocab // step) * step


def _system(run: Run) -> tuple[str | dict[str, Any], int]:
    """The catalog system (or an inline copy for part of a node or more nodes), and its
    devices per node."""
    name = run.value("system")
    nodes = run.value("system.nodes")
    raw = read_yaml(catalog.path_of("systems", name))
    dpn = int(raw["node"]["devices_per_node"])
    if run.gpus >= dpn and nodes is None:
        return name, dpn
    if nodes is not None:
        raw["nodes"] = nodes
    if run.gpus < dpn:
        # A few devices of an all-to-all switched node (NVSwitch) see the same per-device
        # bandwidth as the whole node: keep the tiers below the group, cut the next at it.
        tiers = raw["node"]["fabric"]
        kept = [t for t in tiers if t["devices"] < run.gpus]
        wider = next(t for t in tiers if t["devices"] >= run.gpus)
        raw["node"]["fabric"] = [*kept, {**wider, "devices": run.gpus}] if run.gpus > 1 else []
        raw["node"]["devices_per_node"] = dpn = run.gpus
    return raw, dpn


def _resolve(run: Run, key: str, value: Any, model: dict[str, Any], dp: int, precision: str) -> Any:
    """Turn the special values of choices.yaml into numbers."""
    if key == "parallelism.virtual_stages" and value == "one-layer-per-chunk":
        edges = {k: run.value(f"parallelism.{k}")
                 for k in ("first_stage_layers", "last_stage_layers")}
        return max(stage_layers(model["layers"], Parallelism(pp=int(run.row["pp"]), **edges)))
    if key == "parallelism.dp_bucket_mb" and value == "megatron-core":
        return max(40_000_000, 1_000_000 * dp) * 4 / 1e6
    if key == "parallelism.dp_bucket_mb" and value == "one-buffer":
        # One reduction of the device's whole gradient buffer: its parameters' share.
        per_device = Model.model_validate(model).params / (int(run.row["tp"]) * int(run.row["pp"]))
        grad_bytes = grad_bytes_per_param(precision, run.value("parallelism.grad_reduce_dtype"))
        return math.ceil(per_device * grad_bytes / 1e6)
    return value


def scenario_mapping(run: Run) -> dict[str, Any]:
    """The scenario of ``run`` as a mapping (inline model, system name or inline system)."""
    row = run.row
    tp, pp, dp = int(row["tp"]), int(row["pp"]), int(row["dp"])
    seq = int(row["seq_len"])
    model: dict[str, Any] = {
        "name": run.id.lower(),
        "description": row["model_name"],
        "layers": int(run.value("model.layers", row["layers"])),
        "hidden": int(row["hidden"]),
        "heads": int(row["heads"]),
        "kv_heads": _int(row["kv_heads"]) or int(row["heads"]),
        "ffn_hidden": int(row["ffn_hidden"]),
        "vocab": padded_vocab(base_vocab(run), int(run.value("vocab_pad_multiple")), tp),
        "max_seq_len": seq,
    }
    micro = _int(row["micro_batch"]) or run.value("parallelism.micro_batch")
    if micro is None:
        raise UserError(
            f"validation row {run.id}: micro_batch is neither stated nor chosen; "
            "add parallelism.micro_batch to choices.yaml"
        )
    par: dict[str, Any] = {"tp": tp, "pp": pp, "dp": dp, "micro_batch": int(micro)}
    training: dict[str, Any] = {"global_batch": int(row["global_batch"]), "seq_len": seq}
    parts = {"model": model, "parallelism": par, "training": training}
    precision = run.value("training.precision")
    # Model fields first: the special values of the others are derived from the model.
    for key, choice in sorted(run.choices.items(), key=lambda kv: not kv[0].startswith("model")):
        section, _, field = key.partition(".")
        if section in parts and key not in ("model.layers", "model.vocab"):
            parts[section][field] = _resolve(run, key, choice.value, model, dp, precision)
    system, per_node = _system(run)
    return {
        "name": run.id,
        "description": f"{run.source}: {row['model_name']} on {run.gpus} devices",
        "system": system,
        "nodes": math.ceil(run.gpus / per_node),
        **parts,
    }


def scenario_for(run: Run) -> Scenario:
    """The validated llmsim scenario of ``run``."""
    return load_scenario(scenario_mapping(run))


# ---------------------------------------------------------------- prediction


def narayanan_flops(
    batch: int, seq: int, layers: int, hidden: int, vocab: int, recompute: bool
) -> float:
    """FLOPs per iteration as Narayanan et al. 2021 count them (SC21, eq. 3).

    With full recomputation F = 96·B·s·l·h²·(1 + s/6h + V/16lh); without, the forward is
    counted once: 72·B·s·l·h²·(1 + s/6h + V/12lh).
    """
    b, s, n, h, v = batch, seq, layers, hidden, vocab
    if recompute:
        return 96.0 * b * s * n * h * h * (1 + s / (6 * h) + v / (16 * n * h))
    return 72.0 * b * s * n * h * h * (1 + s / (6 * h) + v / (12 * n * h))


def source_flops(run: Run, result: Result) -> float:
    """FLOPs of one step as ``run``'s source counts them (the source's own layer count)."""
    convention = run.value("flops_convention")
    if convention == "model":
        return result.model_flops_per_step
    row, model = run.row, result.scenario.model
    return narayanan_flops(
        int(row["global_batch"]),
        int(row["seq_len"]),
        int(row["layers"]),
        model.hidden,
        model.vocab,
        recompute=convention == "narayanan96",
    )


def predicted_metric(run: Run, result: Result) -> float:
    """llmsim's prediction of ``run.metric``, in the source's convention and unit."""
    if run.metric == "iteration_time_s":
        return result.step_time_s
    per_gpu = source_flops(run, result) / result.step_time_s / run.gpus
    if run.metric == "tflops_per_gpu":
        return per_gpu / 1e12
    if run.metric == "mfu":
        return 100.0 * per_gpu / (float(run.value("peak_tflops")) * 1e12)
    raise UserError(
        f"validation row {run.id}: unknown metric {run.metric!r}; use one of {', '.join(METRICS)}"
    )


@dataclass(frozen=True)
class Prediction:
    """One row compared: measured vs predicted, and the simulation behind it."""

    run: Run
    result: Result
    predicted: float

    @property
    def error_pct(self) -> float:
        """Signed error, (predicted − measured) / measured · 100."""
        return (self.predicted - self.run.measured) / self.run.measured * 100.0


def predict(run: Run) -> Prediction:
    """Simulate ``run`` and express the prediction as its source measured it."""
    result = simulate(scenario_for(run))
    return Prediction(run, result, predicted_metric(run, result))


def _record(p: Prediction) -> dict[str, Any]:
    s, r = p.result.scenario, p.result
    return {
        "id": p.run.id,
        "source": p.run.source,
        "metric": p.run.metric,
        "measured": p.run.measured,
        "predicted": p.predicted,
        "error_pct": p.error_pct,
        "target": p.run.target,
        "step_time_s": r.step_time_s,
        "mfu": r.mfu,
        "fits": r.fits,
        "config": f"{p.run.row['model_name']} B={s.training.global_batch}",
        "model": p.run.row["model_name"],
        "microbatches": s.micro_batches,
        "schedule": s.parallelism.schedule,
        **{f"{k}_s": v for k, v in r.breakdown_s.items()},
    }


def validate(runs: Iterable[Run], progress: bool = True) -> pd.DataFrame:
    """Predict every run; one row each: id, source, metric, measured, predicted, error_pct …

    Extra columns: ``target``, the predicted step time, MFU and memory fit, the
    ``config`` (model and batch), ``model``, ``microbatches`` (per pipeline) and
    ``schedule`` keys and the critical stage's breakdown (``compute_s`` …).
    """
    runs = list(runs)
    if not progress:
        return pd.DataFrame([_record(predict(r)) for r in runs])
    from llmsim.progress import track

    return pd.DataFrame([_record(predict(run))
                         for run in track(runs, "validating", label=lambda r: r.id)])


def _stats(group: str, df: pd.DataFrame) -> dict[str, Any]:
    err = df["error_pct"]
    worst = err.abs().idxmax()
    return {
        "group": group,
        "rows": len(df),
        "mape_pct": err.abs().mean(),
        "median_abs_pct": err.abs().median(),
        "bias_pct": err.mean(),
        "worst_id": df.loc[worst, "id"],
        "worst_error_pct": err[worst],
    }


def summary(df: pd.DataFrame) -> pd.DataFrame:
    """Per source, the target set and all rows: MAPE, median |error|, mean error, worst row."""
    rows = [_stats(src, part) for src, part in df.groupby("source", sort=False)]
    if df["target"].any():
        rows.append(_stats("target set", df[df["target"]]))
    rows.append(_stats("all", df))
    return pd.DataFrame(rows)


def schedule_ranking(df: pd.DataFrame, source: str = "ZB24", tie_pct: float = 1.0) -> pd.DataFrame:
    """Per (model, batch) configuration, the schedules ordered by step time (fastest
    first), measured and predicted, and whether llmsim reproduces the measured order.

    Two measured times closer than ``tie_pct`` % are a tie that any predicted order
    matches: the ZB24 times are derived from 3-significant-figure throughputs (±0.5 %
    each, hence 1 %).
    """
    part = df[(df["source"] == source) & (df["metric"] == "iteration_time_s")]
    rows = []
    for config, g in part.groupby("config", sort=False):
        if g["schedule"].nunique() < 2:
            continue
        m = dict(zip(g["schedule"], g["measured"], strict=True))
        p = dict(zip(g["schedule"], g["predicted"], strict=True))
        ties, same = [], True
        for a, b in itertools.combinations(sorted(m), 2):
            if abs(m[a] - m[b]) < tie_pct / 100 * min(m[a], m[b]):
                ties.append(f"{a} ≈ {b}")
            elif (m[a] < m[b]) != (p[a] < p[b]):
                same = False
        rows.append(
            {
                "config": config,
                "measured_order": " < ".join(sorted(m, key=m.get)),
                "predicted_order": " < ".join(sorted(p, key=p.get)),
                "ties": ", ".join(ties),
                "same": same,
            }
        )
    return pd.DataFrame(rows)


def marginal_costs(df: pd.DataFrame, source: str = "ZB24") -> pd.DataFrame:
    """Cost of one more micro-batch per (model, schedule), measured and predicted, ms.

    Of each model and schedule's two rows with the most micro-batches per pipeline, the
    difference of the step times over the difference of the micro-batch counts: the
    steady-state period of the slowest stage, free of the warmup and cooldown that both
    steps share.
    """
    part = df[(df["source"] == source) & (df["metric"] == "iteration_time_s")]
    rows = []
    for (model, schedule), g in part.groupby(["model", "schedule"], sort=False):
        if g["microbatches"].nunique() < 2:
            continue
        lo, hi = (r for _, r in g.nlargest(2, "microbatches").sort_values("microbatches")
                  .iterrows())
        extra = hi["microbatches"] - lo["microbatches"]
        rows.append({
            "model": model,
            "schedule": schedule,
            "microbatches": f"{lo['microbatches']} → {hi['microbatches']}",
            "measured_ms": (hi["measured"] - lo["measured"]) / extra * 1e3,
            "predicted_ms": (hi["predicted"] - lo["predicted"]) / extra * 1e3,
        })
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class AccuracyGoal:
    """The three parts of the accuracy goal, judged on the target rows of a frame."""

    rows: int
    """Target rows judged."""
    mape_pct: float
    """Their mean absolute percentage error."""
    rows_over: tuple[tuple[str, float], ...]
    """(id, signed error %) of the rows worse than :data:`TARGET_WORST_PCT`, worst first."""
    orders_reproduced: int
    """Zero Bubble configurations whose measured schedule order llmsim reproduces."""
    orders: int
    """Zero Bubble configurations judged (0 when the frame has none)."""

    @property
    def mape_met(self) -> bool:
        return self.mape_pct <= TARGET_MAPE_PCT

    @property
    def worst_met(self) -> bool:
        return not self.rows_over

    @property
    def orders_met(self) -> bool:
        """Every configuration's order reproduced (true where none is judged)."""
        return self.orders_reproduced == self.orders

    @property
    def met(self) -> bool:
        return self.mape_met and self.worst_met and self.orders_met

    def parts(self) -> list[tuple[str, str, str]]:
        """(part of the goal, result, "yes" / "no" / "n/a") for each part, as the tables
        print them; the schedule order is "n/a" where the rows hold no Zero Bubble
        configuration."""
        over = ", ".join(f"{rid} ({error:+.1f} %)" for rid, error in self.rows_over)
        orders = (f"{self.orders_reproduced} of {self.orders}" if self.orders
                  else "no Zero Bubble configuration in these rows")

        def status(met: bool) -> str:
            return "yes" if met else "no"

        return [
            (f"target-set MAPE ≤ {TARGET_MAPE_PCT:g} %",
             f"{self.mape_pct:.2f} % over {self.rows} rows", status(self.mape_met)),
            (f"no row worse than {TARGET_WORST_PCT:g} %",
             f"{len(self.rows_over)} rows worse" + (f": {over}" if over else ""),
             status(self.worst_met)),
            ("the Zero Bubble schedule order per configuration", orders,
             status(self.orders_met) if self.orders else "n/a"),
        ]


def accuracy_goal(df: pd.DataFrame) -> AccuracyGoal | None:
    """The accuracy goal on the frame's target rows (``None`` if it has none): MAPE ≤
    :data:`TARGET_MAPE_PCT`, no row worse than :data:`TARGET_WORST_PCT`, and every
    Zero Bubble configuration's schedule order reproduced (:func:`schedule_ranking`)."""
    target = df[df["target"]]
    if target.empty:
        return None
    size = target["error_pct"].abs()
    over = target.loc[size[size > TARGET_WORST_PCT].sort_values(ascending=False).index]
    ranking = schedule_ranking(target)
    return AccuracyGoal(
        rows=len(target),
        mape_pct=float(size.mean()),
        rows_over=tuple(zip(over["id"], over["error_pct"], strict=True)),
        orders_reproduced=int(ranking["same"].sum()) if not ranking.empty else 0,
        orders=len(ranking),
    )


QUANTITY_UNITS = {"iteration_time_s": "s/iteration", "tflops_per_gpu": "TFLOP/s/GPU",
                  "mfu": "MFU %"}
"""How each metric is labelled in tables."""
_BREAKDOWN = ("compute_s", "tp_comm_s", "pp_comm_s", "dp_comm_s", "bubble_s", "optimizer_s")


def _sig(x: float, digits: int = 4) -> str:
    return "0" if abs(x) < 1e-9 else f"{x:.{digits}g}"


def markdown_tables(df: pd.DataFrame) -> str:
    """The accuracy goal, the summary per source, the ZB24 schedule order and cost of one
    more micro-batch, and every row as Markdown tables (``docs/validation.md`` shows
    these, as ``llmsim validate --out DIR`` writes them)."""
    parts: list[str] = []
    goal = accuracy_goal(df)
    if goal is not None:
        parts += [f"## Accuracy goal: {'met' if goal.met else 'not met'}", "",
                  "| part of the goal | result | met |", "|---|---|:-:|"]
        parts += [f"| {part} | {result} | {'**no**' if met == 'no' else met} |"
                  for part, result, met in goal.parts()]
        parts.append("")
    parts += ["## Summary per source", "",
              "| source | rows | MAPE % | median abs % | mean (bias) % | worst row | worst % |",
              "|---|---:|---:|---:|---:|---|---:|"]
    for s in summary(df).itertuples():
        name = f"**{s.group}**" if s.group in ("target set", "all") else s.group
        parts.append(f"| {name} | {s.rows} | {s.mape_pct:.1f} | {s.median_abs_pct:.1f} | "
                     f"{s.bias_pct:+.1f} | {s.worst_id} | {s.worst_error_pct:+.1f} |")
    ranking = schedule_ranking(df)
    if not ranking.empty:
        parts += ["", f"## ZB24 schedule order: {int(ranking['same'].sum())} of {len(ranking)} "
                  "reproduced", "",
                  "| configuration | measured (fastest first) | llmsim | reproduced |",
                  "|---|---|---|:-:|"]
        for r in ranking.itertuples():
            measured = r.measured_order + (f" ({r.ties}, within 1 %)" if r.ties else "")
            same = "**no**" if not r.same else (
                "yes (tie)" if r.measured_order != r.predicted_order else "yes")
            parts.append(f"| {r.config} | {measured} | {r.predicted_order} | {same} |")
    costs = marginal_costs(df)
    if not costs.empty:
        parts += ["", "## ZB24: cost of one more micro-batch", "",
                  "| model | schedule | micro-batches | measured ms | llmsim ms |",
                  "|---|---|---|---:|---:|"]
        parts += [f"| {c.model} | {c.schedule} | {c.microbatches} | {c.measured_ms:.2f} | "
                  f"{c.predicted_ms:.2f} |" for c in costs.itertuples()]
    parts += ["", "## Every row", "",
              "| id | target | quantity | measured | llmsim | error % | llmsim step s | "
              "critical-stage breakdown s (compute / TP / PP / DP / bubble / optimizer) |",
              "|---|:-:|---|---:|---:|---:|---:|---|"]
    for r in df.itertuples():
        breakdown = " / ".join(_sig(getattr(r, c), 3) for c in _BREAKDOWN)
        parts.append(f"| {r.id} | {'yes' if r.target else ''} | {QUANTITY_UNITS[r.metric]} | "
                     f"{_sig(r.measured)} | {_sig(r.predicted)} | {r.error_pct:+.1f} | "
                     f"{_sig(r.step_time_s)} | {breakdown} |")
    return "\n".join(parts) + "\n"


def plot_validation(df: pd.DataFrame, path: str | Path) -> Path:
    """Predicted vs measured, one log-log panel per metric, y = x and a ±10 % band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.ticker import FormatStrFormatter, LogLocator, NullFormatter

    metrics = [m for m in METRICS if (df["metric"] == m).any()]
    fig, axes = plt.subplots(1, len(metrics), figsize=(5.2 * len(metrics), 4.8), squeeze=False)
    colours = dict(zip(df["source"].unique(), plt.get_cmap("tab10").colors, strict=False))
    units = {
        "iteration_time_s": "iteration time, s",
        "tflops_per_gpu": "TFLOP/s per GPU",
        "mfu": "MFU, %",
    }
    for ax, metric in zip(axes[0], metrics, strict=True):
        part = df[df["metric"] == metric]
        lo = min(part["measured"].min(), part["predicted"].min()) / 1.3
        hi = max(part["measured"].max(), part["predicted"].max()) * 1.3
        x = np.geomspace(lo, hi, 50)
        ax.fill_between(x, 0.9 * x, 1.1 * x, color="0.85", label="±10 %")
        ax.plot(x, x, color="0.3", lw=1, label="y = x")
        for src, g in part.groupby("source", sort=False):
            ax.scatter(g["measured"], g["predicted"], s=18, color=colours[src], label=src)
        ax.set(
            xscale="log",
            yscale="log",
            xlim=(lo, hi),
            ylim=(lo, hi),
            xlabel=f"measured {units[metric]}",
            ylabel=f"llmsim {units[metric]}",
        )
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_locator(LogLocator(subs=(1.0,) if hi / lo > 300 else (1.0, 2.0, 5.0)))
            axis.set_major_formatter(FormatStrFormatter("%g"))
            axis.set_minor_formatter(NullFormatter())
        ax.legend(fontsize=7, loc="upper left")
    fig.suptitle("llmsim vs published measurements")
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
