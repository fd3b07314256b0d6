"""Fixtures shared by the tests."""

from __future__ import annotations

import pytest
from helpers import make_scenario
from hypothesis import settings

from llmsim.specs import Scenario

# Every property test draws the same examples on every run: a red CI is a real regression,
# never an unlucky draw (each test's own @settings inherit this profile).
settings.register_profile("deterministic", derandomize=True)
settings.load_profile("deterministic")


@pytest.fixture
def tiny() -> Scenario:
    """A tiny GPT on one Selene node (tp 2, pp 4)."""
    return make_scenario()
