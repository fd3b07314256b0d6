"""Cost models: a duration in seconds for every op of the workload graph (design §6).

:class:`HardwareCosts` prices compute ops with the roofline model of
:mod:`llmsim.costs.compute` and communication ops with the α–β collective models of
:mod:`llmsim.costs.collectives`, on the path each group uses in the Plan. A
:class:`~llmsim.calibration.Calibration` profile replaces the GEMM efficiency model and
the collectives it has measurements for. All-to-alls (mixture-of-experts token dispatch)
are priced by :mod:`llmsim.costs.alltoall` on the same group paths. Any object with
``compute_s`` and ``comm_s`` (:class:`CostModel`) can stand in for it.
"""

from __future__ import annotations

from typing import Protocol

from llmsim.calibration import Calibration
from llmsim.costs.allocator import PageRoundTrip
from llmsim.costs.alltoall import AllToAllModel, TokenDispatch
from llmsim.costs.attention_relative import missing_measurement
from llmsim.costs.collectives import (
    ALGORITHMS,
    CollectiveModel,
    CollectiveTable,
    GroupPath,
    algorithm_times_s,
    group_path,
)
from llmsim.costs.compute import ComputeModel, GemmTable, gemm_efficiency, gemm_shape
from llmsim.costs.host_issue import HostIssue, host_runs_ahead
from llmsim.costs.parameter_server import ParameterServerModel
from llmsim.costs.retention import CoreRetention
from llmsim.errors import UserError
from llmsim.loader import calibration_profile
from llmsim.ops import CommOp, ComputeOp
from llmsim.plan import Plan
from llmsim.specs import AttentionKernel, Dtype, Scenario, System
from llmsim.specs.training import Allocator, HostPath

__all__ = [
    "ALGORITHMS",
    "CollectiveModel",
    "CollectiveTable",
    "ComputeModel",
    "CostModel",
    "GemmTable",
    "GroupPath",
    "HardwareCosts",
    "algorithm_times_s",
    "gemm_efficiency",
    "gemm_shape",
    "group_path",
]


class CostModel(Protocol):
    """Prices ops in seconds; deterministic and cheap (the engine calls it per op)."""

    def compute_s(self, op: ComputeOp) -> float: ...
    def comm_s(self, op: CommOp) -> float: ...

    @property
    def host_issue(self) -> HostIssue:
        """How the host issues the compute kernels: its interval (0: no op waits for it)
        and whether it enters each pass ahead (:mod:`llmsim.costs.host_issue`)."""
        ...


class HardwareCosts:
    """The hardware cost model of one plan on one system in one data type.

    Durations are memoised per distinct op, and monotone: more peak FLOP/s, HBM,
    fabric or network bandwidth never lengthens an op, and a bigger message never
    takes less time.
    """

    def __init__(
        self,
        system: System,
        plan: Plan,
        dtype: Dtype,
        calibration: Calibration | None = None,
        attention_kernel: AttentionKernel = "flash",
        power_limit_w: float | None = None,
        cuda_graphs: bool = False,
        parameter_servers: int = 1,
        token_dispatch: TokenDispatch | None = None,
        allocator: Allocator = "caching",
        host_path: HostPath = "bare",
        host_ahead: bool = False,
    ) -> None:
        accelerator = system.node.accelerator
        if not accelerator.supports(dtype):
            have = [k for k, v in accelerator.dense_tflops.model_dump().items() if v]
            raise UserError(
                f"training.precision: {dtype} is not supported by {accelerator.name}; "
                f"use one of {', '.join(have)}"
            )
        self.system, self.plan, self.dtype, self.calibration = system, plan, dtype, calibration
        gemm_table = GemmTable(calibration.gemm) if calibration and calibration.gemm else None
        table = (
            CollectiveTable(calibration.collectives)
            if calibration and calibration.collectives
            else None
        )
        if attention_kernel == "cudnn" and accelerator.cudnn_attention_fraction is None:
            raise UserError(
                f"training.attention_kernel: cudnn has no measured efficiency on "
                f"{accelerator.name}; use flash, or give the accelerator a "
                f"cudnn_attention_fraction"
            )
        missing = missing_measurement(accelerator, attention_kernel)
        if missing:
            raise UserError(missing)
        pages = PageRoundTrip(accelerator) if allocator == "glibc" else None
        self.compute = ComputeModel(accelerator, dtype, gemm_table, attention_kernel,
                                    power_limit_w, cuda_graphs, pages, host_path, host_ahead)
        self.retention = CoreRetention.of(system, plan.nodes, pages)
        """Wake-ups from the cores' retention state (``system.retention_state``,
        :mod:`llmsim.costs.retention`); None: the knob is off."""
        self.collectives = CollectiveModel(
            system, plan, launch_s=accelerator.kernel_launch_us * 1e-6, table=table
        )
        self.all_to_all = AllToAllModel(system, plan, launch_s=accelerator.kernel_launch_us * 1e-6,
                                        dispatch=token_dispatch)
        self.parameter_server = (
            ParameterServerModel(system, plan, parameter_servers,
                                 launch_s=accelerator.kernel_launch_us * 1e-6)
            if plan.parallelism.dp_mode == "parameter_server" else None)

    @classmethod
    def from_scenario(cls, scenario: Scenario, plan: Plan) -> HardwareCosts:
        """Costs of a validated scenario, with its calibration profile if it names one (read
        when the scenario loaded: :func:`llmsim.loader.calibration_profile`)."""
        calibration = (calibration_profile(scenario.calibration) if scenario.calibration
                       else None)
        training = scenario.training
        return cls(scenario.system, plan, training.precision, calibration,
                   training.attention_kernel, training.power_limit_w, training.cuda_graphs,
                   scenario.parallelism.parameter_servers,
                   TokenDispatch.of(scenario.model, scenario.parallelism), training.allocator,
                   training.host_path, host_runs_ahead(scenario.parallelism))

    @property
    def host_issue(self) -> HostIssue:
        """The host's issue of the compute kernels (:mod:`llmsim.costs.host_issue`)."""
        return self.compute.host_issue

    def compute_s(self, op: ComputeOp) -> float:
        """Duration of a compute op, seconds, with the gap of a host sync beside it
        (``op.host_s``) and, with ``system.retention_state``, a wake-up of the workers'
        cores after a long serial wait (:mod:`llmsim.costs.retention`)."""
        if self.retention is None:
            return self.compute.compute_s(op) + op.host_s
        return self.compute.compute_s(op) + op.host_s + self.retention.compute_s(op)

    def comm_s(self, op: CommOp) -> float:
        """Duration of a communication op, seconds.

        Its ``copies`` (one call per rank's slice) each cost a kernel launch, and together
        they read and write the whole message once at the memory-bound rate; each of its
        ``staging_passes`` is one kernel that reads and writes the whole message, each of
        its ``fill_passes`` one that writes it. Its ``host_s`` (host time before it can be
        issued, the device idle) adds as it is; with ``system.retention_state`` a collective
        longer than the OpenMP block time adds one wake-up (:mod:`llmsim.costs.retention`).
        """
        launches = op.copies + op.staging_passes + op.fill_passes
        message_passes = 2 * (op.staging_passes + (1 if op.copies else 0)) + op.fill_passes
        staging_s = (launches * self.compute.launch_s
                     + message_passes * op.bytes / self.compute.memory_bytes_per_s)
        if op.collective == "all_to_all":  # costs/alltoall.py: not a ring or a tree
            seconds = self.all_to_all.comm_s(op.axis, op.bytes, op.name) + staging_s + op.host_s
        elif op.collective == "push_pull":  # costs/parameter_server.py: through the servers
            if self.parameter_server is None:
                raise ValueError("a push_pull op needs parallelism.dp_mode parameter_server")
            seconds = self.parameter_server.comm_s(op.bytes) + staging_s + op.host_s
        else:
            seconds = self.collectives.comm_s(op) + staging_s + op.host_s
        if self.retention is None:
            return seconds
        return seconds + self.retention.comm_s(seconds)
