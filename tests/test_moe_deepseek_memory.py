"""DeepSeek-V3's memory savings (its report §3.2.3 and §3.3.3): the RMSNorms and MLA's
up-projections recomputed in the backward (``parallelism.recompute_norms_and_up_proj``),
the experts' inputs and activation inputs cached in FP8 (``training.fp8_activation_cache``);
closed forms of the bytes they save and the ops they add, and the scenario fitting as it
ran."""

from __future__ import annotations

import pytest
from helpers import make_scenario
from test_cli import run_cli

import llmsim
from llmsim.activations import activation_bytes_per_layer, activation_element_bytes
from llmsim.experts import FP8_CACHED_BYTES, moe_activation_bytes_delta, routed_rows
from llmsim.mla import mla_activation_bytes_delta
from llmsim.workload.build import pass_ops
from llmsim.workload.recompute import EXPERT_ACTIVATIONS, NORMS_AND_UP_PROJECTIONS

OFF = ["parallelism.recompute_norms_and_up_proj=false", "training.fp8_activation_cache=false"]


def _ds(*sets: str) -> llmsim.Scenario:
    """The deepseek-v3 scenario (both savings on, as it ran) with ``sets``."""
    return llmsim.load_scenario("deepseek-v3", overrides=list(sets))


def test_norm_recompute_drops_the_two_norm_outputs() -> None:
    """A dense block keeps 2·e·sbh less (÷t with sequence parallelism)."""
    for sp in (False, True):
        on = make_scenario(parallelism__recompute_norms_and_up_proj=True,
                           parallelism__sequence_parallel=sp)
        off = make_scenario(parallelism__sequence_parallel=sp)
        m, par, trn = on.model, on.parallelism, on.training
        e, sb = activation_element_bytes(trn), trn.seq_len * par.micro_batch
        saved = (activation_bytes_per_layer(m, off.parallelism, trn)
                 - activation_bytes_per_layer(m, par, trn))
        assert saved == pytest.approx(2 * e * sb * m.hidden / (par.tp if sp else 1))


def test_mla_recompute_keeps_the_latents_and_the_attention_output() -> None:
    """MLA keeps e·sb·(q_lora + kv_lora + heads·(2·d_qk + d_v)) less: the normalised
    latents and the per-head queries, keys and values."""
    on, off = _ds(), _ds(*OFF)
    m, trn = on.model, on.training
    a = m.mla
    assert a is not None
    e, sb = activation_element_bytes(trn), trn.seq_len * on.parallelism.micro_batch
    d_qk, d_v = a.qk_nope_head_dim + a.qk_rope_head_dim, a.v_head_dim
    heads = m.heads // on.parallelism.tp
    saved = (mla_activation_bytes_delta(m, off.parallelism, trn, e)
             - mla_activation_bytes_delta(m, on.parallelism, trn, e))
    assert saved == pytest.approx(e * sb * (a.q_lora_rank + a.kv_lora_rank
                                            + heads * (2 * d_qk + d_v)))


def test_fp8_cache_keeps_the_expert_inputs_in_fp8_and_drops_the_down_inputs() -> None:
    """Per MoE block: the routed rows R·h and the activation inputs (g = 2 for SwiGLU)
    at FP8_CACHED_BYTES, no down-projection inputs: R·(e·(h + 3f) − e8·(h + 2f)) + the
    shared expert's sb·(3e − 2e8)·f."""
    on, off = _ds(), _ds("training.fp8_activation_cache=false")
    m, par, trn = on.model, on.parallelism, on.training
    assert m.moe is not None and m.moe.shared_experts == 1 and m.activation == "swiglu"
    e, e8, f, h = activation_element_bytes(trn), FP8_CACHED_BYTES, m.moe.ffn_hidden, m.hidden
    rows, sb = routed_rows(m, par, trn), trn.seq_len * par.micro_batch
    saved = (moe_activation_bytes_delta(m, off.parallelism, off.training, e)
             - moe_activation_bytes_delta(m, par, trn, e))
    want = rows * (e * (h + 3 * f) - e8 * (h + 2 * f)) + sb * (3 * e - 2 * e8) * f
    assert saved == pytest.approx(want)
    assert e8 == 1 + 4 / 128  # one byte and an FP32 scale per 128 elements


def test_the_recomputed_ops_are_the_forward_ones_and_add_no_model_flops() -> None:
    """The recompute list of a block gains exactly the forward's norms and
    up-projections (a MoE block also its expert activations), same FLOPs and bytes;
    model FLOPs do not change, and recomputing does not shorten the step (the FP8 cache,
    which also shrinks the all-to-alls, held on both sides)."""
    on, off = _ds(), _ds(*OFF)
    ops_on, ops_off = (pass_ops(s.model, s.parallelism, s.training) for s in (on, off))
    assert ops_on.moe is not None and ops_off.moe is not None
    for passes, names in ((ops_on.dense, NORMS_AND_UP_PROJECTIONS),
                          (ops_on.moe, NORMS_AND_UP_PROJECTIONS | EXPERT_ACTIVATIONS)):
        fwd, rec = passes[0], passes[1]
        want = [(o.name, o.flops, o.bytes) for o in fwd if o.name in names]
        assert [(o.name, o.flops, o.bytes) for o in rec] == want
        assert {o.phase for o in rec} == {"R"} and len(want) == 6 + (len(names) > 6) * 2
    assert ops_off.dense[1] == () and ops_off.moe[1] == ()
    a, b = llmsim.simulate(on), llmsim.simulate(off)
    assert a.model_flops_per_step == b.model_flops_per_step
    no_norms = llmsim.simulate(_ds(OFF[0]))
    assert a.step_time_s > no_norms.step_time_s


def test_fp8_cache_sends_the_dispatch_and_the_combine_gradients_in_fp8() -> None:
    """§3.3.3: the dispatch and, backward, the gradients into the down-projection travel
    as FP8 rows (1 + 4/128 bytes an element); the combine and the dispatch's gradients
    stay at the activation's bytes."""
    on, off = _ds(), _ds("training.fp8_activation_cache=false")
    ops_on, ops_off = (pass_ops(s.model, s.parallelism, s.training) for s in (on, off))
    assert ops_on.moe is not None and ops_off.moe is not None

    def a2a(passes) -> dict[str, float]:
        return {o.name: o.bytes for ops in passes for o in ops
                if getattr(o, "collective", None) == "all_to_all"}

    got, base = a2a(ops_on.moe), a2a(ops_off.moe)
    e = activation_element_bytes(on.training)
    assert set(got) == {"moe_dispatch", "moe_combine", "moe_dispatch_bwd", "moe_combine_bwd"}
    for name in ("moe_dispatch", "moe_combine_bwd"):
        assert got[name] == pytest.approx(base[name] * FP8_CACHED_BYTES / e)
    for name in ("moe_combine", "moe_dispatch_bwd"):
        assert got[name] == base[name]


def test_deepseek_v3_fits_as_it_ran() -> None:
    """Stage 1 needed 135 GB of the H800's 80 GB without the savings; with them every
    stage fits."""
    assert all(m.fits for m in llmsim.simulate(_ds()).memory)
    assert not all(m.fits for m in llmsim.simulate(_ds(*OFF)).memory)


@pytest.mark.parametrize("sets, field", [
    (["training.fp8_activation_cache=true"], "training.fp8_activation_cache"),
    (["training.precision=fp8", "training.fp8_activation_cache=true"],
     "training.fp8_activation_cache"),
    (["parallelism.recompute=full", "parallelism.recompute_norms_and_up_proj=true"],
     "parallelism.recompute_norms_and_up_proj"),
])
def test_impossible_savings_are_one_line_errors(
        sets: list[str], field: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Without FP8, on a dense model, with full recompute: exit code 2, the field named."""
    args = ["run", "selene-gpt3"] + [x for s in sets for x in ("--set", s)]
    code, _, err = run_cli(args, capsys)
    assert code == 2 and field in err and "Traceback" not in err


def test_llmsim_run_names_the_savings_and_the_overlap(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(["run", "deepseek-v3"], capsys)
    assert code == 0, err
    assert "(+ norms, MLA up-projections)" in out and "cached in FP8" in out
    assert "all-to-all (20 units held)" in out and "dualpipe" in out
