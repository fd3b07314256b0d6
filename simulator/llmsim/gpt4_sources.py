"""The source documents' days-to-GPT-4 table (``brief.md``, "Scaling and the days-to-GPT-4
table": a Tokyo Tech colloquium talk, 2024): its machines, accelerator counts, days and
efficiency factors, and its method recomputed with the catalog's peaks
(:func:`source_method_days`). :mod:`llmsim.gpt4` sets llmsim's answer beside it."""

from __future__ import annotations

from dataclasses import dataclass

from llmsim.errors import UserError

SECONDS_PER_DAY = 86_400.0


@dataclass(frozen=True)
class Part:
    """Accelerators of one kind in the source's count."""

    system: str
    """Catalog system these accelerators sit in."""
    packages: int
    """Accelerators as the source counts them (GPU packages, CPUs)."""
    devices_per_package: int
    """llmsim devices per counted accelerator: 2 for MI250X (GCDs) and Ponte Vecchio
    (stacks), 1 otherwise (hardware/accelerators/*.yaml)."""
    precision: str
    """Data type of the peak the source's method multiplies."""


@dataclass(frozen=True)
class SourceRow:
    """One machine of the source's days-to-GPT-4 table (``brief.md``)."""

    system: str
    """Short name, used by ``--systems``."""
    scenario: str
    """Catalog scenario whose model, training and framework settings the search keeps."""
    label: str
    """The machine as the source names it, with its accelerator count."""
    parts: tuple[Part, ...]
    """The source's accelerators; the first is the part llmsim simulates."""
    source_days: float
    """Days to train GPT-4 in the source's table."""
    source_doubtful: bool
    """The source marks its number with "(?)"."""
    factor: float
    """Efficiency factor applied to the days at peak: the source's where it states one."""
    factor_stated: bool
    """Whether the source states the factor (else: assumed here, see ``docs/gpt4.md``)."""
    note: str = ""
    """What else makes llmsim's row differ from the source's (one clause)."""
    max_tp: int | None = None
    """Largest TP degree searched (None: the search's default, a node's devices or 8)."""
    hand_layout: bool = False
    """A heterogeneous machine (:func:`run_hand_layout`): the catalog scenario's own
    placement and the placements searched on its node groups
    (:mod:`llmsim.search.placement_search`), each run by the engine, instead of the
    layout search of one group."""
    max_layouts: int | None = None
    """Core layouts sampled on this machine when ``--max-layouts`` is not given (None:
    the whole space)."""


GPU_FACTOR = 2.0
"""Assumed for the GPU machines whose factor the source does not state: the "×2" it
applies to OpenAI's A100 cluster, the only GPU machine it gives one for (brief.md)."""

SOURCE_TABLE: tuple[SourceRow, ...] = (
    SourceRow("openai", "openai-a100", "OpenAI A100 ×25,000",
              (Part("openai-a100", 25_000, 1, "bf16"),), 90, True, 2.0, True),
    SourceRow("frontier", "frontier", "Frontier MI250X ×37,888",
              (Part("frontier", 37_888, 2, "bf16"),), 75, False, GPU_FACTOR, False),
    SourceRow("lumi", "lumi", "LUMI MI250X ×20,480",
              (Part("lumi", 20_480, 2, "bf16"),), 140, False, GPU_FACTOR, False),
    SourceRow("aurora", "aurora", "Aurora Ponte Vecchio ×63,744",
              (Part("aurora", 63_744, 2, "bf16"),), 30, True, GPU_FACTOR, False),
    SourceRow("fugaku", "fugaku", "Fugaku A64FX ×158,976",
              (Part("fugaku", 158_976, 1, "fp32"),), 2_100, False, 4.0, True,
              "FP32 on both sides, as the Fugaku-LLM 13B production run trained (fugaku.yaml)",
              max_tp=12),  # the 2x3x2 Tofu unit, the catalog scenario's TP group
    SourceRow("abci", "abci", "ABCI A100 ×960 + V100 ×4,352",
              (Part("abci-a100", 960, 1, "bf16"), Part("abci-v100", 4_352, 1, "fp16")),
              770, False, GPU_FACTOR, False,
              "the heterogeneous job (A100 and V100 node groups in one job, FP16): its "
              "placement of stages or replicas on the groups searched and run by the engine",
              hand_layout=True),
)
"""The source's table (brief.md: machine, accelerators, days) and its method's factors."""

SYSTEMS = tuple(r.system for r in SOURCE_TABLE)


def part_peak_flops(part: Part) -> float:
    """Peak FLOP/s of all of a part's accelerators at its precision, from the catalog's
    sourced dense peaks (``hardware/accelerators/*.yaml``)."""
    from llmsim import loader

    accel = loader.load_spec("systems", part.system).node.accelerator
    return accel.peak_flops(part.precision) * part.devices_per_package * part.packages


def source_method_days(flops: float, peak_flops: float, factor: float) -> float:
    """The source's method: days at peak (``flops / peak``) times its efficiency factor.

    brief.md: "At peak, Fugaku (FP32 6.76 TFLOP/s × 158,976 = 1.07 EFLOP/s) would need
    328 days for GPT-4, '×4' for realistic efficiency; OpenAI's cluster (BF16 312 TFLOP/s
    × 25,000 = 7.8 EFLOP/s) 45 days '×2'."
    """
    return flops / peak_flops / SECONDS_PER_DAY * factor


def select(systems: str | None) -> list[SourceRow]:
    """The rows ``--systems a,b`` names (all when None), in the source's order."""
    if systems is None:
        return list(SOURCE_TABLE)
    names = [s.strip() for s in systems.split(",") if s.strip()]
    unknown = [n for n in names if n not in SYSTEMS]
    if unknown or not names:
        raise UserError(f"--systems: {systems!r} names {', '.join(unknown) or 'no system'}; "
                        f"use a comma-separated list of {', '.join(SYSTEMS)}")
    return [r for r in SOURCE_TABLE if r.system in names]
