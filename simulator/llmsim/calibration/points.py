"""What a calibration profile holds: measured GEMMs and collectives, and the profile itself
(:class:`Calibration`)."""

from __future__ import annotations

from pydantic import Field, PositiveFloat, PositiveInt

from llmsim.ops import Collective
from llmsim.specs._base import Spec
from llmsim.specs.accelerator import Dtype

DTYPES: tuple[str, ...] = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8")


def bus_factor(collective: Collective, ranks: int) -> float:
    """nccl-tests' bus-bandwidth factor: busbw = algbw × factor.

    all_reduce 2(n−1)/n; all_gather and reduce_scatter (n−1)/n; sendrecv 1
    (nccl-tests ``doc/PERFORMANCE.md``, "Summary"). ``algbw = S / t`` with ``S`` the full
    buffer of an all-reduce, the gathered output of an all-gather, the input of a
    reduce-scatter.
    """
    n = max(ranks, 1)
    if collective == "all_reduce":
        return 2.0 * (n - 1) / n
    if collective in ("all_gather", "reduce_scatter"):
        return (n - 1) / n
    return 1.0


class GemmPoint(Spec):
    """One measured GEMM: C[M×N] = A[M×K]·B[K×N] at ``tflops`` achieved."""

    m: PositiveInt
    """Rows of the output."""
    n: PositiveInt
    """Columns of the output."""
    k: PositiveInt
    """Reduction dimension."""
    dtype: Dtype
    """Data type of the inputs."""
    tflops: PositiveFloat
    """Achieved throughput, 2·M·N·K / time, TFLOP/s."""


class CollectivePoint(Spec):
    """One nccl-tests row: a collective of ``bytes`` on ``ranks`` devices over ``nodes``."""

    collective: Collective
    """all_reduce, all_gather, reduce_scatter or send_recv."""
    ranks: PositiveInt
    """Devices in the communicator."""
    nodes: PositiveInt
    """Distinct hosts holding them."""
    bytes: PositiveInt
    """Message size in nccl-tests' convention (``size`` column), bytes."""
    busbw_gbps: PositiveFloat
    """Out-of-place bus bandwidth, GB/s (10^9 bytes/s)."""


class Calibration(Spec):
    """A calibration profile: measured tables that replace parts of the cost models."""

    source: str = ""
    """Where the measurements come from: machine, software versions, date."""
    gemm: list[GemmPoint] = Field(default_factory=list)
    """Measured GEMM throughputs."""
    collectives: list[CollectivePoint] = Field(default_factory=list)
    """Measured collective bus bandwidths."""
