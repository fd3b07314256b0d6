"""The layout space: every valid parallel layout of a scenario's model on its machine.

:func:`cores` enumerates the space cheaply from integer rules (divisibility, the
schedule's rules) with the overlap switches at their defaults, branch by branch
(:func:`branches`, which :mod:`.draw` counts without making a layout), and
:func:`switch_variants` adds the others; the estimator validates each candidate as a
real :class:`~llmsim.specs.Scenario` (:mod:`.layout_scenario`) before pricing it, so a
rule missed here only costs time. A point of the space is a :class:`.layout.Layout`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import islice
from typing import Any, NamedTuple, get_args

from llmsim.schedules import SCHEDULES as SCHEDULE_INFO
from llmsim.search.batch_range import global_batches
from llmsim.search.layout import LAYOUT_FIELDS, SWITCHES, Layout, layout_of
from llmsim.search.layout_scenario import apply, parallelism_of, switched, with_layout
from llmsim.search.two_pipelines import allows
from llmsim.specs import Scenario
from llmsim.specs.parallelism import Parallelism

__all__ = ["ASYNCHRONOUS", "LAYOUT_FIELDS", "RECOMPUTE", "RECOMPUTE_VALUES", "SCHEDULES",
           "SWITCHES", "Layout", "SpaceOptions", "apply", "branch_slice", "branches", "cores",
           "divisors", "layout_of", "parallelism_of", "recompute_choices", "switch_variants",
           "switched", "tp_candidates", "variant_count", "with_layout"]
"""Also the layout's and its scenario's names (:mod:`.layout`, :mod:`.layout_scenario`),
which were defined here before."""

SCHEDULES = ("1f1b", "interleaved-1f1b", "zb-h1", "gpipe", "zb-h2", "zb-v", "chimera",
             "dualpipe")
"""The pipeline schedules the search tries (pp ≥ 2; one stage runs 1F1B, which is then
the same as any other; ZB-V with its two chunks per stage; Chimera and DualPipe with
their two pipelines, :mod:`.two_pipelines`). PipeDream is not among them by default
(:data:`ASYNCHRONOUS`)."""

ASYNCHRONOUS = ("pipedream",)
"""Schedules whose weight updates are stale, tried only with
:attr:`SpaceOptions.asynchronous` (``llmsim search --asynchronous``): PipeDream's 1F1B
without a flush (Narayanan et al. 2019 §3) runs each micro-batch's backward on the weight
version its forward used, up to p − 1 updates old. That is not the same training as a
synchronous schedule's — the updates, and so the steps to a given loss, differ — and the
search prices time per step only, so a PipeDream layout competes for "best" only when the
user says that training is acceptable (docs/search.md). Its layouts need at least pp
micro-batches per step (its steady state, :func:`llmsim.steady_state.pipedream_step_s`)."""

RECOMPUTE = ("none", "selective", "full")
"""The recompute modes the search tries on every layout; a base scenario's own mode that
is none of them (``full_keep_attention``, DistFlashAttn's) is tried as well
(:func:`recompute_choices`)."""

RECOMPUTE_VALUES: tuple[str, ...] = get_args(Parallelism.model_fields["recompute"].annotation)
"""Every recompute mode the spec accepts; ``--fix recompute=`` takes any of them."""


@dataclass(frozen=True)
class SpaceOptions:
    """What narrows the space."""

    fixed: Mapping[str, Any]
    """Layout field → the one value it may take (``--fix parallelism.tp=8``)."""
    batch_range: tuple[int, ...] | None = None
    """Global batches (sequences) allowed: (low, high), inclusive, or (low, high, step),
    every step-th from low (:func:`.batch_range.global_batches`); None keeps the scenario's."""
    max_tp: int | None = None
    """Largest tensor-parallel degree (default: the larger of 8 and a node's devices)."""
    max_micro_batch: int = 16
    """Largest micro-batch tried (sequences)."""
    min_nodes: int = 1
    """Fewest nodes a layout may use."""
    max_cp: int = 1
    """Largest context-parallel degree tried (1: none)."""
    max_parameter_servers: int = 0
    """Most parameter servers tried in place of the all-reduce (0: none; powers of two
    up to it and the layout's nodes, at ZeRO 0 without ep or cp, the spec's rule)."""
    asynchronous: bool = False
    """Also try the schedules with stale weight updates (:data:`ASYNCHRONOUS`)."""
    recomputes: tuple[str, ...] = RECOMPUTE
    """Recompute modes tried; :func:`cores` adds the base scenario's own
    (:func:`recompute_choices`)."""


def divisors(n: int) -> list[int]:
    """The divisors of ``n``, ascending."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def recompute_choices(scenario: Scenario,
                      modes: tuple[str, ...] = RECOMPUTE) -> tuple[str, ...]:
    """``modes`` and, where it is none of them, the scenario's own recompute mode: a
    search keeps what the user's scenario runs as one more choice."""
    own = scenario.parallelism.recompute
    return modes if own in modes else (*modes, own)


def _choices(name: str, candidates: Sequence[Any], fixed: Mapping[str, Any]) -> Sequence[Any]:
    if name in fixed:
        return [fixed[name]]
    return candidates


def tp_candidates(scenario: Scenario, max_tp: int | None) -> list[int]:
    """Tensor-parallel degrees the model allows: divisors of the heads that divide the FFN
    width and divide or are divided by the KV heads, up to ``max_tp``."""
    m = scenario.model
    limit = max_tp or max(8, scenario.system.node.devices_per_node)
    return [t for t in divisors(m.heads) if t <= limit and m.ffn_hidden % t == 0
            and (m.n_kv_heads % t == 0 or t % m.n_kv_heads == 0)]


StateFilter = Callable[[int, int, int, int, int, int], bool]
"""(tp, pp, dp, ep, cp, zero) → whether the model state can fit at all (a lower bound)."""

Plan = tuple[str, int, int]
"""(schedule, virtual stages, micro-batch): how a replica runs its share of the batch."""


class Branch(NamedTuple):
    """The core layouts that share their global batch, degrees, nodes and ZeRO stage, in
    the enumeration's order (:func:`branches`): ``size`` of them, made by
    :func:`branch_layouts` only when asked for."""

    gb: int
    nodes: int
    tp: int
    pp: int
    dp: int
    ep: int
    cp: int
    etp: int
    zero: int
    a2a: bool
    """Whether the base scenario overlaps the MoE all-to-alls (kept where allowed)."""
    servers: tuple[int, ...]
    plans: tuple[Plan, ...]
    sps: tuple[bool, ...]
    recomputes: tuple[str, ...]

    @property
    def size(self) -> int:
        """How many core layouts the branch holds."""
        return len(self.plans) * len(self.sps) * len(self.recomputes) * len(self.servers)


def cores(scenario: Scenario, options: SpaceOptions,
          state_fits: StateFilter | None = None) -> Iterator[Layout]:
    """Every layout of ``scenario``'s model on at most its nodes, by the integer rules,
    with the overlap switches at their defaults (:func:`switch_variants` adds the others).

    Degrees: tp from :func:`tp_candidates`; pp and virtual stages dividing the layers;
    dp such that tp·pp·dp fills whole nodes, at most the scenario's; the micro-batch
    dividing the global batch's share of a replica, micro-batches a multiple of pp for
    the interleaved schedule (Megatron-LM's rule). ZeRO stages above 0 only with dp > 1;
    sequence parallelism only with tp > 1; an MoE model's experts split like the dense
    MLP and, where tp·ep divides them, whole (``expert_tp`` 1).
    ``state_fits(tp, pp, dp, ep, cp, zero)`` prunes whole branches whose model state
    cannot fit. Recompute: ``options.recomputes`` and the scenario's own mode. With
    ``options.batch_range``, the union of the spaces of every global batch in it, one
    batch after the other (:func:`.batch_range.global_batches`).
    """
    for branch in branches(scenario, options, state_fits):
        yield from branch_layouts(branch, options.fixed)


def branches(scenario: Scenario, options: SpaceOptions,
             state_fits: StateFilter | None = None) -> Iterator[Branch]:
    """The space's :class:`Branch` es in the enumeration's order: counting their ``size``
    counts the space (:func:`.draw.draw_layouts`) without making a layout, and their layouts in
    turn are :func:`cores`."""
    options = replace(options, recomputes=recompute_choices(scenario, options.recomputes))
    fx = options.fixed
    model, node = scenario.model, scenario.system.node
    per_node, max_nodes = node.devices_per_node, scenario.nodes_used
    experts = model.moe.experts if model.moe is not None else 1
    seq = scenario.training.seq_len
    cps = [c for c in divisors(seq // 2) if c <= options.max_cp] if seq % 2 == 0 else [1]
    a2a = scenario.parallelism.moe_a2a_overlap
    recomputes = tuple(_choices("recompute", list(options.recomputes), fx))
    for gb in _choices("global_batch", global_batches(scenario.training.global_batch,
                                                      options.batch_range), fx):
        plans: dict[tuple[int, int, int], tuple[Plan, ...]] = {}  # (per replica, pp, zero)
        for tp in _choices("tp", tp_candidates(scenario, options.max_tp), fx):
            sps = tuple(_choices("sequence_parallel", [False, True] if tp > 1 else [False],
                                 fx))
            for pp in _choices("pp", divisors(model.layers), fx):
                for ep in _choices("ep", divisors(experts), fx):
                    for cp in _choices("cp", cps or [1], fx):
                        for etp in _choices("expert_tp", _expert_tps(model, tp, ep), fx):
                            for dp, nodes, zero in _replicas(gb, tp, pp, ep, cp, per_node,
                                                             max_nodes, options, state_fits):
                                key = (gb // (dp * ep), pp, zero)
                                if key not in plans:
                                    plans[key] = _plans(*key, model.layers, options)
                                yield Branch(gb, nodes, tp, pp, dp, ep, cp, etp, zero, a2a,
                                             _servers(nodes, dp, ep, cp, zero, options),
                                             plans[key], sps, recomputes)


def branch_layouts(branch: Branch, fixed: Mapping[str, Any]) -> Iterator[Layout]:
    """``branch``'s core layouts, in the enumeration's order: by plan, then sequence
    parallelism, recompute and parameter servers (:func:`branch_layout` makes one)."""
    switches = _switches(fixed)
    for plan in branch.plans:
        for sp in branch.sps:
            for rc in branch.recomputes:
                layout = _core(branch, fixed, switches, plan, sp, rc)
                for k in branch.servers:
                    yield replace(layout, parameter_servers=k) if k else layout


def branch_layout(branch: Branch, fixed: Mapping[str, Any], index: int) -> Layout:
    """The core layout at ``index`` of :func:`branch_layouts` (0 ≤ index < size), made
    alone."""
    index, k = divmod(index, len(branch.servers))
    index, rc = divmod(index, len(branch.recomputes))
    plan, sp = divmod(index, len(branch.sps))
    layout = _core(branch, fixed, _switches(fixed), branch.plans[plan], branch.sps[sp],
                   branch.recomputes[rc])
    servers = branch.servers[k]
    return replace(layout, parameter_servers=servers) if servers else layout


def branch_slice(branch: Branch, fixed: Mapping[str, Any], first: int,
                 end: int) -> Iterator[Layout]:
    """The core layouts ``first ≤ i < end`` of :func:`branch_layouts` (a worker's share of
    a branch, :class:`.batching.Cut`): the plans that hold them, those alone made."""
    per_plan = branch.size // len(branch.plans)
    low, high = first // per_plan, -(-end // per_plan)
    held = branch._replace(plans=branch.plans[low:high])
    return islice(branch_layouts(held, fixed), first - low * per_plan, end - low * per_plan)


def _switches(fixed: Mapping[str, Any]) -> tuple[bool, bool, bool, bool]:
    """The overlap switches of a core layout: their defaults, or the values fixed."""
    return (fixed.get("overlap_dp_comm", True), fixed.get("overlap_tp_comm", False),
            fixed.get("overlap_pp_comm", False), fixed.get("overlap_param_gather", False))


def _core(branch: Branch, fixed: Mapping[str, Any], switches: tuple[bool, bool, bool, bool],
          plan: Plan, sp: bool, rc: str) -> Layout:
    """One core layout of ``branch`` (with the all-reduce), the MoE all-to-all overlap
    kept on where the base (or ``--fix``) has it and it is allowed."""
    gb, nodes, tp, pp, dp, ep, cp, etp, zero, a2a = branch[:10]
    schedule, v, mb = plan
    layout = Layout(nodes, tp, pp, dp, v, schedule, mb, zero, sp, rc, *switches, gb, ep, cp, 0,
                    etp)
    if fixed.get("moe_a2a_overlap", a2a) and a2a_overlap_allowed(layout):
        layout = replace(layout, moe_a2a_overlap=True)  # the base's value
    return layout


def _expert_tps(model: Any, tp: int, ep: int) -> list[int]:
    """The routed experts' TP degrees tried: none for a dense model (0); split like the
    dense MLP (tp) and, where tp·ep divides the experts, whole (1; Megatron-Core's
    ``--expert-tensor-parallel-size 1``)."""
    if model.moe is None:
        return [0]
    return [tp, 1] if tp > 1 and model.moe.experts % (tp * ep) == 0 else [tp]


def _replicas(gb: int, tp: int, pp: int, ep: int, cp: int, per_node: int, max_nodes: int,
              options: SpaceOptions,
              state_fits: StateFilter | None) -> Iterator[tuple[int, int, int]]:
    """(dp, nodes, ZeRO stage) of the branches of one (gb, tp, pp, ep, cp)."""
    fx = options.fixed
    for dp in _choices("dp", divisors(gb), fx):
        if gb % (dp * ep):
            continue
        devices = tp * pp * dp * ep * cp
        if devices % per_node:
            continue
        nodes = devices // per_node
        if not options.min_nodes <= nodes <= max_nodes:
            continue
        if "nodes" in fx and fx["nodes"] != nodes:
            continue
        zeros = [0, 1, 2, 3] if dp * ep * cp > 1 else [0]
        for zero in _choices("zero", zeros, fx):
            if state_fits is None or state_fits(tp, pp, dp, ep, cp, zero):
                yield dp, nodes, zero


def _servers(nodes: int, dp: int, ep: int, cp: int, zero: int,
             options: SpaceOptions) -> tuple[int, ...]:
    """Parameter servers tried (0: all-reduce): with ``max_parameter_servers``, the
    powers of two up to it and the nodes (one server per node, the spec's rule), where the
    spec allows a parameter server (dp > 1, ZeRO 0, no ep or cp)."""
    limit = min(options.max_parameter_servers, nodes)
    counts = [0]
    if dp > 1 and zero == 0 and ep == 1 and cp == 1:
        counts += [2 ** i for i in range(limit.bit_length()) if 2 ** i <= limit]
    return tuple(_choices("parameter_servers", counts, options.fixed))


def _plans(per_replica: int, pp: int, zero: int, layers: int,
           options: SpaceOptions) -> tuple[Plan, ...]:
    """The (schedule, virtual stages, micro-batch) a replica with ``per_replica``
    sequences a step can run on ``pp`` stages at ZeRO ``zero``."""
    fx = options.fixed
    micro = [b for b in divisors(per_replica) if b <= options.max_micro_batch]
    schedules = list(SCHEDULES) + list(ASYNCHRONOUS) * options.asynchronous if pp > 1 \
        else ["1f1b"]
    out: list[Plan] = []
    for schedule in _choices("schedule", schedules, fx):
        if schedule == "interleaved-1f1b":
            chunks = [v for v in divisors(layers // pp) if v >= 2]
        elif schedule == "zb-v":  # two chunks per stage, the V (Qi et al. 2024 §6)
            chunks = [2]
        else:
            chunks = [1]
        for v in _choices("virtual_stages", chunks, fx):
            if layers % (pp * v):
                continue
            for mb in _choices("micro_batch", micro, fx):
                if per_replica % mb:
                    continue
                if schedule == "interleaved-1f1b" and (per_replica // mb) % pp:
                    continue
                if not allows(schedule, pp, per_replica // mb, zero):  # Chimera's, DualPipe's m
                    continue
                if schedule in ASYNCHRONOUS and per_replica // mb < pp:
                    continue
                out.append((schedule, v, mb))
    return tuple(out)


def switch_variants(core: Layout, fixed: Mapping[str, Any]) -> Iterator[Layout]:
    """``core`` with every allowed combination of the overlap switches.

    The data-parallel overlap stays on (no framework runs a large job without it; fix
    ``overlap_dp_comm=false`` to see it off); the TP overlap is tried with sequence
    parallelism (Transformer Engine's userbuffers need it); the pipeline overlap with the
    interleaved schedule, the only one whose sends Megatron-LM can overlap
    (``--overlap-p2p-communication``); the parameter-gather overlap at ZeRO 1 and 2; the
    MoE all-to-all overlap where :func:`a2a_overlap_allowed`.
    """
    tp_choices, pp_choices, gather_choices, a2a_choices = _switch_choices(core, fixed)
    for otp in tp_choices:
        for opp in pp_choices:
            for opg in gather_choices:
                for a2a in a2a_choices:
                    yield core.variant(otp, opp, opg, a2a)


def variant_count(core: Layout, fixed: Mapping[str, Any]) -> int:
    """How many layouts :func:`switch_variants` gives (without making them)."""
    return math.prod(len(choices) for choices in _switch_choices(core, fixed))


def _switch_choices(core: Layout,
                    fixed: Mapping[str, Any]) -> tuple[list, list, list, list]:
    tp_overlap = [False, True] if core.sequence_parallel else [False]
    pp_overlap = [False, True] if core.schedule == "interleaved-1f1b" else [False]
    gather = [False, True] if core.zero in (1, 2) and core.dp * core.ep * core.cp > 1 \
        else [False]
    a2a = [core.moe_a2a_overlap, not core.moe_a2a_overlap] if a2a_overlap_allowed(core) \
        else [False]
    return (_choices("overlap_tp_comm", tp_overlap, fixed),
            _choices("overlap_pp_comm", pp_overlap, fixed),
            _choices("overlap_param_gather", gather, fixed),
            [x for x in _choices("moe_a2a_overlap", a2a, fixed)
             if not x or a2a_overlap_allowed(core)])


def a2a_overlap_allowed(layout: Layout) -> bool:
    """Whether the search tries the MoE all-to-all overlap on ``layout``: where there is
    an all-to-all (more than one expert rank: ep, or tp·ep with whole experts) and
    Megatron-Core runs ``--overlap-moe-expert-parallel-comm`` — without full recompute,
    and with pp > 1 only with a virtual pipeline (the interleaved schedule)
    (``TransformerConfig.__post_init__``, NVIDIA/Megatron-LM 4415119414, lines 2386–2425)
    — or under a schedule that overlaps its own forward-backward pairs (DualPipe,
    DeepSeek-V3 report §3.2.1)."""
    splits = layout.tp // layout.expert_tp if layout.expert_tp else 1
    return layout.ep * splits > 1 and layout.recompute != "full" and (
        layout.pp == 1 or layout.schedule == "interleaved-1f1b"
        or SCHEDULE_INFO[layout.schedule].overlapped_pairs is not None)
