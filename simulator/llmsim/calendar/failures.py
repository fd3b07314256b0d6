"""A job's interruption rate from its size and the system's per-part failure rates.

A synchronous training job stops when any of its devices, nodes or network links fails,
so the job is a series system: its rate is the sum of its parts' rates and its mean time
between failures the inverse (the rates are in :class:`llmsim.specs.Reliability`, by
default the Llama 3 405B interruption log).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llmsim.specs import System


@dataclass(frozen=True)
class JobFailures:
    """What interrupts one job: its parts and their combined rate."""

    devices: int
    """Devices the job holds."""
    nodes: int
    """Nodes the job holds."""
    links: int
    """Network links of those nodes (one per NIC)."""
    rate_per_s: float
    """Interruptions per second of the whole job."""

    @property
    def mtbf_s(self) -> float:
        """Mean time between interruptions, seconds (inf without failures)."""
        return math.inf if self.rate_per_s == 0 else 1.0 / self.rate_per_s

    @property
    def per_day(self) -> float:
        """Expected interruptions per day of running."""
        return self.rate_per_s * 86_400.0


def job_failures(system: System, nodes: int) -> JobFailures:
    """The interruption rate of a job on ``nodes`` nodes of ``system``."""
    devices = nodes * system.node.devices_per_node
    links = nodes * system.node.nics_per_node
    rate = system.reliability.failures_per_s(devices, nodes, links)
    return JobFailures(devices, nodes, links, rate)
