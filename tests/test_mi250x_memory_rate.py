"""The memory-bound rate of the LUMI23 rows' software, from the same authors' A/B of
Megatron's fused kernels (docs/validation.md §8, "The LUMI23 rows' memory-bound kernels").

spyysalo/lumi-llm-scaling's README ("Impact of fused kernels", figures/kernels.png,
committed 2023-05-29 when the repository's one Megatron-DeepSpeed script was
meg-ds/pretrain_33B_8_node.sh: 33B, TP 2, PP 4, DP 8, MBS 2, GBS 512 on 8 LUMI-G nodes)
gives TFLOPs per GCD with every fused kernel and with each switched off. Only the masked
softmax moves the step: without it the TurkuNLP fork (6732bc9,
``megatron/model/fused_softmax.py``) runs ``forward_torch_softmax``, PyTorch 1.13's own
kernels, in FP32 (``apply_query_key_layer_scaling``, the default, forces
``softmax_in_fp32`` and a scale). The bytes those kernels move beyond the fused one's, over
the time the step grew by, are the rate PyTorch-ROCm's memory-bound kernels reached on a
GCD inside that training run; the LUMI23 rows take it (choices.yaml,
``system_set.node.accelerator.memory_bound_fraction``).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from helpers import load_script

from llmsim.errors import UserError
from llmsim.loader import load_spec
from llmsim.validation import load_runs, scenario_for
from llmsim.validation.runs import Choice

# Bar ends of figures/kernels.png, read from its pixels: the 60 and 70 TFLOPs grid lines
# at x = 1449.5 and 1593.5 (14.4 px a TFLOP, zero at 585.5), bars ending at 1518.5 (every
# kernel) and 1360.5 (--no-masked-softmax-fusion, and every kernel off), ±0.5 px.
FUSED_TFLOPS = (1518.5 - 585.5) / 14.4
UNFUSED_TFLOPS = (1360.5 - 585.5) / 14.4

# The figure's run: pretrain_33B_8_node.sh at 2023-05-29 (commit 1c9547d of the repository).
LAYERS, HIDDEN, HEADS, SEQ = 60, 6656, 52, 2048
TP, PP, DP, MBS, GBS, GPUS = 2, 4, 8, 2, 512, 64
VOCAB = 50432  # GPT-2's 50,257 padded to a multiple of 128·tp
MICROBATCHES = GBS // (MBS * DP)

# Bytes per score element the unfused path moves beyond the fused kernel (read 2, write 2
# forward; read 2 + 2, write 2 backward), each tensor read and written once (llmsim's
# count): forward input.float() 2+4, input * scale 4+4, masked_fill_ 4+4 (the cached
# s×s bool mask stays in the 8 MB L2), softmax 4+4, .bfloat16() 4+2; backward the
# cast's gradient 2+4, softmax backward 4+4+4, masked_fill's 4+4, the scale's 4+4, the
# float cast's 4+2.
EXTRA_FORWARD_BYTES = (6 + 8 + 8 + 8 + 6) - 4
EXTRA_BACKWARD_BYTES = (6 + 12 + 8 + 8 + 6) - 6
EXTRA_LAUNCHES = 4  # five kernels for one, each way


def megatron_ds_step_s(tflops: float) -> float:
    """The step whose Megatron-DeepSpeed TFLOPs figure is ``tflops`` (the fork's
    ``training.py``: Narayanan et al. 2021 eq. 3 with the factor 4 of full recompute)."""
    flops = (24 * 4 * GBS * SEQ * LAYERS * HIDDEN**2
             * (1 + SEQ / (6 * HIDDEN) + VOCAB / (16 * LAYERS * HIDDEN)))
    return flops / (tflops * 1e12 * GPUS)


def derived_fraction(fused_tflops: float = FUSED_TFLOPS,
                     unfused_tflops: float = UNFUSED_TFLOPS) -> float:
    """Fraction of the GCD's HBM peak the unfused softmax's kernels ran at."""
    gcd = load_spec("accelerators", "mi250x-gcd")
    delta_s = megatron_ds_step_s(unfused_tflops) - megatron_ds_step_s(fused_tflops)
    per_microbatch_s = delta_s / (MICROBATCHES + PP - 1)  # 1F1B: every slot of every stage
    layers = LAYERS // PP
    elements = MBS * HEADS // TP * SEQ**2
    extra_bytes = layers * elements * (2 * EXTRA_FORWARD_BYTES + EXTRA_BACKWARD_BYTES)
    launches_s = layers * 3 * EXTRA_LAUNCHES * gcd.kernel_launch_us * 1e-6
    return extra_bytes / (gcd.hbm_tbps * 1e12 * (per_microbatch_s - launches_s))


def test_the_figure_s_bars_are_its_runs() -> None:
    """Every kernel at 64.79 TFLOPs is 68.3 s a step of 512 sequences, 7.49 samples/s, in
    the spread of the README's 7.8 ± 0.5 for the same script that day; the masked softmax
    off costs 13.9 s."""
    assert pytest.approx(64.79, abs=0.01) == FUSED_TFLOPS
    assert pytest.approx(53.82, abs=0.01) == UNFUSED_TFLOPS
    assert GBS / megatron_ds_step_s(FUSED_TFLOPS) == pytest.approx(7.49, abs=0.01)
    delta = megatron_ds_step_s(UNFUSED_TFLOPS) - megatron_ds_step_s(FUSED_TFLOPS)
    assert delta == pytest.approx(13.93, abs=0.01)


def test_the_rows_take_the_derived_fraction() -> None:
    """0.505 of 1.6 TB/s, rounded to 0.50 in choices.yaml; reading each bar half a pixel
    the other way moves it by less than 0.01."""
    fraction = derived_fraction()
    assert fraction == pytest.approx(0.505, abs=0.002)
    half_pixel = 0.5 / 14.4
    for f, u in ((half_pixel, -half_pixel), (-half_pixel, half_pixel)):
        other = derived_fraction(FUSED_TFLOPS + f, UNFUSED_TFLOPS + u)
        assert abs(other - fraction) < 0.01
    for run in load_runs("LUMI23"):
        chosen = run.value("system_set.node.accelerator.memory_bound_fraction")
        assert chosen == round(fraction, 2), run.id
        assert scenario_for(run).system.node.accelerator.memory_bound_fraction == chosen


def test_without_the_choice_the_rows_run_at_the_catalog_s_fraction_and_faster() -> None:
    """Switched off, the row is today's catalog model (0.84). With the measured rate the
    memory-bound kernels take 0.84 / 0.50 as long, and the step grows by at least that
    growth of the busiest stage's memory-bound time and by little more than it and the
    GEMMs' (small batched GEMMs that turn memory-bound) together."""
    script = load_script("benchmarks/mi250x_decomposition.py", "mi250x_decomposition_script")
    run = next(r for r in load_runs("LUMI23-06") if r.id == "LUMI23-06")
    choices = {k: c for k, c in run.choices.items() if not k.startswith("system_set.")}
    plain = replace(run, choices=choices)
    catalog = load_spec("accelerators", "mi250x-gcd").memory_bound_fraction
    assert scenario_for(plain).system.node.accelerator.memory_bound_fraction == catalog
    slow, fast = script.decompose(run), script.decompose(plain)
    chosen = run.value("system_set.node.accelerator.memory_bound_fraction")
    assert slow.memory_s == pytest.approx(fast.memory_s * catalog / chosen, rel=0.01)
    growth = slow.step_s - fast.step_s
    assert slow.memory_s - fast.memory_s < growth
    kernels = slow.memory_s - fast.memory_s + slow.gemm_s - fast.gemm_s
    assert growth < 1.2 * kernels  # the bubble grows by (pp - 1) / m = 7 / 128 of it


def test_a_misspelt_system_set_choice_is_one_sentence_naming_it() -> None:
    """A choice under ``system_set.`` goes through the scenario's ``system_set``, so a
    field the system does not have is refused there, naming it."""
    run = next(r for r in load_runs("LUMI23-06") if r.id == "LUMI23-06")
    choices = dict(run.choices)
    choices["system_set.node.accelerator.memory_bound_fractoin"] = Choice(0.5, "a typo")
    with pytest.raises(UserError, match="memory_bound_fractoin"):
        scenario_for(replace(run, choices=choices))
