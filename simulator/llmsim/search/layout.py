"""A point of the layout space: the part of a scenario the search varies.

A :class:`Layout` holds the degrees (tp, pp, dp, virtual stages, ep, cp), the schedule,
the micro-batch, the ZeRO stage, recompute, sequence parallelism, the overlap switches,
the nodes used and the global batch. Everything else (the framework's behaviour: bucket
size, rank order, gather style, …) is the scenario's. :mod:`.space` enumerates layouts;
:mod:`.layout_scenario` turns one into a validated scenario.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from llmsim.specs import Scenario

SWITCHES = ("overlap_dp_comm", "overlap_tp_comm", "overlap_pp_comm", "overlap_param_gather")
"""The overlap switches the search varies."""


@dataclass(frozen=True, slots=True, order=True)
class Layout:
    """One point of the layout space."""

    nodes: int
    tp: int
    pp: int
    dp: int
    virtual_stages: int
    schedule: str
    micro_batch: int
    zero: int
    sequence_parallel: bool
    recompute: str
    overlap_dp_comm: bool
    overlap_tp_comm: bool
    overlap_pp_comm: bool
    overlap_param_gather: bool
    global_batch: int
    ep: int = 1
    """Expert-parallel degree (MoE models)."""
    cp: int = 1
    """Context-parallel degree."""
    parameter_servers: int = 0
    """Parameter servers the gradients go through (``dp_mode: parameter_server``); 0: the
    data-parallel ranks all-reduce them."""
    expert_tp: int = 0
    """Tensor-parallel degree of the routed experts (MoE models): ``tp`` (each expert split
    like the dense MLP) or 1 (whole experts over tp·ep ranks); 0: as the base scenario
    has it (its expert_tp 1 kept, one equal to its tp following the layout's tp)."""
    moe_a2a_overlap: bool = False
    """Hide the MoE all-to-alls behind the other micro-batch's computation
    (``parallelism.moe_a2a_overlap``, Megatron-Core ``--overlap-moe-expert-parallel-comm``;
    :func:`.space.a2a_overlap_allowed` says where the search tries it)."""

    @property
    def key(self) -> str:
        """A stable text key (the store's primary key): ``tp8.pp8.dp16.v1.1f1b.mb1…``."""
        return (f"n{self.nodes}.tp{self.tp}.pp{self.pp}.dp{self.dp}.v{self.virtual_stages}."
                f"{self.schedule}.mb{self.micro_batch}.z{self.zero}."
                f"sp{int(self.sequence_parallel)}.{self.recompute}.o{int(self.overlap_dp_comm)}"
                f"{int(self.overlap_tp_comm)}{int(self.overlap_pp_comm)}"
                f"{int(self.overlap_param_gather)}.gb{self.global_batch}"
                + (f".ep{self.ep}" if self.ep > 1 else "")
                + (f".cp{self.cp}" if self.cp > 1 else "")
                + (f".ps{self.parameter_servers}" if self.parameter_servers else "")
                + (f".etp{self.expert_tp}" if self.expert_tp else "")
                + (".a2a" if self.moe_a2a_overlap else ""))

    def __reduce__(self) -> tuple[type, tuple[Any, ...]]:
        """Pickled as its field values, made again by ``__init__`` (the search sends
        hundreds of thousands of layouts to its workers): a third of the default's time
        to write (a dict of the fields per layout) and about half its time to read (a
        ``setattr`` per field)."""
        return Layout, (self.nodes, self.tp, self.pp, self.dp, self.virtual_stages,
                        self.schedule, self.micro_batch, self.zero, self.sequence_parallel,
                        self.recompute, self.overlap_dp_comm, self.overlap_tp_comm,
                        self.overlap_pp_comm, self.overlap_param_gather, self.global_batch,
                        self.ep, self.cp, self.parameter_servers, self.expert_tp,
                        self.moe_a2a_overlap)

    def variant(self, overlap_tp_comm: bool, overlap_pp_comm: bool,
                overlap_param_gather: bool, moe_a2a_overlap: bool) -> Layout:
        """This layout with those overlap switches (itself where they are its own):
        ``dataclasses.replace``'s result, made without its generic pass over the fields."""
        if (overlap_tp_comm is self.overlap_tp_comm and overlap_pp_comm is self.overlap_pp_comm
                and overlap_param_gather is self.overlap_param_gather
                and moe_a2a_overlap is self.moe_a2a_overlap):
            return self
        return Layout(self.nodes, self.tp, self.pp, self.dp, self.virtual_stages,
                      self.schedule, self.micro_batch, self.zero, self.sequence_parallel,
                      self.recompute, self.overlap_dp_comm, overlap_tp_comm, overlap_pp_comm,
                      overlap_param_gather, self.global_batch, self.ep, self.cp,
                      self.parameter_servers, self.expert_tp, moe_a2a_overlap)

    @property
    def devices(self) -> int:
        """Devices the layout uses."""
        return self.tp * self.pp * self.dp * self.ep * self.cp

    def parallelism_updates(self) -> dict[str, Any]:
        """The ``parallelism`` fields this layout sets."""
        return {"tp": self.tp, "pp": self.pp, "dp": self.dp,
                "virtual_stages": self.virtual_stages, "schedule": self.schedule,
                "micro_batch": self.micro_batch, "zero": self.zero,
                "sequence_parallel": self.sequence_parallel, "recompute": self.recompute,
                "overlap_dp_comm": self.overlap_dp_comm,
                "overlap_tp_comm": self.overlap_tp_comm,
                "overlap_pp_comm": self.overlap_pp_comm,
                "overlap_param_gather": self.overlap_param_gather, "ep": self.ep,
                "cp": self.cp, "moe_a2a_overlap": self.moe_a2a_overlap,
                "dp_mode": "parameter_server" if self.parameter_servers else "all_reduce",
                **({"parameter_servers": self.parameter_servers}
                   if self.parameter_servers else {}),
                **({"expert_tp": None if self.expert_tp == self.tp else self.expert_tp}
                   if self.expert_tp else {})}

    def as_dict(self) -> dict[str, Any]:
        """Plain values, for a table row."""
        return {"nodes": self.nodes, **self.parallelism_updates(),
                "parameter_servers": self.parameter_servers, "global_batch": self.global_batch,
                "expert_tp": self.expert_tp}

    @property
    def replicas(self) -> int:
        """Pipelines that each run their own micro-batches: dp·ep (expert-parallel ranks
        hold different sequences)."""
        return self.dp * self.ep


LAYOUT_FIELDS = tuple(f.name for f in fields(Layout))


def layout_of(scenario: Scenario) -> Layout:
    """The layout a scenario already has (its point in the space)."""
    par = scenario.parallelism
    return Layout(scenario.nodes_used, par.tp, par.pp, scenario.dp, par.virtual_stages,
                  par.schedule, par.micro_batch, par.zero, par.sequence_parallel,
                  par.recompute, par.overlap_dp_comm, par.overlap_tp_comm,
                  par.overlap_pp_comm, par.overlap_param_gather, scenario.training.global_batch,
                  par.ep, par.cp,
                  par.parameter_servers if par.dp_mode == "parameter_server" else 0,
                  par.etp if scenario.model.moe is not None else 0, par.moe_a2a_overlap)

