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

GPT2_VOCAB = 50257
"""GPT-2's tokens, before Megatron pads them."""


def padded_vocab(tp: int) -> int:
    """The V of the source's formula (``args.padded_vocab_size``): GPT-2's vocabulary padded
    to a multiple of 128 × TP (``_vocab_size_with_padding`` in DeepSpeedFugaku's
    ``megatron/tokenizer/tokenizer.py``, default ``--make-vocab-size-divisible-by 128``)."""
    multiple = 128 * tp
    return -(-GPT2_VOCAB // multiple) * multiple


def source_tflops(run: v.Run, factor: int) -> float:
    """The source's printed throughput of ``run`` with the checkpointing factor given."""
    b, s, layers = int(run.row["global_batch"]), int(run.row["seq_len"]), int(run.row["layers"])
    h, vocab = int(run.row["hidden"]), padded_vocab(int(run.row["tp"]))
    flops = (24 * factor * b * s * layers * h * h
             * (1 + s / (6 * h) + vocab / (16 * layers * h)))
    return flops / run.measured / 1e12


def test_the_vocabulary_is_padded_as_megatron_pads_it() -> None:
    assert (padded_vocab(1), padded_vocab(4)) == (50304, 50688)


@pytest.mark.parametrize("row", sorted(PRINTED_TFLOPS))
def test_the_printed_tflops_are_the_formula_without_checkpointing(row: str) -> None:
    run = next(r for r in v.load_runs("FUGAKU-DEV") if r.id == row)
    assert source_tflops(run, 3) == pytest.approx(PRINTED_TFLOPS[row], abs=0.005)
    assert source_tflops(run, 4) != pytest.approx(PRINTED_TFLOPS[row], abs=0.05)


@pytest.mark.parametrize("row", sorted(PRINTED_TFLOPS))
def test_the_rows_are_simulated_without_recompute(row: str) -> None:
    run = next(r for r in v.load_runs("FUGAKU-DEV") if r.id == row)
    assert scenario_for(run).parallelism.recompute == "none"
