"""Wake-ups of idle CPU cores from Fugaku's retention state (the ``retention_state`` knob).

RIKEN's Fugaku user guide (1.49, §7 "Power control function") says of the power knob
``retention_state`` (1 by default for jobs of up to 9,216 nodes, 0 and not changeable
above): a core "transitions to a lower power state (Retention State) when no processes
are running on the core", and "it takes approximately 3 ms to transition to the Run
state" (the accelerator's ``retention_wake_ms``). So a core pays a wake-up only where its
thread has left it: where the OS has nothing to run there.

In a PyTorch process of one OpenMP team (the Fugaku rows: one process of 48 or 12 threads)
the worker threads are the ones that leave their cores. Between two parallel regions a
worker waits for the next one by spinning, and goes to sleep only after the runtime's
block time, ``KMP_BLOCKTIME``: 200 ms by default in LLVM's libomp (``KMP_DEFAULT_BLOCKTIME
(200)``, "__kmp_blocktime is in milliseconds", ``openmp/runtime/src/kmp.h``, unchanged from
2016, reviews.llvm.org/D25102, to 2021, D113012, except 0 on hybrid x86 CPUs), which the
rows' PyTorch links (``-Nlibomp``, fujitsu/pytorch ``scripts/fujitsu/2_python.sh``); the
rows set neither ``KMP_BLOCKTIME`` nor ``OMP_WAIT_POLICY``. The workers wait while the
main thread works alone: each kernel's launch, the ``munmap`` of a glibc-mapped output
(:mod:`llmsim.costs.allocator`), and every collective, which the MPI backend runs on the
calling thread. A wait longer than the block time puts the workers to sleep, their cores
into retention, and the next parallel region starts one wake-up later (the cores wake
together, so one wake-up per wait, not one per core).

The count is llmsim's own: one wake-up per op whose serial wait exceeds the block time
(:meth:`CoreRetention.wakeups`), priced at the sourced latency. Not counted: waits the
engine makes (a pipeline stage idle for its neighbour, a rank for a straggler), which are
not an op's; and the main thread's own core, which polls in MPI and never leaves. The
block time of Fujitsu's build of the runtime was not found: upstream's is assumed.
"""

from __future__ import annotations

from collections.abc import Iterable

from llmsim.costs.allocator import GLIBC_MMAP_THRESHOLD_MAX_BYTES, PageRoundTrip
from llmsim.errors import UserError
from llmsim.ops import ComputeOp
from llmsim.specs import System

OMP_BLOCKTIME_S = 0.200
"""How long an idle OpenMP worker spins before it sleeps, seconds: LLVM libomp's
``KMP_DEFAULT_BLOCKTIME`` (200 ms, ``openmp/runtime/src/kmp.h``; reviews.llvm.org/D25102
and D113012), the runtime the rows' PyTorch links; ``OMP_WAIT_POLICY=passive`` would make
it 0 (D18577)."""

RETENTION_MAX_NODES = 9216
"""Largest Fugaku job whose cores may enter retention: above it ``retention_state`` is 0
and cannot be changed (RIKEN Fugaku user guide 1.49, §7, note 1)."""


def wakeups(waits_s: Iterable[float], blocktime_s: float = OMP_BLOCKTIME_S) -> int:
    """Wake-ups a run of serial waits costs: one per wait longer than ``blocktime_s``."""
    return sum(1 for w in waits_s if w > blocktime_s)


class CoreRetention:
    """The wake-ups of a process's worker cores under ``retention_state: true``, seconds
    per op."""

    def __init__(self, wake_s: float, launch_s: float, page_round_trip: PageRoundTrip | None,
                 blocktime_s: float = OMP_BLOCKTIME_S) -> None:
        self.wake_s = wake_s
        """One wake-up from retention, seconds (the accelerator's ``retention_wake_ms``)."""
        self.launch_s = launch_s
        """The main thread's time per kernel launched, seconds (``kernel_launch_us``)."""
        self.unmap_bytes_per_s = (page_round_trip.unmap_bytes_per_s
                                  if page_round_trip is not None else None)
        """The main thread's ``munmap`` rate of glibc-mapped outputs, bytes/s; None: the
        framework caches its memory (no unmap)."""
        self.blocktime_s = blocktime_s
        """How long the workers spin before they sleep, seconds."""

    @classmethod
    def of(cls, system: System, job_nodes: int,
           page_round_trip: PageRoundTrip | None) -> CoreRetention | None:
        """The system's retention under its ``retention_state`` knob (None when off).

        Raises :class:`UserError` when the knob is on for a device without a measured
        wake-up or for a job of more nodes than Fugaku allows it on.
        """
        if not system.retention_state:
            return None
        accelerator = system.node.accelerator
        if accelerator.retention_wake_ms is None:
            raise UserError(
                f"system.retention_state: true needs {accelerator.name}'s wake-up time from "
                "retention (retention_wake_ms) and it has none; set system.retention_state: "
                "false, or add retention_wake_ms to the accelerator"
            )
        if job_nodes > RETENTION_MAX_NODES:
            raise UserError(
                f"system.retention_state: true on {job_nodes} nodes; Fugaku allows it on jobs "
                f"of at most {RETENTION_MAX_NODES:,} nodes (above, the knob is 0), so set "
                "system.retention_state: false or use fewer nodes"
            )
        return cls(accelerator.retention_wake_ms * 1e-3, accelerator.kernel_launch_us * 1e-6,
                   page_round_trip, OMP_BLOCKTIME_S)

    def compute_wait_s(self, op: ComputeOp) -> float:
        """Seconds the workers wait on the main thread before ``op``'s parallel region: its
        launches, and the ``munmap`` of its output where glibc maps it."""
        wait = op.splits * self.launch_s
        if self.unmap_bytes_per_s is not None and op.output_bytes >= GLIBC_MMAP_THRESHOLD_MAX_BYTES:
            wait += op.output_bytes / self.unmap_bytes_per_s
        return wait

    def compute_s(self, op: ComputeOp) -> float:
        """Wake-up seconds ``op`` adds: one wake-up if its serial wait exceeds the block
        time, else 0."""
        return self.wake_s * wakeups((self.compute_wait_s(op),), self.blocktime_s)

    def comm_s(self, seconds: float) -> float:
        """Wake-up seconds a collective of ``seconds`` adds: the workers wait it out on the
        calling thread, so one wake-up if it is longer than the block time, else 0."""
        return self.wake_s * wakeups((seconds,), self.blocktime_s)
