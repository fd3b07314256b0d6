"""Whether the 124M sweep rows recompute, read from their source's own TFLOPs column
(docs/validation.md, section 8, "The 124M sweep ran without activation checkpointing").

DeepSpeedFugaku prints a throughput that its ``megatron/utils.py`` (commit 8e0eabb)
computes as ``24 · f · B · s · l · h² · (1 + s/6h + V/16lh)`` FLOPs an iteration over the
seconds, with ``f = 4 if args.checkpoint_activations else 3``: the factor is the run's own
flag. ``fugaku_sweep.md`` (Fugaku-LLM/DeepSpeedFugaku, 35c25d4) prints 1.36 and 0.68
TFLOP/s for FUGAKU-DEV-13 and -14; only f = 3 gives them, so the rows ran without
activation checkpointing, as their choice in ``choices.yaml`` now says.
"""

from __future__ import annotations

import pytest

from llmsim import validation as v
from llmsim.validation.scenarios import scenario_for

PRINTED_TFLOPS = {"FUGAKU-DEV-13": 1.36, "FUGAKU-DEV-14": 0.68}
"""The TFLOPs column of fugaku_sweep.md's PyTorch 1.10 table for the two rows."""

PADDED_VOCAB = 50304
"""GPT-2's 50,257 tokens padded to a multiple of 128 (Megatron's default
``--make-vocab-size-divisible-by 128``), the V of the source's formula."""


def source_tflops(run: v.Run, factor: int) -> float:
    """The source's printed throughput of ``run`` with the checkpointing factor given."""
    b, s, layers = int(run.row["global_batch"]), int(run.row["seq_len"]), int(run.row["layers"])
    h = int(run.row["hidden"])
    flops = (24 * factor * b * s * layers * h * h
             * (1 + s / (6 * h) + PADDED_VOCAB / (16 * layers * h)))
    return flops / run.measured / 1e12


@pytest.mark.parametrize("row", sorted(PRINTED_TFLOPS))
def test_the_printed_tflops_are_the_formula_without_checkpointing(row: str) -> None:
    run = next(r for r in v.load_runs("FUGAKU-DEV") if r.id == row)
    assert source_tflops(run, 3) == pytest.approx(PRINTED_TFLOPS[row], abs=0.005)
    assert source_tflops(run, 4) != pytest.approx(PRINTED_TFLOPS[row], abs=0.05)


@pytest.mark.parametrize("row", sorted(PRINTED_TFLOPS))
def test_the_rows_are_simulated_without_recompute(row: str) -> None:
    run = next(r for r in v.load_runs("FUGAKU-DEV") if r.id == row)
    assert scenario_for(run).parallelism.recompute == "none"
