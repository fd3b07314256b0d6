"""benchmarks/time_layers.py: the single-device scenario and llmsim's side always; the
PyTorch side as a CPU smoke run where PyTorch is installed (it is not a dependency)."""

from __future__ import annotations

import pytest
from helpers import load_script

from llmsim import load_scenario

time_layers = load_script("benchmarks/time_layers.py")
time_layers_moe = load_script("benchmarks/time_layers_moe.py")

GPT3 = load_scenario("selene-gpt3")


def test_single_device_scenario_runs_one_micro_batch_on_one_device() -> None:
    one = time_layers.single_device(GPT3, 2)
    assert one.devices == 1 and one.model.layers == 2 and one.dp == 1
    assert one.training.global_batch == one.parallelism.micro_batch == one.micro_batches
    assert one.parallelism.recompute == "none" and one.training.hidden_dropout == 0
    shrunk = time_layers.single_device(GPT3, 1, shrink=16)
    assert shrunk.model.hidden == GPT3.model.hidden // 16


def test_one_tensor_parallel_rank() -> None:
    rank = time_layers.single_device(GPT3, 2, tp=8)
    assert rank.devices == 8 and rank.parallelism.tp == 8 and rank.dp == 1
    assert rank.system.node.devices_per_node == 8
    whole_fwd, whole_both = time_layers.predicted_s(time_layers.single_device(GPT3, 2))
    rank_fwd, rank_both = time_layers.predicted_s(rank)
    assert rank_fwd < whole_fwd / 4 and rank_both < whole_both / 4  # a share, not the whole


def test_validation_row_as_the_scenario() -> None:
    row = time_layers.resolve("MEGREADME-H100-04", [])
    assert row.system.node.accelerator.name == "h100-sxm5-80gb" and row.parallelism.tp == 8


def test_llmsim_side_grows_with_the_layers() -> None:
    fwd1, both1 = time_layers.predicted_s(time_layers.single_device(GPT3, 1))
    fwd2, both2 = time_layers.predicted_s(time_layers.single_device(GPT3, 2))
    assert 0 < fwd1 < both1 and fwd1 < fwd2 and both1 < both2


def test_layers_cut_to_fit_the_device() -> None:
    small = time_layers.layers_that_fit(GPT3, 1, 40.0)
    large = time_layers.layers_that_fit(GPT3, 1, 80.0)
    assert 1 <= small <= large < GPT3.model.layers


def test_cpu_smoke_run(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    code = time_layers.main(["selene-gpt3", "--device", "cpu", "--layers", "1",
                             "--shrink", "16", "--repeats", "1",
                             "--set", "training.seq_len=128"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "forward+backward" in out and "llmsim/PyTorch" in out


MOE02 = time_layers.resolve("MBRIDGE-2604-MOE-02", [])


def test_one_expert_parallel_rank() -> None:
    """``--ep 16`` of MBRIDGE-2604-MOE-02: 16 devices (two nodes of 8), the experts split
    16 ways (8 a rank), one micro-batch a rank, and the rank's grouped GEMMs take its own
    tokens' T·k rows, times the busiest rank's expected excess (1.3 % at 16 ranks)."""
    from llmsim.experts import busiest_rank_factor, expert_rows

    rank = time_layers.single_device(MOE02, 2, ep=16)
    par = rank.parallelism
    assert rank.devices == 16 and par.ep == 16 and par.tp == par.dp == par.pp == 1
    assert rank.micro_batches == 1 and par.moe_dispatcher == "alltoall"
    tokens = par.micro_batch * rank.training.seq_len
    local, rows = expert_rows(rank.model, par, rank.training)
    assert local == 128 // 16 == time_layers.local_experts(rank.model, 16)
    factor = busiest_rank_factor(16 * tokens * 8, 16)
    assert rows * local == pytest.approx(tokens * 8 * factor) and factor < 1.02


def test_moe_on_one_device_computes_every_expert() -> None:
    from llmsim.experts import expert_rows

    one = time_layers.single_device(MOE02, 2, ep=1)
    local, rows = expert_rows(one.model, one.parallelism, one.training)
    assert one.devices == 1 and local == 128 and rows == one.training.seq_len * 8 / 128
    fwd1, both1 = time_layers.predicted_s(one)
    fwd16, both16 = time_layers.predicted_s(time_layers.single_device(MOE02, 2, ep=16))
    assert fwd16 < fwd1 and both16 < both1  # a rank computes 1/16 of the experts' rows


def test_parts_cover_every_compute_op_and_sum_to_the_passes() -> None:
    rank = time_layers.single_device(MOE02, 2, ep=16)
    parts = time_layers_moe.predicted_parts_s(rank)
    assert "other" not in parts, parts
    assert {"router", "permute", "expert_gemms", "unpermute_combine"} <= set(parts)
    forward, both = time_layers.predicted_s(rank)
    assert sum(f for f, _ in parts.values()) == pytest.approx(forward)
    assert sum(b for _, b in parts.values()) == pytest.approx(both)


def test_ranks_it_cannot_build_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """Each in one sentence and exit code 2, before PyTorch is imported."""
    assert time_layers.main(["MBRIDGE-2604-MOE-02", "--ep", "3"]) == 2
    assert "--ep 3 does not divide the 128 experts" in capsys.readouterr().out
    assert time_layers.main(["selene-gpt3", "--ep", "2"]) == 2
    assert "has no experts" in capsys.readouterr().out
    assert time_layers.main(["MBRIDGE-2604-MOE-02", "--tp", "2", "--ep", "8"]) == 2
    assert "built for tp 1 only" in capsys.readouterr().out
    assert time_layers.main(["DSV3-01", "--ep", "8"]) == 2
    assert "multi-head latent attention" in capsys.readouterr().out


def _reference_moe(torch, mlp, x, k, local):  # type: ignore[no-untyped-def]
    """The MoE MLP token by token: each token's top-k experts (ids mod ``local``), their
    SwiGLU MLPs, weighted by the normalised router probabilities."""
    probs, chosen = torch.topk(torch.softmax(mlp.router(x).float(), dim=-1), k, dim=-1)
    probs = probs / probs.sum(dim=-1, keepdim=True)
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(k):
            e = int(chosen[t, j]) % local
            gate, lin = (mlp.w_up[e] @ x[t]).chunk(2)
            out[t] += probs[t, j] * (mlp.w_down[e] @ (torch.nn.functional.silu(gate) * lin))
    return out


@pytest.mark.parametrize("ep", [1, 16])
def test_moe_mlp_matches_the_token_by_token_reference(ep: int) -> None:
    """The permuted, grouped computation equals the per-token sum, with and without the
    rows padded to 16 an expert (the grouped GEMM's alignment on older PyTorch), and the
    gather permutation gives the scatter one's output and gradients."""
    torch = pytest.importorskip("torch")
    model = time_layers.single_device(MOE02, 1, shrink=16).model
    torch.manual_seed(0)
    mlp = time_layers_moe.moe_mlp(torch, model, ep)
    others = [time_layers_moe.moe_mlp(torch, model, ep, align_rows=16),
              time_layers_moe.moe_mlp(torch, model, ep, permute="gather"),
              time_layers_moe.moe_mlp(torch, model, ep, align_rows=16, permute="gather")]
    x = torch.randn(32, model.hidden, requires_grad=True)
    y = mlp(x)
    ref = _reference_moe(torch, mlp, x, model.moe.top_k, 128 // ep)
    torch.testing.assert_close(y, ref, rtol=1e-4, atol=1e-5)
    grad_out = torch.randn_like(y)
    grads = torch.autograd.grad(y, [x, mlp.w_up, mlp.w_down, mlp.router.weight], grad_out)
    for other in others:
        other.load_state_dict(mlp.state_dict())
        y_other = other(x)
        torch.testing.assert_close(y_other, y, rtol=1e-4, atol=1e-5)
        other_grads = torch.autograd.grad(
            y_other, [x, other.w_up, other.w_down, other.router.weight], grad_out)
        for mine, theirs in zip(grads, other_grads, strict=True):
            torch.testing.assert_close(theirs, mine, rtol=1e-4, atol=1e-5)


def test_cpu_smoke_run_of_an_expert_parallel_rank(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    code = time_layers.main(["MBRIDGE-2604-MOE-02", "--device", "cpu", "--layers", "1",
                             "--shrink", "16", "--repeats", "1", "--ep", "16",
                             "--permute", "gather", "--set", "training.seq_len=64"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "ep 16" in out and "permute gather" in out and "expert_gemms" in out
    assert "llmsim/PyTorch" in out


def test_profile_parts_account_for_every_kernel() -> None:
    """The profiled MOE-02 rank (4 layers, ``profile_moe02_ep16_gather.csv``): the parts
    sum to the profile's kernel time, and the grouped GEMMs are its ``_grouped_mm`` rows,
    per call and layer."""
    import csv

    from helpers import ROOT

    path = (ROOT / "benchmarks" / "results" / "h100-2026-11-27-moe-layers"
            / "profile_moe02_ep16_gather.csv")
    rank = time_layers.single_device(MOE02, 4, ep=16)
    parts = time_layers_moe.profiled_parts_us(path, rank)
    with path.open() as handle:
        rows = [r for r in csv.DictReader(handle) if r["name"].startswith("aten::")]
    calls = time_layers_moe.PROFILED_CALLS
    total = sum(float(r["self_device_us"]) for r in rows) / calls
    grouped = sum(float(r["self_device_us"]) for r in rows if r["name"] == "aten::_grouped_mm")
    assert parts["head_loss"] + 4 * sum(v for p, v in parts.items() if p != "head_loss") == (
        pytest.approx(total))
    assert parts["expert_gemms"] == pytest.approx(grouped / calls / 4)
    assert "atomic_adds" not in parts and parts["row_gathers"] > 0  # the gather path
