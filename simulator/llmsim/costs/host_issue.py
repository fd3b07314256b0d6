"""The host's kernel issue as a queue: when a pass's kernels start on the device.

A framework in eager mode (PyTorch without captured CUDA graphs) enqueues one kernel every
``h`` seconds of host time (its dispatch per op), and the device runs them in order on
one stream. The host runs ahead of the device while kernels are long (a 1 ms GEMM hides
about a hundred dispatches), so the dispatch is exposed only in stretches of short
kernels. Kernel ``i`` is issued at ``i·h`` (the first at 0, when the pass begins) and
starts at ``max(i·h, end of kernel i−1)``; its duration ``d_i`` already holds the device's
own per-kernel gap ``g`` (:attr:`HostIssue.kernel_gap_s`). Unrolled, the pass ends at

    end = max over k of ( k·h + Σ_{i≥k} d_i )

the latest issue after which the device never waits again (:func:`queue_end_s`, O(n) as a
running maximum from the back). ``h = 0`` (CUDA graphs: one launch replays the whole
step) gives ``Σ d_i``. Measured on one H100 SXM5 and its host (docs/calibration.md, "Host
issue"): eager in-place adds take 9.1 µs each (the host), 1.15 µs replayed from a graph; a
0.2 ms BF16 GEMM followed by 10 adds ends 25–28 µs after the GEMM alone (the GEMM hid
their dispatch, the device's own 2.5–2.8 µs per eager kernel remain), the same adds
issued before it add their whole dispatch.

Across passes: where nothing between two passes makes the host wait for the device (no
pipeline, or Megatron's overlapped pipeline messages, which skip the
``torch.cuda.synchronize()`` of its batched send/receive), the host enters a pass ahead
(:attr:`HostIssue.ahead`) and the kernels before the pass's first host sync never wait
(the host issued them while earlier passes ran); without ``ahead`` each pass starts with
an empty queue (an upper bound on the wait). A host slower than its device over whole
passes keeps no lead: without a pipeline the engine gives each pass the lead the pass
before it left (:func:`pass_queue`'s ``lead_s`` and its lead out, ``llmsim.engine.passes``;
a micro-batch's forward from a drained queue); with Megatron's overlapped pipeline messages
a pass is still entered ahead of every kernel before its first sync (a lower bound where
the host is the slower). A kernel that holds the host (``ComputeOp.host_held``, a sync
after it, or its steps' syncs to the last: ``host_held_tail``) has the host issue the next
kernel one dispatch after it lets the host go.
Left out: the device's limit of 1,024
pending launches (it only holds the host back while the device is behind, where the
device's own time decides the end); host syncs inside a pass other than the collectives
that declare one (``CommOp.host_s``), after which the host issues from the device's
position again; and the heavier host work of ops that are more than one dispatch (a
Transformer Engine module's Python, an optimizer's loop over tensors), which count one
dispatch per kernel here — except the kernels a framework's C++ loop launches inside one
call, which an op declares (``ComputeOp.host_loop_kernels``: Transformer Engine's
per-expert quantisations and cuBLAS GEMMs, :mod:`llmsim.moe_host`) and which cost the host
:attr:`HostIssue.loop_interval_s` each after the call's own dispatch. Kernels priced
outside a pass (a gradient bucket's, the optimizer step) do not queue.

Host work that is not a kernel's dispatch, priced per op where measured
(``training.host_path: hugging_face``, :class:`HostWork`): a reentrant checkpoint's
backward matmul nodes and FSDP's hooks, added to the host's time before the op's first
kernel (the op's ``ckpt_nodes`` and ``fsdp_hooks``, :mod:`llmsim.workload.host_work`).
Under ``modules`` only the FSDP hooks beyond one set a unit and pass are marked, the
others being part of the time per kernel.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from llmsim.errors import UserError
from llmsim.ops import CommOp, ComputeOp
from llmsim.specs import Accelerator, Parallelism
from llmsim.specs.training import HostPath

Op = ComputeOp | CommOp


@dataclass(frozen=True, slots=True)
class HostWork:
    """The host's work before an op beyond its kernels' dispatch, s, per unit of what the
    op declares (``ComputeOp.ckpt_nodes``, ``ComputeOp.fsdp_hooks``)."""

    ckpt_node_s: float = 0.0
    """Each backward matmul node of a layer a reentrant checkpoint recomputes, s."""
    fsdp_forward_s: float = 0.0
    """FSDP's hooks around one call of a unit's forward, s."""
    fsdp_backward_s: float = 0.0
    """FSDP's hooks around one unit's backward, s."""

    @classmethod
    def of(cls, accelerator: Accelerator) -> HostWork:
        """The accelerator's measured host work (``host_ckpt_node_us``,
        ``host_fsdp_forward_us``, ``host_fsdp_backward_us``; 0 where not measured)."""
        return cls(accelerator.host_ckpt_node_us * 1e-6,
                   accelerator.host_fsdp_forward_us * 1e-6,
                   accelerator.host_fsdp_backward_us * 1e-6)

    def op_s(self, op: Op) -> float:
        """The host's work before ``op`` beyond its dispatch, s (0 for a collective)."""
        if not isinstance(op, ComputeOp):
            return 0.0
        hooks = {None: 0.0, "forward": self.fsdp_forward_s,
                 "backward": self.fsdp_backward_s}[op.fsdp_hooks]
        return op.ckpt_nodes * self.ckpt_node_s + hooks


NO_WORK = HostWork()
"""No host work beyond the dispatch (the ``bare`` path, CUDA graphs)."""


@dataclass(frozen=True, slots=True)
class HostIssue:
    """How a step's compute kernels reach one accelerator: the device's gap per kernel and
    the host's dispatch interval, seconds."""

    kernel_gap_s: float
    """Device time each kernel adds to its own (launch and tail on the device), s."""
    interval_s: float
    """Host time between two kernels' issue (its dispatch per kernel), s; 0: the queue
    never waits for the host (CUDA graphs, or no measurement of the host)."""
    ahead: bool = False
    """Whether the host enters each pass ahead of the device: nothing between two passes
    waits for the device on the host (no pipeline send or receive that synchronises), so
    the host has issued a pass's kernels before the device reaches them, up to the pass's
    first host sync, as far as the passes before it left it ahead where the engine knows
    them (one chunk a device, ``llmsim.engine.passes``); False: each pass starts with an
    empty queue (an upper bound on the
    wait)."""
    loop_interval_s: float = 0.0
    """Host time of each kernel a framework's C++ loop launches inside one call
    (``ComputeOp.host_loop_kernels``), s: the bare eager dispatch ``host_dispatch_us``, the
    nearest measured figure (one PyTorch op issued from Python: argument parsing, the
    dispatcher and the launch; a C++ launch with its allocations, descriptors and output
    objects was not timed alone); 0 under CUDA graphs or where not measured."""
    work: HostWork = NO_WORK
    """The host's work before an op beyond its dispatch (``training.host_path:
    hugging_face``, and ``modules``' further FSDP hooks; none on ``bare`` and under CUDA
    graphs)."""

    @classmethod
    def of(cls, accelerator: Accelerator, cuda_graphs: bool,
           host_path: HostPath = "bare", ahead: bool = False) -> HostIssue:
        """The accelerator's queue: in eager mode each kernel costs the device
        ``kernel_launch_us`` and the host ``host_dispatch_us`` for bare PyTorch ops (0
        where not measured: no queue, the fixed cost alone) or ``host_module_dispatch_us``
        for a model's layers as Python modules under autograd (``training.host_path``);
        replayed from captured CUDA graphs (``training.cuda_graphs``) the device's
        ``graph_kernel_us`` and no host issue, whatever the path. ``ahead``: the host
        runs ahead across passes (:attr:`HostIssue.ahead`)."""
        if cuda_graphs:
            return cls(accelerator.graph_kernel_us * 1e-6, 0.0)
        interval_us = accelerator.host_dispatch_us
        if host_path != "bare":
            interval_us = accelerator.host_module_dispatch_us
            if interval_us <= 0:
                raise UserError(
                    f"training.host_path: {host_path} has no measured host time per kernel "
                    f"on {accelerator.name}; use bare, or give the accelerator a "
                    f"host_module_dispatch_us")
        work = NO_WORK
        if host_path == "hugging_face":
            work = HostWork.of(accelerator)
        elif host_path == "modules":  # its time per kernel holds the checkpoint's nodes
            work = replace(HostWork.of(accelerator), ckpt_node_s=0.0)
        return cls(accelerator.kernel_launch_us * 1e-6, interval_us * 1e-6, ahead,
                   accelerator.host_dispatch_us * 1e-6, work)

    def slower(self, other: HostIssue) -> HostIssue:
        """The slower of two hosts' issue (a message between node groups of different
        devices): the longer gap, interval and work, ahead only where both run ahead."""
        mine, theirs = self.work, other.work
        work = HostWork(max(mine.ckpt_node_s, theirs.ckpt_node_s),
                        max(mine.fsdp_forward_s, theirs.fsdp_forward_s),
                        max(mine.fsdp_backward_s, theirs.fsdp_backward_s))
        return HostIssue(max(self.kernel_gap_s, other.kernel_gap_s),
                         max(self.interval_s, other.interval_s), self.ahead and other.ahead,
                         max(self.loop_interval_s, other.loop_interval_s), work)


def host_runs_ahead(par: Parallelism) -> bool:
    """Whether the host enters each pass ahead of the device (:attr:`HostIssue.ahead`): with
    no pipeline (``pp`` 1) nothing between passes waits for the device, and with the
    pipeline's messages overlapped (``overlap_pp_comm``: Megatron-LM's
    ``--overlap-p2p-communication``, which sets ``batch_p2p_comm`` off) no
    ``torch.cuda.synchronize()`` follows a send or receive (``_communicate`` in
    megatron/core/pipeline_parallel/p2p_communication.py synchronises only for
    ``batch_p2p_comm and batch_p2p_sync``); blocking pipeline messages drain the queue."""
    return par.pp == 1 or par.overlap_pp_comm


def queue_end_s(durations_s: Sequence[float], interval_s: float) -> float:
    """When a sequence of kernels issued every ``interval_s`` from 0 ends on one stream:
    ``max over k of (k·h + Σ_{i≥k} d_i)`` (module docstring), 0 for no kernels."""
    end = suffix = 0.0
    for k in range(len(durations_s) - 1, -1, -1):
        suffix += durations_s[k]
        end = max(end, k * interval_s + suffix)
    return end


def queue_waits_s(durations_s: Sequence[float], interval_s: float,
                  syncs: Sequence[bool] | None = None, ahead: bool = False,
                  gaps_s: Sequence[float] | None = None) -> list[float]:
    """How long the device waits for the host before each kernel, s: kernel ``i`` starts at
    ``max(issue_i, end_{i−1})``, ``issue_i = issue_{i−1} + h`` (``h = gaps_s[i]`` where the
    host's time differs kernel by kernel, else ``interval_s``). A kernel marked in
    ``syncs`` is issued by a host that waited for the device to drain (a host sync): it
    starts at the end of the kernel before it, and the host issues from there on.
    ``sum(waits) + sum(durations)`` is :func:`queue_end_s` where nothing syncs. ``ahead``:
    the host issued every kernel before the first sync already (no wait before it)."""
    return queue_run(durations_s, interval_s, syncs, math.inf if ahead else 0.0, gaps_s)[0]


def queue_run(durations_s: Sequence[float], interval_s: float,
              syncs: Sequence[bool] | None = None, lead_s: float = 0.0,
              gaps_s: Sequence[float] | None = None,
              holds_s: Sequence[float | None] | None = None) -> tuple[list[float], float]:
    """:func:`queue_waits_s` for a host that enters ``lead_s`` ahead of the device (its
    first kernel issued at ``−lead_s``; ``math.inf``: every kernel before the first sync
    issued already), and the lead it leaves: the device's end less the time the host
    issues its next kernel (negative where the host is behind). A kernel with a value in
    ``holds_s`` holds the host until that many seconds before it ends on the device (a
    sync after it: 0; syncs at each of its steps: its last step's time): the next kernel
    is issued one dispatch after that."""
    waits = []
    issue, end = -lead_s, 0.0
    gap = interval_s
    for i, d in enumerate(durations_s):
        if i:
            gap = interval_s if gaps_s is None else gaps_s[i]
            held = None if holds_s is None else holds_s[i - 1]
            if syncs is not None and syncs[i]:
                issue = end
            elif held is not None:
                issue = end - held + gap
            else:
                issue += gap
        wait = max(issue - end, 0.0)
        waits.append(wait)
        end += wait + d
    if not waits:
        return waits, lead_s
    held = None if holds_s is None else holds_s[-1]
    return waits, end - ((issue if held is None else end - held) + interval_s)


def host_kernels(op: Op) -> int:
    """Host dispatches that issue ``op``: a collective one, a compute op one per kernel
    (``splits``) unless one call issues them all (``host_calls``)."""
    return (op.host_calls or op.splits) if isinstance(op, ComputeOp) else 1


def loop_kernels(op: Op) -> int:
    """Kernels a framework's C++ loop launches inside ``op``'s host calls, each a host
    launch of its own (``ComputeOp.host_loop_kernels``; none for a collective)."""
    return op.host_loop_kernels if isinstance(op, ComputeOp) else 0


def op_host_s(op: Op, interval_s: float, loop_interval_s: float = 0.0,
              work: HostWork = NO_WORK) -> float:
    """Host time that issues ``op``, s: its dispatches (:func:`host_kernels`) at
    ``interval_s``, its loop's kernels (:func:`loop_kernels`) at ``loop_interval_s`` and
    the host's work before it (:meth:`HostWork.op_s`)."""
    return (host_kernels(op) * interval_s + loop_kernels(op) * loop_interval_s
            + work.op_s(op))


def pass_waits_s(ops: Sequence[Op], durations_s: Sequence[float],
                 interval_s: float, ahead: bool = False,
                 loop_interval_s: float = 0.0, work: HostWork = NO_WORK) -> list[float]:
    """How long each of a pass's ops waits for the host's issue before it starts, s
    (:func:`pass_queue`, the host entering with no lead, or ahead of every kernel before
    the first sync where ``ahead``)."""
    return pass_queue(ops, durations_s, interval_s, math.inf if ahead else 0.0,
                      loop_interval_s, work)[0]


def pass_queue(ops: Sequence[Op], durations_s: Sequence[float], interval_s: float,
               lead_s: float = 0.0, loop_interval_s: float = 0.0,
               work: HostWork = NO_WORK) -> tuple[list[float], float]:
    """How long each of a pass's ops waits for the host's issue before it starts, s
    (:func:`queue_run` over its kernels), and the lead the host leaves the next pass: a
    compute op is as many kernels of equal length as the host dispatches that issue it
    (:func:`host_kernels`), each issued ``interval_s`` after the one before, then the
    kernels its C++ loop launches (:func:`loop_kernels`), ``loop_interval_s`` apart, the
    first after the host's work before the op (``work``, :meth:`HostWork.op_s`); a
    collective one kernel; an op with a ``host_s`` is issued by a host that waited for the
    device (a host sync), and one marked ``host_held`` holds the host until it ends;
    ``lead_s``: how far ahead of the device the host enters (``math.inf``: ahead of every
    kernel before the first sync, :attr:`HostIssue.ahead`). No op shorter than its host
    time (:func:`op_host_s`) and none holding the host: none waits (each keeps the
    host's issue ahead by its excess)."""
    worked = work is not NO_WORK
    for op, d in zip(ops, durations_s, strict=True):  # op_host_s, inlined: every pass asks
        if isinstance(op, ComputeOp):
            if op.host_held or d < ((op.host_calls or op.splits) * interval_s
                                    + op.host_loop_kernels * loop_interval_s
                                    + (work.op_s(op) if worked else 0.0)):
                break
        elif d < interval_s:
            break
    else:
        return [0.0] * len(ops), _lead_left_s(ops, durations_s, interval_s, lead_s,
                                              loop_interval_s, work)
    kernels: list[float] = []
    syncs: list[bool] = []
    holds: list[float | None] = []
    owner: list[int] = []
    looped = False
    for i, (op, d) in enumerate(zip(ops, durations_s, strict=True)):
        n = host_kernels(op)
        if isinstance(op, ComputeOp) and op.host_loop_kernels:
            n += op.host_loop_kernels
            looped = True
        kernels += [d / n] * n
        syncs += [op.host_s > 0] + [False] * (n - 1)
        held = isinstance(op, ComputeOp) and op.host_held
        holds += [None] * (n - 1) + [op.host_held_tail * (d - op.host_s) if held else None]
        owner += [i] * n
    gaps = None
    if looped or worked:  # the dispatches at the interval, then the loop's kernels
        gaps = []
        for op in ops:
            first = len(gaps)
            gaps += [interval_s] * host_kernels(op) + [loop_interval_s] * loop_kernels(op)
            gaps[first] += work.op_s(op)
    waits = [0.0] * len(ops)
    queued, lead_out = queue_run(kernels, interval_s, syncs, lead_s, gaps, holds)
    for i, wait in zip(owner, queued, strict=True):
        waits[i] += wait
    return waits, lead_out


def _lead_left_s(ops: Sequence[Op], durations_s: Sequence[float], interval_s: float,
                 lead_s: float, loop_interval_s: float, work: HostWork = NO_WORK) -> float:
    """The lead a pass in which no op waits leaves the next: its device time less the
    time its host issues the next kernel (from the pass's last host sync on)."""
    if math.isinf(lead_s):
        start = next((i for i, op in enumerate(ops) if op.host_s > 0), None)
        if start is None:
            return math.inf
        issue, t = sum(durations_s[:start]), sum(durations_s[:start])
        ops, durations_s = ops[start:], durations_s[start:]
    else:
        issue, t = -lead_s, 0.0
    for op, d in zip(ops, durations_s, strict=True):
        if op.host_s > 0:
            issue = t
        issue += op_host_s(op, interval_s, loop_interval_s, work)
        t += d
    return t - issue
