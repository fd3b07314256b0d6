"""benchmarks/time_attention.py, time_grouped_gemms.py and time_fp8_casts.py: their shape
lists (importable without PyTorch, which CI lacks) and their refusals where they cannot
time."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

import pytest
from helpers import ROOT


def _load(relative: str) -> ModuleType:
    """A benchmark script imported as a module, registered in sys.modules (its dataclasses
    look their module up there)."""
    path = ROOT / relative
    spec = importlib.util.spec_from_file_location(f"bench_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


attention = _load("benchmarks/time_attention.py")
grouped = _load("benchmarks/time_grouped_gemms.py")
casts = _load("benchmarks/time_fp8_casts.py")
NO_TORCH = importlib.util.find_spec("torch") is None


def test_attention_shapes_cover_the_long_causal_squares_and_the_ring_blocks() -> None:
    shapes = attention.attention_shapes()
    causal = {(s.heads, s.kv_heads, s.q_tokens) for s in shapes if s.causal}
    assert all(s.q_tokens == s.kv_tokens for s in shapes if s.causal)
    assert {(32, 32, 131072), (32, 8, 131072), (64, 8, 131072), (4, 4, 2048)} <= causal
    assert (4, 4, 131072) not in causal  # the longest only for the brief's three
    blocks = {(s.q_tokens, s.kv_tokens) for s in shapes if not s.causal}
    assert blocks == set(attention.BLOCK_TOKENS)
    assert shapes[-1].q_tokens == 131072  # the slowest last
    assert len(shapes) == len(set(shapes)) == 36 + 50 + 3


def test_attention_flops_halve_for_a_causal_square() -> None:
    square = attention.AttentionShape(32, 8, 4096, 4096, True)
    block = attention.AttentionShape(32, 8, 4096, 4096, False)
    assert block.forward_flops() == 4 * 32 * 4096 * 4096 * 128 == 2 * square.forward_flops()


def test_grouped_gemm_shapes_stay_within_the_models_experts_and_rows() -> None:
    shapes = grouped.grouped_gemm_shapes()
    for s in shapes:
        hidden, ffn, routed = grouped.MODELS[s.model]
        assert s.experts <= routed and s.experts * s.tokens_per_expert <= grouped.MAX_ROWS
        assert (s.n, s.k) == ((2 * ffn, hidden) if s.gemm == "up" else (hidden, ffn))
        assert s.flops() == 2.0 * s.experts * s.tokens_per_expert * s.n * s.k
    assert len(shapes) == 2 * (4 * 8 + 2 * (6 * 8 - 3))  # Mixtral has 8 experts


def test_cast_shapes_are_every_token_count_with_every_width() -> None:
    shapes = casts.cast_shapes()
    widths = {w for ws in casts.WIDTHS.values() for w in ws}
    assert set(shapes) == {(t, w) for t in casts.TOKENS for w in widths}
    assert len(shapes) == len(casts.TOKENS) * 11
    by_name = {op.name: op for op in casts.OPS}
    assert by_name["cast_transpose"].bytes_per_element == 4  # read 2, write 1 + 1


@pytest.mark.skipif(not NO_TORCH, reason="PyTorch is installed here")
@pytest.mark.parametrize("script", [attention, grouped, casts])
def test_without_torch_each_says_so_in_one_sentence(
        script, capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    assert script.main(["--out", str(tmp_path / "x.csv")]) == 2
    err = capsys.readouterr().err
    assert "needs PyTorch" in err and "Traceback" not in err
    assert not (tmp_path / "x.csv").exists()


def test_an_unknown_backend_or_method_is_refused_with_the_choices(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert attention.main(["--backends", "flash,xformers"]) == 2
    assert "xformers" in capsys.readouterr().err
    assert grouped.main(["--methods", "cutlass"]) == 2
    err = capsys.readouterr().err
    assert "cutlass" in err and "grouped" in err
