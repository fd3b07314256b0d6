"""What the switch variants of one core layout share, looked up once per core.

The search prices every core layout with each allowed combination of its overlap
switches (:func:`~llmsim.search.space.switch_variants`): up to 8 layouts that differ only
in ``overlap_tp_comm``, ``overlap_pp_comm``, ``overlap_param_gather``,
``moe_a2a_overlap`` (and the ``moe_comm_units``, ``moe_shared_expert_overlap`` that
follow it). Most of a layout's inputs to the estimate read none of those, or only one:
the placement's plan, costs, stage nodes, split and runs read the contention switches
(:func:`~llmsim.search.parts.contention_key`); the layer shape's blocks and the kinds'
passes read the TP and MoE overlaps too. Each is a memo hit for the second variant
already, but the hit costs its key — a dozen to twenty fields read and hashed — and the
estimator met seven such lookups a layout. :class:`CoreParts` keeps them in a small dict
per core (``core``, owned by the caller that prices the variants,
:func:`~llmsim.search.price.price_batch`), keyed on only the switches each reads: the
same objects the memos give, so the same estimate, bit for bit (tested).
"""

from __future__ import annotations

from typing import Any

from llmsim.costs import HardwareCosts
from llmsim.ops import CommOp
from llmsim.search.parts import contention_key, servers
from llmsim.search.stage_kinds import StageKinds
from llmsim.specs import Scenario
from llmsim.workload import Workload, step_traffic


class CoreParts(StageKinds):
    """The estimator's inputs that one core layout's switch variants share."""

    def _placed(self, sc: Scenario, core: dict | None) -> tuple:
        """(plan, costs, plan key, split, first layers, stage nodes, placement, per stage
        its placed sends, runs) of ``sc``: what reads only the contention switches of the
        varied ones, from ``core`` (a core layout's variants' dict; None: none)."""
        par = sc.parallelism
        key = contention_key(par)
        hit = core.get(key) if core is not None else None
        if hit is None:
            p, v = par.pp, par.virtual_stages
            plan, costs = self.plan_costs(sc)
            plan_key = (self._family(sc), sc.nodes_used, par.tp, p, sc.dp, par.ep, par.cp,
                        par.etp, *key, servers(sc))
            split = self._split(sc)
            starts = self._first_layers(sc, split)
            node_of = self._nodes_of_stages(plan_key, plan)
            hops, placed_sends = self._placement(par.schedule, p, v)  # () for c·p + s
            runs = self._runs(plan_key, split, node_of, placed_sends)
            hit = (plan, costs, plan_key, split, starts, node_of, hops, placed_sends, runs)
            if core is not None:
                core[key] = hit
        return hit

    def _shape(self, sc: Scenario, placed: tuple, core: dict | None, m: int,
               a: int) -> tuple:
        """(the layer shape's :class:`~llmsim.search.parts.Parts`, the kinds' passes
        :meth:`_kind_passes`) of ``sc`` on ``placed`` (:meth:`_placed`), from ``core``:
        they read the contention, TP and MoE overlaps of the varied switches and the
        accumulation's first micro-batch ``a`` (``m`` is the core's)."""
        par = sc.parallelism
        key = (*contention_key(par), par.overlap_tp_comm, par.moe_a2a_overlap,
               par.moe_shared_expert_overlap, par.moe_comm_units, a)
        hit = core.get(key) if core is not None else None
        if hit is None:
            plan, costs, plan_key, split, starts, node_of = placed[:6]
            parts = self._layer_parts(sc, plan, costs)
            hit = (parts, self._kind_passes(sc, plan_key, costs, parts, split, starts,
                                            node_of, m, a))
            if core is not None:
                core[key] = hit
        return hit

    def _traffic(self, sc: Scenario, core: dict | None) -> Workload:
        """:func:`~llmsim.workload.step_traffic` of ``sc``, from ``core``: of the varied
        switches it reads the pipeline overlap (the host's exchange sync,
        :func:`~llmsim.host_syncs.exchange_sync_s`) and the parameter-gather overlap."""
        par = sc.parallelism
        key = ("traffic", par.overlap_pp_comm, par.overlap_param_gather)
        hit = core.get(key) if core is not None else None
        if hit is None:
            hit = step_traffic(sc.model, par, sc.training, sc.dp)
            if core is not None:
                core[key] = hit
        return hit

    def _pipeline_messages(self, costs: HardwareCosts, traffic: Workload,
                           posted_singly: bool, tp: int) -> tuple[dict[bool, float], float]:
        """Seconds of one pipeline send ({within a node: seconds}) and of the all-gather
        that rebuilds a sliced message (0: none), memoised on the costs (one per
        placement, held as long as the estimator) and the message."""
        key = (id(costs), traffic.pp_message_bytes, posted_singly, traffic.pp_gather_bytes,
               tp)
        hit: Any = self._messages.get(key)
        if hit is None:
            send_s = {within: costs.comm_s(CommOp("pp_send", "send_recv", "pp", "F",
                                                  traffic.pp_message_bytes,
                                                  within_node=within, two_rank=posted_singly))
                      for within in (False, True)}
            gather_s = costs.comm_s(CommOp("pp_gather", "all_gather", "tp", "F",
                                           traffic.pp_gather_bytes, copies=tp)) \
                if traffic.pp_gather_bytes else 0.0
            hit = self._messages[key] = (send_s, gather_s)
        return hit
