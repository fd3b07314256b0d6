"""Whether a layout fits: the peak memory of its busiest device, fast, for the search.

:func:`llmsim.memory.memory_per_stage` builds one :class:`~llmsim.memory.StageMemory` per
pipeline stage; the search needs only the largest total of each of hundreds of thousands
of layouts. :class:`PeakMemory` computes that total from the same functions (the layer's
activations, the micro-batches in flight, the buffers, the state per parameter) with the
per-stage sums done once per stage split and the parts layouts share memoised; it equals
``max(s.total_bytes for s in memory_per_stage(...))`` (``tests/test_search_fast.py``
checks this on seeded samples of every catalog scenario's space). An MoE model, whose
stages differ by which layers are expert layers, takes :func:`memory_per_stage` itself.
"""

from __future__ import annotations

from typing import Any

from llmsim.errors import UserError
from llmsim.in_flight import in_flight_chunks
from llmsim.memory import (
    FRAGMENTATION_FRACTION,
    RUNTIME_CONTEXT_BYTES,
    _activation_bytes,
    _buffer_bytes,
    activation_bytes_per_layer,
    embedding_activation_bytes,
    memory_per_stage,
    output_activation_bytes,
    state_bytes_per_param,
)
from llmsim.mla import mla_activation_bytes_delta
from llmsim.params import (
    embedding_params_per_device,
    head_params_per_device,
    layer_params_per_device,
)
from llmsim.partition import chunk_layers
from llmsim.schedules import SCHEDULES, placement


class PeakMemory:
    """The peak device memory of layouts of one base scenario (its model, accelerator
    and precision fixed), memoising what layouts share."""

    def __init__(self, base: Any) -> None:
        self.model, self.accelerator = base.model, base.system.node.accelerator
        self._splits: dict[tuple, list[list[int]]] = {}
        self._held: dict[tuple, tuple[list[int], int, int, list[int]]] = {}
        self._params: dict[tuple[int, int], tuple[int, int, int]] = {}
        self._placed: dict[tuple, tuple[list[list[int]], list[tuple]]] = {}
        self._activations: dict[tuple, tuple[float, float, float, float]] = {}
        self._buffers: dict[tuple, dict[tuple, float]] = {}

    def _split(self, par: Any) -> list[list[int]]:
        key = (par.pp, par.virtual_stages, par.first_stage_layers, par.last_stage_layers)
        hit = self._splits.get(key)
        if hit is None:
            try:
                hit = self._splits[key] = chunk_layers(self.model.layers, par)
            except ValueError as exc:
                raise UserError(str(exc)) from None
        return hit

    def _micro_batches(self, par: Any, training: Any, dp: int) -> int:
        """Micro-batches per step, after the checks :func:`memory_per_stage` makes first
        (tp divides the heads and the FFN; the global batch is a multiple of mb·dp·ep)."""
        model, t = self.model, par.tp
        if model.heads % t or model.ffn_hidden % t:
            raise UserError(f"parallelism.tp: {t} must divide model.heads={model.heads} and "
                            f"model.ffn_hidden={model.ffn_hidden}; choose a common divisor")
        per_step = par.micro_batch * dp * par.ep
        if dp < 1 or training.global_batch % per_step:
            raise UserError(f"training.global_batch: {training.global_batch} is not a "
                            f"multiple of micro_batch·dp·ep = {par.micro_batch}·{dp}·{par.ep}")
        return training.global_batch // per_step

    def peak_bytes(self, par: Any, training: Any, dp: int) -> float:
        """``max(s.total_bytes for s in memory_per_stage(model, par, training, dp, …))``,
        bytes (raises UserError where :func:`memory_per_stage` does)."""
        model = self.model
        # MoE models, models with multi-token prediction modules (on the last stage), and
        # schedules that place chunks their own way (ZB-V's V) or stash weight versions
        # (PipeDream), take the memory model itself.
        if model.moe is not None or model.mtp_depth or par.schedule not in ONE_VERSION:
            return max(s.total_bytes for s in memory_per_stage(model, par, training, dp,
                                                                self.accelerator))
        if par.schedule not in LOOPING_ONE_VERSION:
            return self._placed_peak_bytes(par, training, dp)
        p, v, t, zero = par.pp, par.virtual_stages, par.tp, par.zero
        m = self._micro_batches(par, training, dp)
        split = self._split(par)
        held_key = (par.schedule, p, m, v, par.first_stage_layers, par.last_stage_layers)
        hit = self._held.get(held_key)
        if hit is None:
            chunks = in_flight_chunks(par.schedule, p, m, v)
            held = [sum(n * layers for n, layers in zip(chunks[i], split[i], strict=True))
                    for i in range(p)]
            hit = self._held[held_key] = (held, chunks[0][0], chunks[p - 1][-1],
                                          _candidates(p, split, held))
        held, first_held, last_held, candidates = hit
        per_layer, remat, embedding_acts, output_acts = self._activation_parts(par, training)
        if per_layer < 0:  # never (bytes); the candidates need activations growing in held
            candidates = range(p)
        layer_params, embedding_params, head_params = self._param_parts(t, p)
        w_b, g_b, o_b = state_bytes_per_param(training.precision)
        ranks = dp * par.ep * par.cp
        per_param = (w_b / (ranks if zero >= 3 else 1), g_b / (ranks if zero >= 2 else 1),
                     o_b / (ranks if zero >= 1 else 1))
        buffers, peak = self._buffer_table(par, training, dp), 0.0
        for i in candidates:
            layers = sum(split[i])
            params = layers * layer_params + (embedding_params if i == 0 else 0) \
                + (head_params if i == p - 1 else 0)
            activations = held[i] * per_layer + (remat if held[i] else 0.0)
            if i == 0:
                activations += first_held * embedding_acts
            if i == p - 1:
                activations += last_held * output_acts
            buffer = self._buffer_bytes(par, training, dp, i, layers, buffers)
            tensors = (params * per_param[0] + params * per_param[1] + params * per_param[2]
                       + activations / par.cp + buffer)
            peak = max(peak, tensors + (RUNTIME_CONTEXT_BYTES + FRAGMENTATION_FRACTION * tensors))
        return peak

    def _placed_peak_bytes(self, par: Any, training: Any, dp: int) -> float:
        """:meth:`peak_bytes` of a dense model under a schedule that places its chunks its
        own way (ZB-V's V) or runs two pipelines (Chimera, DualPipe), with one version of
        the weights: :func:`memory_per_stage`'s sums in its order (the same numbers), the
        per-stage parts shared by the stages alike computed once per (schedule, p, m, v)."""
        p, v, t, zero = par.pp, par.virtual_stages, par.tp, par.zero
        m = self._micro_batches(par, training, dp)
        split = self._split(par)
        layer_params, embedding_params, head_params = self._param_parts(t, p)
        stages = self._placed_stages(par.schedule, p, m, v, split, layer_params,
                                     embedding_params, head_params, self._param_parts(t, 1)[2])
        per_layer, remat, embedding_acts, output_acts = self._activation_parts(par, training)
        if per_layer < 0:  # never (bytes); the candidates need activations growing in held
            return max(s.total_bytes for s in memory_per_stage(self.model, par, training, dp,
                                                                self.accelerator))
        w_b, g_b, o_b = state_bytes_per_param(training.precision)
        ranks = dp * par.ep * par.cp
        buffers, peak = self._buffer_table(par, training, dp), 0.0
        for i, params, layers, held, first_in, out_in in stages:
            weights = params * w_b / (ranks if zero >= 3 else 1) + 0.0
            grads = params * g_b / (ranks if zero >= 2 else 1) + 0.0
            optimizer = params * o_b / (ranks if zero >= 1 else 1) + 0.0
            activations = held * per_layer + (remat if held else 0.0)
            if first_in is not None:
                activations += first_in(embedding_acts, output_acts)
            if out_in:
                activations += out_in * output_acts
            activations = activations / par.cp
            buffer = self._buffer_bytes(par, training, dp, i, layers, buffers)
            tensors = weights + grads + optimizer + activations + buffer
            peak = max(peak, tensors + (RUNTIME_CONTEXT_BYTES + FRAGMENTATION_FRACTION * tensors))
        return peak

    def _placed_stages(self, schedule: str, p: int, m: int, v: int, split: list[list[int]],
                       layer_params: int, embedding_params: int, head_params: int,
                       one_head_params: int) -> list[tuple]:
        """The distinct stages of :meth:`_placed_peak_bytes` (the first of those alike):
        (stage, parameters, layers, layer-micro-batches held, the embedding's and
        output's activations of two pipelines as a function of theirs or None, the
        output's in-flight micro-batches of one pipeline or 0), as
        :func:`memory_per_stage` counts them."""
        key = (schedule, p, m, v, id(split), layer_params, embedding_params, head_params,
               one_head_params)
        hit = self._placed.get(key)
        if hit is not None:
            return hit[1]
        chunks = in_flight_chunks(schedule, p, m, v)
        hops = placement(schedule, p, v)
        pipelines = SCHEDULES[schedule].pipelines
        first_stage, last_stage = (hops[0][0], hops[-1][0]) if hops else (0, p - 1)
        head = head_params if first_stage != last_stage else one_head_params
        seen, out = set(), []
        for i in range(p):
            shape = (tuple(split[i]), tuple(chunks[i]), i == first_stage, i == last_stage,
                     tuple(split[p - 1 - i]) if pipelines > 1 else ())
            if shape in seen:
                continue
            seen.add(shape)
            held_stages = (i, p - 1 - i) if pipelines > 1 else (i,)
            layers = params = 0
            for j in held_stages:
                layers += sum(split[j])
                params += sum(split[j]) * layer_params + 0 \
                    + (embedding_params if j == first_stage else 0) \
                    + (head if j == last_stage else 0)
            held_layers = [n for j in held_stages for n in split[j]]
            held = sum(n * k for n, k in zip(chunks[i], held_layers, strict=True))
            first_in = out_in = None
            if pipelines > 1:
                ends = [(n, j == first_stage, j == last_stage)
                        for n, j in zip(chunks[i], held_stages, strict=True)]
                first_in = _two_pipeline_ends(ends)
                out_in = 0  # memory_per_stage adds in_flight × (0.0 + 0.0) here
            else:
                if i == first_stage:
                    n0 = chunks[i][0]
                    first_in = lambda e, o, n0=n0: n0 * e  # noqa: E731
                out_in = chunks[i][-1] if last_stage in held_stages else 0
            out.append((i, params, layers, held, first_in, out_in))
        out = _placed_candidates(p, out)
        self._placed[key] = (split, out)  # the split held: its id stays its own
        return out

    def _activation_parts(self, par: Any, training: Any) -> tuple[float, float, float, float]:
        """(per layer, re-materialised, embedding, output) activation bytes of one
        micro-batch, as :func:`memory_per_stage` computes them (its re-materialised
        layer without recompute of the norms and up-projections either)."""
        key = (id(training), training.global_batch, par.tp, par.sequence_parallel,
               par.micro_batch, par.recompute, par.recompute_norms_and_up_proj, par.cp,
               par.ep)
        hit = self._activations.get(key)
        if hit is None:
            model, e = self.model, _activation_bytes(training)
            per_layer = activation_bytes_per_layer(model, par, training) \
                + mla_activation_bytes_delta(model, par, training, e)
            none = par.model_copy(update={"recompute": "none",
                                          "recompute_norms_and_up_proj": False})
            remat = (activation_bytes_per_layer(model, none, training)
                     + mla_activation_bytes_delta(model, none, training, e) - per_layer)
            hit = self._activations[key] = (
                per_layer, remat, embedding_activation_bytes(model, par, training),
                output_activation_bytes(model, par, training))
        return hit

    def _buffer_bytes(self, par: Any, training: Any, dp: int, stage: int,
                      layers: int, table: dict | None = None) -> float:
        """:func:`~llmsim.memory._buffer_bytes` of ``stage`` (holding ``layers`` blocks),
        memoised on exactly what it reads: the training's precision and sequence, the
        parallelism's degrees, bucket size, micro-batch and weight prefetch, whether dp
        exceeds 1 and ZeRO is 3 (:meth:`_buffer_table`, or ``table``: its result for these
        arguments), and where the stage sits (first, last, holding layers)."""
        if table is None:
            table = self._buffer_table(par, training, dp)
        where = (stage == 0, stage == par.pp - 1, layers > 0)
        hit = table.get(where)
        if hit is None:
            hit = table[where] = _buffer_bytes(self.model, par, training, dp, stage, layers)
        return hit

    def _buffer_table(self, par: Any, training: Any, dp: int) -> dict[tuple, float]:
        """The memo of :meth:`_buffer_bytes` for what a layout's stages share (looked up
        once a layout, not once a stage): per (first, last, holding layers), bytes."""
        key = (training.precision, training.seq_len, par.pp, par.tp, par.sequence_parallel,
               par.dp_bucket_mb, dp > 1, par.virtual_stages > 1, par.micro_batch,
               par.zero >= 3, par.prefetch_weights)
        hit = self._buffers.get(key)
        if hit is None:
            hit = self._buffers[key] = {}
        return hit

    def _param_parts(self, tp: int, pp: int) -> tuple[int, int, int]:
        hit = self._params.get((tp, pp))
        if hit is None:
            model = self.model
            hit = self._params[(tp, pp)] = (layer_params_per_device(model, tp),
                                            embedding_params_per_device(model, tp),
                                            head_params_per_device(model, tp, pp))
        return hit


LOOPING_ONE_VERSION = frozenset(
    name for name, info in SCHEDULES.items()
    if not placement(name, 4, 2) and all(info.weight_versions(4, i, 8) == 1 for i in range(4)))
"""Schedules whose chunks loop (chunk c of stage s is virtual stage c·p + s) and that hold
one version of the weights: the memory this module computes in its fast way."""

ONE_VERSION = frozenset(
    name for name, info in SCHEDULES.items()
    if all(info.weight_versions(4, i, 8) == 1 for i in range(4)))
"""Schedules that hold one version of the weights (all but PipeDream's stashing)."""


def _candidates(p: int, split: list[list[int]], held: list[int]) -> list[int]:
    """The stages that can hold the peak, in stage order: of the stages alike in all but
    the activations they hold (the same layers, neither first nor last, holding some or
    none), the one holding the most (the first of equals). Their parameters and buffers
    are equal and their activations grow with what they hold, and every step of
    :meth:`PeakMemory.peak_bytes`' sum (a product by a non-negative number, a sum, a
    quotient by cp) keeps the order of floats, so the largest of the others' totals is
    never above the candidate's: the maximum is the same number."""
    best: dict[tuple, int] = {}
    for i in range(p):
        alike = (sum(split[i]), i == 0, i == p - 1, held[i] > 0)
        if alike not in best or held[i] > held[best[alike]]:
            best[alike] = i
    return sorted(best.values())


def _placed_candidates(p: int, stages: list[tuple]) -> list[tuple]:
    """:meth:`PeakMemory._placed_stages`' stages that can hold the peak (as
    :func:`_candidates`): of those alike in all but the layer-micro-batches held (the
    same parameters and layers, neither first nor last, no end chunk's activations,
    holding some or none), the one holding the most."""
    best: dict[tuple, tuple] = {}
    for stage in stages:
        i, params, layers, held, first_in, out_in = stage
        alike = (params, layers, held > 0) if first_in is None and not out_in \
            and 0 < i < p - 1 else (i,)
        if alike not in best or held > best[alike][3]:
            best[alike] = stage
    return sorted(best.values(), key=lambda stage: stage[0])


def _two_pipeline_ends(ends: list[tuple[int, bool, bool]]) -> Any:
    """Σ in-flight × (embedding if the held stage is the first + output if the last), the
    activations :func:`memory_per_stage` adds for the two pipelines' end chunks."""
    def added(embedding: float, output: float) -> float:
        return sum(n * (first * embedding + last * output) for n, first, last in ends)
    return added

