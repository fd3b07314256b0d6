"""The analytical straggler estimate against sampled maxima of normal draws."""

from __future__ import annotations

import numpy as np
import pytest

from llmsim.calendar.stragglers import expected_max_standard_normal, straggler_step_s
from llmsim.errors import UserError


def exact_expected_max(n: int) -> float:
    """∫ x·n·φ(x)·Φ(x)^(n−1) dx on a fine grid."""
    x = np.linspace(-10, 10, 200_001)
    phi = np.exp(-x**2 / 2) / np.sqrt(2 * np.pi)
    cdf = np.cumsum(phi) * (x[1] - x[0])
    return float(np.trapezoid(x * n * phi * cdf ** (n - 1), x))


def test_blom_is_one_over_root_pi_at_two_within_5_percent():
    assert exact_expected_max(2) == pytest.approx(1 / np.sqrt(np.pi), rel=1e-4)
    assert expected_max_standard_normal(2) == pytest.approx(1 / np.sqrt(np.pi), rel=0.05)


@pytest.mark.parametrize("n", [8, 64, 1024, 100_000])
def test_blom_is_within_one_percent_from_eight_ranks(n):
    assert expected_max_standard_normal(n) == pytest.approx(exact_expected_max(n), rel=0.01)


def test_one_rank_or_no_noise_leaves_the_step_alone():
    assert straggler_step_s(2.0, 0.05, 1) == 2.0
    assert straggler_step_s(2.0, 0.0, 10_000) == 2.0
    assert straggler_step_s(2.0, 0.05, 10_000) > straggler_step_s(2.0, 0.05, 100) > 2.0


def test_bad_inputs_are_user_errors():
    with pytest.raises(UserError, match="participants"):
        expected_max_standard_normal(0)
    with pytest.raises(UserError, match="cv"):
        straggler_step_s(1.0, -0.1, 8)
