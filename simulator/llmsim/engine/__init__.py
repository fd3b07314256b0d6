"""The SimPy engine: replays one training step of a workload on devices and streams.

Each simulated device has four streams (design §7): ``compute`` (kernels, and the
blocking tensor-parallel collectives, recorded on ``tp``), ``pp`` (pipeline sends) and
``dp`` (gradient and ZeRO collectives, overlapping the backward when enabled).

Symmetry (``fidelity="reduced"``): all data-parallel replicas and all tensor-parallel
ranks of a stage do the same thing at the same time, so one device per pipeline stage
is simulated and collectives spanning the others are priced by the cost model; the cost
of a simulation does not grow with the DP degree. ``fidelity="full"`` simulates every
device, with collectives as barriers among their group members, to check the reduction.

A pipeline action (the forward, input-gradient or weight-gradient pass of one chunk for
one micro-batch) is one SimPy timeout; its per-op spans are kept as offsets in the
chunk's block template (:mod:`llmsim.blocks`) and expanded only when a trace
(:mod:`llmsim.trace`) is asked for.

The parts (docs/engine.md draws them):

- :mod:`~llmsim.engine.replay`: :class:`Engine`, one process per device walking its
  schedule;
- :mod:`~llmsim.engine.passes`: each pass priced once and recorded in parts;
- :mod:`~llmsim.engine.uncontended`: the same step without SimPy where nothing contends,
  with :mod:`~llmsim.engine.uncontended_buckets` for the gradient buckets and
  :mod:`~llmsim.engine.uncontended_gathers` for ZeRO's weight gathers;
- :mod:`~llmsim.engine.contended`: the same where posted pipeline operations or
  collectives hold compute units, with :mod:`~llmsim.engine.contended_units` for the
  passes' rates and the ``dp`` stream and :mod:`~llmsim.engine.contended_messages` for
  the pipeline messages;
- :mod:`~llmsim.engine.streams`: the streams and the compute units other kernels hold;
- :mod:`~llmsim.engine.devices`: which devices are simulated;
- :mod:`~llmsim.engine.pipeline`: the messages between pipeline stages;
- :mod:`~llmsim.engine.gradients`: the gradient buckets' reductions;
- :mod:`~llmsim.engine.gathers`: the ZeRO weight gathers;
- :mod:`~llmsim.engine.replicas`: the gradient all-reduce of two pipelines' weight
  replicas (Chimera, DualPipe).
"""

from llmsim.blocks import Block, CostModel
from llmsim.engine.devices import Device, devices_for
from llmsim.engine.replay import Engine
from llmsim.trace import Record, Trace

__all__ = ["Block", "CostModel", "Device", "Engine", "Record", "Trace", "devices_for"]
