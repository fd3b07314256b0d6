"""What the search's estimator says of one layout (:class:`Estimate`), and the figures a
table reads from it: tokens a second, MFU and days to train, as the engine's
:class:`~llmsim.result.Result` gives them."""

from __future__ import annotations

from dataclasses import dataclass

from llmsim.result import SECONDS_PER_DAY

__all__ = ["Estimate"]


@dataclass(slots=True)
class Estimate:
    """The estimator's prediction for one layout (read only, not frozen: see StageTimes)."""

    step_time_s: float
    pipeline_s: float
    """Forward and backward passes of every micro-batch, to the last stage's last pass."""
    dp_tail_s: float
    """Gradient reduction (and ZeRO traffic) after the last pass, on the slowest stage
    (PipeDream: its reductions after every backward, their share of the step,
    :mod:`llmsim.search.pipedream_updates`)."""
    optimizer_s: float
    """Optimizer step and the ZeRO-1/2 weight gather after it (PipeDream: its updates
    after every backward, their share of the step)."""
    model_flops_per_step: float
    tokens_per_step: int
    devices: int
    peak_flops_per_device: float
    run_flops: float | None
    run_tokens: float | None

    @property
    def tokens_per_s(self) -> float:
        """Training tokens per second, whole job."""
        return self.tokens_per_step / self.step_time_s

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation, 0–1."""
        return self.model_flops_per_step / self.step_time_s / self.devices \
            / self.peak_flops_per_device

    @property
    def days_to_train(self) -> float | None:
        """Days for the run's tokens or FLOP budget (as :attr:`Result.days_to_train`)."""
        if self.run_tokens is not None:
            return self.run_tokens / self.tokens_per_s / SECONDS_PER_DAY
        if self.run_flops is not None:
            return self.run_flops / (self.model_flops_per_step / self.step_time_s) \
                / SECONDS_PER_DAY
        return None
