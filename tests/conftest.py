"""Fixtures shared by the tests."""

from __future__ import annotations

import pytest
from helpers import make_scenario

from llmsim.specs import Scenario


@pytest.fixture
def tiny() -> Scenario:
    """A tiny GPT on one Selene node (tp 2, pp 4)."""
    return make_scenario()
