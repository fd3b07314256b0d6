"""Power specs: what one device draws by kind of work, and the node and facility around it.

Both are optional. Without a :class:`DevicePower` the energy model derives one from the
accelerator's ``tdp_w`` with the shares measured on an H100 SXM5
(:data:`H100_POWER_SHARES`); without a :class:`Facility` it counts the devices only.
"""

from __future__ import annotations

from pydantic import Field, NonNegativeFloat, PositiveFloat

from llmsim.specs._base import Spec

H100_POWER_SHARES = {
    "gemm": 697.47 / 700,
    "memory": 559.36 / 700,
    "comm": 136.38 / 700,
    "wait": 128.71 / 700,
    "idle": 71.87 / 700,
}
"""Board power by kind of work over the 700 W limit, measured on one H100 SXM5 80 GB
(``shared/measurements/h100-sxm5-2026-11/power_by_phase.csv``, medians of 100 ms
samples over 15 s each, 2026-11-26): an 8192³ BF16 GEMM 697.47 W (pinned at the limit,
the SM clock down to 1,350 MHz); a memory-bound add 559.36 W; pinned host↔device copies
136.38 W (the closest measured stand-in for communication with the SMs idle: copy
engines and links busy — an NCCL collective also runs kernels on a few SMs, so this is a
lower bound); idle just after load with the clock still up, 128.71 W (a device waiting
inside a step); idle at 345 MHz, 71.87 W. Other accelerators take the same shares of their
``tdp_w``: an assumption that their GEMMs are also power-limited."""


class DevicePower(Spec):
    """Board power of one device by what it is doing, W."""

    gemm_w: PositiveFloat
    """Running GEMMs or fused attention (compute-bound kernels), W."""
    memory_w: PositiveFloat
    """Running memory-bound kernels (norms, activations, optimizer), W."""
    comm_w: PositiveFloat
    """Only communicating (an exposed collective or pipeline transfer), W."""
    wait_w: PositiveFloat
    """Inside a step with nothing to run (pipeline bubble, waiting for a peer), W."""
    idle_w: PositiveFloat
    """Idle between steps (a restart, a blocking checkpoint), W."""

    @classmethod
    def from_tdp(cls, tdp_w: float) -> DevicePower:
        """The H100's measured shares (:data:`H100_POWER_SHARES`) of ``tdp_w``."""
        return cls(**{f"{k}_w": s * tdp_w for k, s in H100_POWER_SHARES.items()})


class Facility(Spec):
    """What a system draws beyond its accelerators, and its site."""

    node_overhead_w: NonNegativeFloat = 0.0
    """Power of one node beside its accelerators (CPUs, memory, NICs, fans, power
    conversion), W, drawn whenever the job holds the node. 0: not counted."""
    network_w_per_node: NonNegativeFloat = 0.0
    """Network switches' power per node, W. 0: not counted."""
    conversion_efficiency: float = Field(default=1.0, gt=0, le=1)
    """Share of the power a node and its network draw at the rack's input that reaches
    their parts (rectifiers, voltage regulators), 0–1. 1.0: conversion losses not
    counted."""
    pue: float = Field(default=1.0, ge=1.0)
    """Power usage effectiveness of the data centre (facility power over IT power).
    1.0: cooling and power delivery not counted."""
