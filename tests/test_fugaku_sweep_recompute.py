"""Whether the 124M sweep's runs recompute, read from their source's own TFLOPs column
(docs/validation.md, section 8, "The 124M sweep's recompute, run by run").

DeepSpeedFugaku prints a throughput that its ``megatron/utils.py`` (commit 8e0eabb)
computes as ``24 · f · B · s · l · h² · (1 + s/6h + V/16lh)`` FLOPs an iteration over the
seconds, with ``f = 4 if args.checkpoint_activations else 3``: the factor is the run's own
flag. ``fugaku_sweep.md`` (Fugaku-LLM/DeepSpeedFugaku, 35c25d4) prints, for its PyTorch 1.7
and 1.10 one-node runs, values only f = 3 gives (no checkpointing: FUGAKU-DEV-10 … -14 and
the tuned runs that set and check ``gemm.framework_share``); ``check_tcmalloc.md`` prints,
for its "\\w Activation Checkpointing" runs (FUGAKU-DEV-8, -9), values only f = 4 gives.
``choices.yaml`` says so row by row.
"""

from __future__ import annotations

import pytest

from llmsim import validation as v
from llmsim.validation.scenarios import scenario_for

PRINTED_TFLOPS = {
    "FUGAKU-DEV-8": 1.09,   # check_tcmalloc.md, tcmalloc, PyTorch 1.10, 1,020.3 s
    "FUGAKU-DEV-9": 0.84,   # check_tcmalloc.md, glibc, PyTorch 1.10, 1,321.5 s
    "FUGAKU-DEV-10": 0.56,  # fugaku_sweep.md, PyTorch 1.7, one process, 1,489.7 s
    "FUGAKU-DEV-11": 1.16,  # PyTorch 1.7, one process per CMG, 721.7 s
    "FUGAKU-DEV-12": 0.86,  # PyTorch 1.7, one process, tcmalloc, 976.2 s
    "FUGAKU-DEV-13": 1.36,  # PyTorch 1.10, one process per CMG, DP 4, 613.2 s
    "FUGAKU-DEV-14": 0.68,  # PyTorch 1.10, one process per CMG, TP 4, 1,233.7 s
}
"""The TFLOPs column of the rows' tables."""

CHECKPOINTED = {"FUGAKU-DEV-8", "FUGAKU-DEV-9"}
"""The rows whose table is headed '\\w Activation Checkpointing' (check_tcmalloc.md)."""

NON_ROW_RUNS = {
    # fugaku_sweep.md's one-node runs of the 124M model that are not rows, TP 1:
    # (seconds an iteration, printed TFLOP/s)
    "1.7, one process per CMG, 2.2 GHz, tcmalloc, retention_state=0 (sets the share)":
        (522.7, 1.60),
    "1.7, one process, 2.2 GHz, tcmalloc, retention_state=0 (checks the share)": (827.2, 1.01),
    "1.7, one process, retention_state=0": (1401.1, 0.60),
    "1.7, one process, 2.2 GHz": (1261.2, 0.66),
    "1.10, one process per CMG, 2.2 GHz, tcmalloc, retention_state=0": (363.6, 2.28),
}
"""The sweep's runs the catalog's share is set from or checked against, and the power-knob
runs of tests/test_fugaku_power_knobs.py (363.6 is marked '^', estimated from one CMG)."""

GPT2_VOCAB = 50257
"""GPT-2's tokens, before Megatron pads them."""


def padded_vocab(tp: int) -> int:
    """The V of the source's formula (``args.padded_vocab_size``): GPT-2's vocabulary padded
    to a multiple of 128 × TP (``_vocab_size_with_padding`` in DeepSpeedFugaku's
    ``megatron/tokenizer/tokenizer.py``, default ``--make-vocab-size-divisible-by 128``)."""
    multiple = 128 * tp
    return -(-GPT2_VOCAB // multiple) * multiple


def formula_flops(b: int, s: int, layers: int, h: int, tp: int, factor: int) -> float:
    """The FLOPs of one iteration in the source's throughput formula."""
    vocab = padded_vocab(tp)
    return 24 * factor * b * s * layers * h * h * (1 + s / (6 * h) + vocab / (16 * layers * h))


def source_tflops(run: v.Run, factor: int) -> float:
    """The source's printed throughput of ``run`` with the checkpointing factor given."""
    flops = formula_flops(int(run.row["global_batch"]), int(run.row["seq_len"]),
                          int(run.row["layers"]), int(run.row["hidden"]),
                          int(run.row["tp"]), factor)
    return flops / run.measured / 1e12


def row(row_id: str) -> v.Run:
    return next(r for r in v.load_runs("FUGAKU-DEV") if r.id == row_id)


def test_the_vocabulary_is_padded_as_megatron_pads_it() -> None:
    assert (padded_vocab(1), padded_vocab(4)) == (50304, 50688)


def test_the_formula_gives_the_1_3b_tables_checkpointed_throughput() -> None:
    """The formula with f = 4 gives the 0.99 TFLOP/s printed for FUGAKU-DEV-6, whose table
    is headed '\\w activation checkpointing' (f = 3 would print 0.74)."""
    assert source_tflops(row("FUGAKU-DEV-6"), 4) == pytest.approx(0.99, abs=0.005)
    assert source_tflops(row("FUGAKU-DEV-6"), 3) == pytest.approx(0.74, abs=0.005)


@pytest.mark.parametrize("row_id", sorted(PRINTED_TFLOPS))
def test_the_printed_tflops_name_each_rows_checkpointing(row_id: str) -> None:
    factor, other = (4, 3) if row_id in CHECKPOINTED else (3, 4)
    run = row(row_id)
    assert source_tflops(run, factor) == pytest.approx(PRINTED_TFLOPS[row_id], abs=0.005)
    assert source_tflops(run, other) != pytest.approx(PRINTED_TFLOPS[row_id], abs=0.05)


@pytest.mark.parametrize("row_id", sorted(PRINTED_TFLOPS))
def test_the_rows_are_simulated_with_the_recompute_their_tflops_show(row_id: str) -> None:
    expected = "full" if row_id in CHECKPOINTED else "none"
    assert scenario_for(row(row_id)).parallelism.recompute == expected


@pytest.mark.parametrize("name", sorted(NON_ROW_RUNS))
def test_the_sweeps_other_one_node_runs_ran_without_checkpointing(name: str) -> None:
    """The runs that set and check ``gemm.framework_share`` (522.7 and 827.2 s) are modelled
    through FUGAKU-DEV-11 and -12's scenarios (tests/test_fugaku_power_knobs.step_s), so
    they take the rows' ``recompute: none``; 363.6 s (per-CMG estimate) within 0.02."""
    seconds, printed = NON_ROW_RUNS[name]
    per_step = {f: formula_flops(1024, 1024, 12, 768, 1, f) / seconds / 1e12 for f in (3, 4)}
    assert per_step[3] == pytest.approx(printed, abs=0.02)
    assert per_step[4] != pytest.approx(printed, abs=0.15)
