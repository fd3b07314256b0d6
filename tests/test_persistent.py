"""llmsim.workload.persistent: DeepSpeed 2021 ZeRO-3's persistent parameters gathered back
after every optimizer step (``parallelism.persistent_regather``): which tensors, how many
slice copies ``_allgather_params`` issues for each, the op's price and its place in the
step."""

from __future__ import annotations

import math

import pytest
from helpers import make_scenario
from hypothesis import given
from hypothesis import strategies as st

from llmsim import simulate
from llmsim.costs import HardwareCosts
from llmsim.plan import Plan
from llmsim.validation import load_runs, scenario_for
from llmsim.workload import build_workload
from llmsim.workload.persistent import (
    PERSISTENCE_THRESHOLD,
    persistent_elements,
    post_step_gather,
    slice_copies,
)


def test_slice_copies_closed_forms():
    # a multiple of the ranks: every rank's shard starts inside the parameter
    assert slice_copies(12288, 1536) == 1536
    assert slice_copies(12288, 768) == 768
    # GPT 530B's hidden size over 2,240 ranks: shards of ⌈12288 / 2240⌉ = 6 elements ...
    assert slice_copies(12288, 2240) == 2048  # ... so only ⌈12288 / 6⌉ ranks hold a slice
    assert slice_copies(81920, 2240) == 2215  # shard 37
    assert slice_copies(5, 8) == 5  # fewer elements than ranks: one element each


@given(st.integers(1, 10**6), st.integers(1, 4096))
def test_slice_copies_cover_the_parameter_once(elements, ranks):
    copies = slice_copies(elements, ranks)
    shard = math.ceil(elements / ranks)
    assert 1 <= copies <= ranks
    # the copies' shards cover the parameter, and the last one starts inside it
    assert (copies - 1) * shard < elements <= copies * shard


def test_gpt3_layer_keeps_its_norms_and_biases_resident():
    model = make_scenario().model
    h, f = model.hidden, model.ffn_hidden
    assert model.bias and model.norm == "layernorm" and model.activation == "gelu"
    one = persistent_elements(model, 1, 1, False)
    # two layer norms (weight and bias), the QKV, attention output, MLP up and down biases
    assert sorted(one) == sorted((h, h, h, h, 3 * h, h, f, h))
    assert persistent_elements(model, 1, 3, True) == one * 3 + (h, h)  # + final norm
    # column-parallel biases split over tp, row-parallel ones replicated
    assert sorted(persistent_elements(model, 4, 1, False)) == sorted(
        (h, h, h, h, 3 * h // 4, h, f // 4, h))


def test_rmsnorm_without_biases_and_the_threshold():
    base = make_scenario().model
    llama = base.model_copy(update={"norm": "rmsnorm", "bias": False})
    assert persistent_elements(llama, 1, 2, True) == (llama.hidden,) * 5
    wide = base.model_copy(update={"ffn_hidden": PERSISTENCE_THRESHOLD})
    assert wide.ffn_hidden not in persistent_elements(wide, 1, 1, False)  # gathered, not kept


def test_post_step_gather_prices_the_list_loop_and_the_copy_loop():
    elements = (12288, 36864, 49152)
    op = post_step_gather(elements, 2240, "dp", 2, 2.4)
    shards = 6 + 17 + 22  # ⌈e / 2240⌉ each
    assert op.bytes == shards * 2240 * 2
    copies = 2048 + 2169 + 2235  # ⌈e / shard⌉ each
    assert op.copies == 2240 + copies
    assert op.host_s == pytest.approx((2240 + copies) * 2.4e-6)
    assert (op.collective, op.axis, op.phase, op.fill_passes) == ("all_gather", "dp", "O", 0)
    assert post_step_gather(elements, 1, "dp", 2, 2.4) is None
    assert post_step_gather((), 64, "dp", 2, 2.4) is None


def _zero3(**extra):
    return make_scenario(nodes=2, parallelism__zero=3, parallelism__pp=1,
                         parallelism__tp=4, training__global_batch=16, **extra)


def test_the_gather_follows_the_optimizer_and_adds_its_price_to_the_step():
    plain, regather = _zero3(), _zero3(parallelism__persistent_regather=True)
    work = build_workload(regather.model, regather.parallelism, regather.training,
                          regather.dp)
    op = work.persistent_gather(0)
    assert op is not None and work.dp_param_gathers(0) == [op]
    assert build_workload(plain.model, plain.parallelism, plain.training,
                          plain.dp).dp_param_gathers(0) == []
    costs = HardwareCosts.from_scenario(regather, Plan.from_scenario(regather))
    slow, base = simulate(regather), simulate(plain)
    assert slow.step_time_s == pytest.approx(base.step_time_s + costs.comm_s(op), rel=1e-9)
    (record,) = [r for r in slow.trace.records if r.name == op.name and r.device == 0]
    optimizer = next(r for r in slow.trace.records
                     if r.name == "optimizer" and r.device == 0)
    assert record.start_s == pytest.approx(optimizer.end_s)


def test_only_zero3_gathers_its_persistent_parameters_back():
    zero1 = make_scenario(nodes=2, parallelism__zero=1, parallelism__persistent_regather=True)
    work = build_workload(zero1.model, zero1.parallelism, zero1.training, zero1.dp)
    assert work.persistent_gather(0) is None


def test_nar21_1536_gpus_issue_a_million_copies_a_step():
    """GPT-3 175B on 1,536 GPUs (NAR21-T2-03): 96 layers × 8 persistent tensors + the final
    norm's two, each copied from all 1,536 ranks' slices, plus PyTorch's 1,536 copy-outs."""
    run = next(r for r in load_runs("NAR21-T2-03"))
    scenario = scenario_for(run)
    assert scenario.parallelism.persistent_regather
    work = build_workload(scenario.model, scenario.parallelism, scenario.training,
                          scenario.dp)
    op = work.persistent_gather(0)
    assert op.copies == 1536 + (96 * 8 + 2) * 1536 == 1_184_256
