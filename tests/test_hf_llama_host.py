"""llmsim's host path against a Hugging Face Llama step timed on one H100.

``tests/data/hf_llama_h100_2026_11.csv`` holds the measured steps
(``benchmarks/time_hf_llama_host.py``; ``benchmarks/results/h100-2026-11-27-hf-llama/``):
LLaMA-7B's shapes in FP16, one sequence of 16 … 8,192 tokens, forward + backward, plain
autograd and Hugging Face's checkpointing. llmsim runs the same work on one H100
(tp = pp = dp = cp = 1, Hugging Face's eager pointwise ops, ``training.host_path:
modules`` at the H100 entry's ``host_module_dispatch_us`` of 33.8 µs, measured on another
model: nothing here is fitted to these rows). The bands are the ones docs/calibration.md
("A Hugging Face step on one H100") states, as measured on 2026-11-27.
"""

from __future__ import annotations

import csv
import math

import pytest
from helpers import ROOT, load_script

from llmsim import load_scenario, simulate
from llmsim.loader import load_spec

LLAMA_7B = {"name": "llama-7b-hf", "layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 32,
            "ffn_hidden": 11008, "vocab": 32000, "max_seq_len": 8192, "activation": "swiglu",
            "norm": "rmsnorm", "position_embedding": "rope", "bias": False,
            "tied_embeddings": False}
"""LLaMA-7B as the benchmark builds it (LlamaConfig with LLaMA-7B's sizes)."""

MODES = {"plain": ("none", "none"), "hf_ckpt": ("full", "none"),
         "hf_ckpt_sync": ("full", "attention")}
"""The benchmark's modes llmsim prices: their checkpointing and host syncs (the ``_sync``
modes' ``torch.cuda.synchronize()`` before and after each attention, ``training.host_syncs:
attention``). The FSDP modes (FSDP on a one-rank group) are not priced: llmsim prices no
host work of FSDP's hooks (docs/calibration.md)."""


def _measured() -> dict[tuple[str, int], dict[str, str]]:
    path = ROOT / "tests" / "data" / "hf_llama_h100_2026_11.csv"
    lines = [line for line in path.read_text().splitlines() if not line.startswith("#")]
    return {(r["mode"], int(r["seq"])): r for r in csv.DictReader(lines)}


MEASURED = _measured()


def one_h100(seq: int, recompute: str, host_path: str = "modules", host_syncs: str = "none"):
    """The benchmark's step in llmsim: one H100 (Eos's node cut to one device)."""
    system = load_spec("systems", "eos").model_dump(mode="json", exclude_none=True)
    system["node"].update(devices_per_node=1, fabric=[])
    raw = {"name": f"hf-llama-{seq}", "system": system, "nodes": 1, "model": dict(LLAMA_7B),
           "parallelism": {"tp": 1, "pp": 1, "dp": 1, "micro_batch": 1,
                           "recompute": recompute},
           "training": {"global_batch": 1, "seq_len": seq, "precision": "fp16",
                        "tokens": 1e9, "attention_kernel": "cudnn",
                        "pointwise_ops": "hf_eager", "host_path": host_path,
                        "host_syncs": host_syncs}}
    return load_scenario(raw)


def forward_backward_ms(seq: int, recompute: str, host_path: str = "modules",
                        host_syncs: str = "none") -> float:
    """llmsim's forward + backward (recompute included) on the device, ms: the step less
    the optimizer, which the benchmark does not run."""
    df = simulate(one_h100(seq, recompute, host_path, host_syncs)).to_dataframe()
    compute = df[(df["stream"] == "compute") & (df["device"] == 0)]
    return float(compute[compute["kind"].isin(["F", "R", "B", "W"])]["duration_s"].sum()) * 1e3


def ratio(mode: str, seq: int) -> float:
    """llmsim's forward + backward over the measured step of ``mode`` at ``seq`` tokens."""
    recompute, syncs = MODES[mode]
    return (forward_backward_ms(seq, recompute, host_syncs=syncs)
            / float(MEASURED[(mode, seq)]["wall_ms"]))


def wall_ms(mode: str, seq: int) -> float:
    return float(MEASURED[(mode, seq)]["wall_ms"])


@pytest.mark.parametrize("seq", [16, 1024, 2048, 4096])
def test_plain_autograd_within_a_quarter_of_the_wall(seq):
    """Plain autograd: llmsim 0.79 / 0.81 / 0.92 / 0.94 of the measured step at 16 / 1K /
    2K / 4K tokens (llmsim issues fewer kernels than the profiler counts: 3,090 host
    dispatches at 16 tokens against 4,384 kernels)."""
    assert 0.75 <= ratio("plain", seq) <= 1.05


def test_the_host_sets_the_floor_of_a_short_step():
    """At 16 tokens every kernel is short and the host sets the pace: measured 132 ms of
    wall for 25 ms of kernels; llmsim's step is host-bound too (more than three times
    its kernels' time), which it was not while a host without a pipeline was taken to
    enter every pass ahead of the device (22 ms)."""
    modules = forward_backward_ms(16, "none")
    kernels = float(MEASURED[("plain", 16)]["kernel_ms"])
    assert modules > 3 * kernels
    assert modules > 0.75 * wall_ms("plain", 16)


@pytest.mark.parametrize("mode", ["hf_ckpt", "hf_ckpt_sync"])
@pytest.mark.parametrize("seq", [4096, 8192])
def test_checkpointed_long_steps_within_a_tenth(mode, seq):
    """Under Hugging Face's checkpointing at 4K and 8K tokens the kernels are long and
    hide the host: llmsim 0.97 and 0.97 of the measured step (0.95 and 0.97 with the
    syncs)."""
    assert 0.9 <= ratio(mode, seq) <= 1.05


@pytest.mark.parametrize("seq", [2048, 4096, 8192])
def test_the_syncs_add_what_the_host_can_no_longer_hide(seq):
    """Six syncs a layer (192 a step) keep the host from running ahead: measured, they add
    50 / 39 / 26 ms at 2K / 4K / 8K tokens, the host's work after each attention now in
    series with the device; llmsim (two gaps of 93.8 µs an attention, the host held to
    its end, ``training.host_syncs: attention``) adds 42 / 29 / 21 ms, 0.73-0.84 of it.
    At 1K llmsim adds 31 of 76 ms: the syncs expose the checkpointing's host work that
    llmsim lacks (below)."""
    added = (forward_backward_ms(seq, "full", host_syncs="attention")
             - forward_backward_ms(seq, "full"))
    measured = wall_ms("hf_ckpt_sync", seq) - wall_ms("hf_ckpt", seq)
    assert 0.65 <= added / measured <= 1.1


@pytest.mark.parametrize("mode", ["hf_ckpt", "hf_ckpt_sync"])
@pytest.mark.parametrize("seq", [16, 1024])
def test_checkpointings_host_work_is_not_priced(mode, seq):
    """What llmsim still lacks: at 16 and 1K tokens the checkpointed step is 0.49 and
    0.75 of the measured one (0.52 and 0.66 with the syncs). Checkpointing adds 167.5 ms
    of wall at 16 tokens for 1,312 more kernels (128 µs each; the plain step's are 30 µs):
    the host work of
    torch.utils.checkpoint's re-run, which a per-kernel dispatch measured on plain
    modules does not hold. This test fails when that work is priced."""
    assert ratio(mode, seq) < 0.8


def test_more_host_time_per_kernel_never_shortens_the_step():
    """The host path's interval only adds: bare PyTorch ops (9.1 µs) give a shorter step
    than modules (33.8 µs), at a host-bound length and at a device-bound one."""
    for seq in (16, 4096):
        bare, modules = (forward_backward_ms(seq, "none", p) for p in ("bare", "modules"))
        assert bare <= modules + 1e-9 and math.isfinite(modules)


def test_the_benchmark_script_runs_on_a_cpu(tmp_path):
    """``benchmarks/time_hf_llama_host.py`` on a CPU with a one-layer model: one row a
    mode, the FSDP modes skipped; skipped where PyTorch or transformers is missing."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    script = load_script("benchmarks/time_hf_llama_host.py")
    out = tmp_path / "hf.csv"
    code = script.main(["--device", "cpu", "--layers", "1", "--hidden", "64", "--heads", "4",
                        "--ffn", "128", "--vocab", "128", "--seq", "16", "--repeats", "1",
                        "--modes", "plain", "hf_ckpt_sync", "fsdp_hf_ckpt", "--out", str(out)])
    assert code == 0
    rows = list(csv.DictReader(out.open()))
    assert [r["mode"] for r in rows] == ["plain", "hf_ckpt_sync"]
    assert all(not r["error"] and float(r["wall_ms"]) > 0 for r in rows)
    assert int(rows[1]["syncs"]) > 0 and rows[0]["syncs"] == "0"
