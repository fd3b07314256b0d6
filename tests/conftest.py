"""Fixtures shared by the tests."""

from __future__ import annotations

import pytest
from helpers import make_scenario
from hypothesis import settings

from llmsim.specs import Scenario

# Every property test draws the same examples on every run: a red CI is a real regression,
# never an unlucky draw (each test's own @settings inherit this profile). No deadline: a
# test asserts behaviour, not time (a loaded runner made 200 ms examples take 440 ms).
settings.register_profile("deterministic", derandomize=True, deadline=None)
settings.load_profile("deterministic")


@pytest.fixture
def tiny() -> Scenario:
    """A tiny GPT on one Selene node (tp 2, pp 4)."""
    return make_scenario()
