"""benchmarks/time_norms.py: the implementations it times and its refusals on a machine that
cannot time them (CI has no GPU, PyTorch or Transformer Engine)."""

from __future__ import annotations

import importlib.util

import pytest
from helpers import load_script

time_norms = load_script("benchmarks/time_norms.py")


def test_an_unknown_implementation_is_refused_with_the_choices(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert time_norms.main(["--impl", "apex"]) == 2
    err = capsys.readouterr().err
    assert "--impl apex" in err and "torch, te" in err


@pytest.mark.skipif(importlib.util.find_spec("transformer_engine") is not None,
                    reason="Transformer Engine is installed here")
def test_te_without_transformer_engine_says_what_to_install(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert time_norms.main(["--impl", "te"]) == 2
    err = capsys.readouterr().err
    assert "Transformer Engine" in err and "--impl torch" in err
    assert "Traceback" not in err


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None,
                    reason="PyTorch is installed here")
def test_torch_missing_is_one_sentence(capsys: pytest.CaptureFixture[str]) -> None:
    assert time_norms.main([]) == 2
    assert "needs PyTorch" in capsys.readouterr().err
