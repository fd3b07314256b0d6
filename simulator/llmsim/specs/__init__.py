"""Typed, validated specs: the inputs of every simulation."""

from llmsim.specs.accelerator import Accelerator, DenseTflops, Dtype, GemmModel, MemoryKind
from llmsim.specs.calendar import Calendar
from llmsim.specs.clocks import SustainedClocks
from llmsim.specs.collectives import CollectiveLibrary
from llmsim.specs.jitter import Jitter
from llmsim.specs.model import Model
from llmsim.specs.network import Dragonfly, FatTree, Network, Torus
from llmsim.specs.node import FabricTier, Node
from llmsim.specs.parallelism import Parallelism, ScheduleName
from llmsim.specs.power import DevicePower, Facility
from llmsim.specs.reliability import Reliability
from llmsim.specs.scenario import Scenario
from llmsim.specs.storage import Storage
from llmsim.specs.system import System
from llmsim.specs.training import AttentionKernel, Training

__all__ = [
    "Accelerator",
    "AttentionKernel",
    "Calendar",
    "CollectiveLibrary",
    "DenseTflops",
    "DevicePower",
    "Dragonfly",
    "Dtype",
    "FabricTier",
    "Facility",
    "FatTree",
    "GemmModel",
    "Jitter",
    "MemoryKind",
    "Model",
    "Network",
    "Node",
    "Parallelism",
    "Reliability",
    "Scenario",
    "ScheduleName",
    "Storage",
    "SustainedClocks",
    "System",
    "Torus",
    "Training",
]
