"""Reliability spec: how often the parts of a machine interrupt a job, and the restart.

The defaults are the Llama 3 405B pre-training log (Llama Team, "The Llama 3 Herd of
Models", arXiv:2407.21783, §3.3.4 and Table 5): 419 unexpected interruptions in a
54-day snapshot on 16,384 H100 GPUs (2,048 nodes of 8, one 400 Gb/s NIC per GPU), taken
as 54 × 24 = 1,296 hours on all 16,384 GPUs. The table's causes are grouped by the part
whose count a job's rate scales with:

* device (268): faulty GPU 148, GPU HBM3 memory 72, GPU SRAM memory 19, GPU system
  processor 17, silent data corruption 6, GPU thermal interface and sensor 6
  → 268 / (16,384 × 1,296 h) = 1.262e-5 per GPU-hour = 12,621 FIT;
* node (109): host maintenance 32, SSD 3, power supply 3, server chassis 2, IO expansion
  board 2, CPU 2, system memory 2, and the job's software — software bug 54, dependency
  2, NCCL watchdog timeouts 7 (cause unknown) — counted per node
  → 109 / (2,048 × 1,296 h) = 4.107e-5 per node-hour = 41,067 FIT;
* link (42): network switch or cable 35, NIC 7, one link per NIC
  → 42 / (16,384 × 1,296 h) = 1.978e-6 per link-hour = 1,978 FIT.

At 16,384 GPUs the three add up to the log's 419 / 1,296 h = 0.323 interruptions per hour
(one every 3.1 hours).
"""

from __future__ import annotations

from pydantic import Field

from llmsim.specs._base import Spec

FIT_HOURS = 1e9
"""A FIT is one failure per 10⁹ component-hours."""

LLAMA3_DEVICE_FIT = 268 / (16_384 * 1_296) * FIT_HOURS
"""Device interruptions of the Llama 3 log per 10⁹ GPU-hours (module docstring)."""
LLAMA3_NODE_FIT = 109 / (2_048 * 1_296) * FIT_HOURS
"""Host and software interruptions of the Llama 3 log per 10⁹ node-hours."""
LLAMA3_LINK_FIT = 42 / (16_384 * 1_296) * FIT_HOURS
"""Network interruptions of the Llama 3 log per 10⁹ NIC-link-hours."""

RESTART_S = 600.0
"""Default time from an interruption to training again, before reloading the checkpoint:
an assumption of the order of PyTorch's default NCCL watchdog timeout, 10 minutes
(``torch.distributed``'s ``default_pg_nccl_timeout``), the time a hung collective takes to
be noticed; relaunching and initialising a large job takes minutes as well. Not measured
for any catalog system. The Llama 3 log bounds it: "higher than 90 % effective training
time" over the 54-day snapshot with 466 interruptions (419 unexpected, 47 planned; Llama
Team 2024, §3.3.4) leaves at most 0.10 × 54 × 24 h / 466 = 16.7 minutes per interruption
for everything it cost — detection, relaunch, reload, the work redone since the last
checkpoint — and the checkpoints' own time; 10 minutes of restart fits inside it."""


class Reliability(Spec):
    """Failure rates of a system's parts (each stops the whole synchronous job) and the
    time to restart. Rates are FIT: failures per 10⁹ hours of one part."""

    device_fit: float = Field(default=LLAMA3_DEVICE_FIT, ge=0)
    """Interruptions caused by one device (GPU, its memory, its firmware), per 10⁹
    device-hours. Default: the Llama 3 log, 12,621."""
    node_fit: float = Field(default=LLAMA3_NODE_FIT, ge=0)
    """Interruptions caused by one node's host (CPU, memory, power, disks, maintenance) or
    by the job's software on it, per 10⁹ node-hours. Default: the Llama 3 log, 41,067."""
    link_fit: float = Field(default=LLAMA3_LINK_FIT, ge=0)
    """Interruptions caused by one network link (NIC, cable, switch port; one per NIC),
    per 10⁹ link-hours. Default: the Llama 3 log, 1,978."""
    restart_s: float = Field(default=RESTART_S, ge=0)
    """Time from an interruption to the relaunched job starting to reload its checkpoint
    (detection, rescheduling, initialisation), seconds. Default 600 (an assumption)."""

    def failures_per_s(self, devices: int, nodes: int, links: int) -> float:
        """Interruption rate of a job on ``devices`` devices, ``nodes`` nodes and ``links``
        network links, per second: the parts fail independently and any one stops the job,
        so the rates add (a series system)."""
        fit = devices * self.device_fit + nodes * self.node_fit + links * self.link_fit
        return fit / FIT_HOURS / 3600.0
