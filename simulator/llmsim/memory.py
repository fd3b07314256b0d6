"""Memory per device for each pipeline stage (design §8).

Every device of one pipeline stage holds the same bytes (TP ranks and DP replicas are
symmetric), so the model answers one :class:`StageMemory` per stage: model state
(weights, gradients, Adam state, sharded by ZeRO), activations of the micro-batches in
flight under the pipeline schedule, communication buffers and a stated reserve.

Sources: Rajbhandari et al. 2020 (ZeRO, §3 and §5), Korthikanti et al. 2022 (activation
memory, §4 and Table 2), Narayanan et al. 2021 (pipeline schedules, §2.2) and Megatron-LM
(``schedules.py``, ``theoretical_memory_usage.py``). docs/memory.md derives each term; the
activations one block and the model's ends store per micro-batch are
:mod:`llmsim.activations`'.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from llmsim.activations import DROPOUT_MASK_BYTES as DROPOUT_MASK_BYTES
from llmsim.activations import (
    activation_bytes_per_layer,
    embedding_activation_bytes,
    output_activation_bytes,
)
from llmsim.activations import activation_element_bytes as _activation_bytes
from llmsim.errors import UserError
from llmsim.experts import moe_activation_bytes_delta, moe_layers_in_flight
from llmsim.in_flight import in_flight_chunks
from llmsim.mla import mla_activation_bytes_delta
from llmsim.mtp import mtp_activation_bytes, mtp_params_per_device
from llmsim.params import (
    embedding_params_per_device,
    head_params_per_device,
    layer_params_per_device,
    stage_layers_params,
)
from llmsim.partition import chunk_first_layer, chunk_layers
from llmsim.schedules import SCHEDULES, placement
from llmsim.specs import Accelerator, Model, Parallelism, Training

RUNTIME_CONTEXT_BYTES = 1.0e9
"""Per-device runtime context: CUDA/HIP context, cuBLAS/hipBLASLt workspaces, NCCL/RCCL
channel buffers. An assumption (about 1 GB is what a PyTorch + NCCL process typically
shows before allocating tensors); not taken from a datasheet."""

FRAGMENTATION_FRACTION = 0.05
"""Caching-allocator fragmentation and short-lived temporaries, as a fraction of the
tensors' bytes. An assumption, the same 5 % that Megatron-LM's
``theoretical_memory_usage.py`` adds for "optimizer and miscellaneous temporaries"."""

_MB = 1e6
_GB = 1e9


@dataclass(frozen=True)
class StageMemory:
    """Bytes held by one device of one pipeline stage at its peak (one training step)."""

    stage: int
    """Pipeline stage, 0-based."""
    layers: int
    """Transformer blocks on this stage (all of its chunks together)."""
    params: int
    """Parameters of this device's model shard (after TP and EP, before ZeRO sharding)."""
    weights_bytes: float
    """Weights held (compute copy; ZeRO-3 shards them over DP), bytes."""
    grads_bytes: float
    """Gradients held (ZeRO-2 and 3 shard them), bytes."""
    optimizer_bytes: float
    """Optimizer state (fp32 master weights, Adam moments; ZeRO ≥ 1 shards it), bytes."""
    activations_bytes: float
    """Activations stored for the backward of every micro-batch in flight, bytes."""
    buffers_bytes: float
    """DP gradient buckets, pipeline send/receive and ZeRO-3 gather buffers, bytes."""
    reserve_bytes: float
    """Runtime context plus allocator fragmentation reserve, bytes."""
    in_flight_microbatches: float
    """Micro-batches' worth of this stage's activations held at the peak (interleaved:
    chunk-micro-batches divided by the chunks per stage, so it can be fractional)."""
    capacity_bytes: float
    """Device memory capacity, bytes."""
    expert_params: int = 0
    """Of ``params``, the routed experts' (this expert-parallel rank's share)."""
    expert_state_bytes: float = 0.0
    """Of the weights, gradients and optimizer state, the routed experts' bytes."""
    weight_versions: int = 1
    """Versions of the stage's weights held (``weights_bytes`` counts all of them):
    PipeDream's stash, p − i on stage i; one for a flushed schedule."""

    @property
    def model_state_bytes(self) -> float:
        """Weights, gradients and optimizer state together, bytes."""
        return self.weights_bytes + self.grads_bytes + self.optimizer_bytes

    @property
    def total_bytes(self) -> float:
        """Everything the device holds at the peak, bytes."""
        return (
            self.model_state_bytes
            + self.activations_bytes
            + self.buffers_bytes
            + self.reserve_bytes
        )

    @property
    def fits(self) -> bool:
        """Whether the peak fits in the device memory."""
        return self.total_bytes <= self.capacity_bytes

    def as_gb(self) -> dict[str, float | bool]:
        """The parts, total and capacity in GB (10^9 bytes), and ``fits``."""
        parts = ("weights", "grads", "optimizer", "activations", "buffers", "reserve", "total")
        out: dict[str, float | bool] = {f"{p}_gb": getattr(self, f"{p}_bytes") / _GB for p in parts}
        out["expert_state_gb"] = self.expert_state_bytes / _GB
        out["capacity_gb"] = self.capacity_bytes / _GB
        out["fits"] = self.fits
        return out


# ---------------------------------------------------------------- parameters


def state_bytes_per_param(precision: str) -> tuple[int, int, int]:
    """(weights, gradients, optimizer) bytes per parameter for Adam.

    Mixed precision (bf16/fp16, and fp8 whose GEMMs cast 16-bit weights on the fly):
    2 + 2 + 12 = 16 bytes — 16-bit weights and gradients, fp32 master weights, momentum
    and variance (Rajbhandari et al. 2020 §3, "16Ψ"). fp32 training: 4 + 4 + 8 (the
    weights are the master copy; Adam adds two moments).
    """
    return (4, 4, 8) if precision == "fp32" else (2, 2, 12)


def stage_params(model: Model, tp: int, pp: int, stage: int, layers: int | None = None) -> int:
    """Parameters on one device of ``stage``: its ``layers`` blocks (default an even split,
    ``model.layers / pp``), the embedding on the first stage, final norm and LM head on the
    last (both on stage 0 when ``pp = 1``)."""
    layers = model.layers // pp if layers is None else layers
    params = layers * layer_params_per_device(model, tp)
    if stage == 0:
        params += embedding_params_per_device(model, tp)
    if stage == pp - 1:
        params += head_params_per_device(model, tp, pp)
    return params


# ---------------------------------------------------------------- the whole device


def _check(
    model: Model, parallelism: Parallelism, training: Training, dp: int
) -> tuple[int, list[list[int]]]:
    """The number of micro-batches m and the layers of each chunk ``[stage][chunk]``, or a
    UserError for a layout that cannot be split."""
    try:
        split = chunk_layers(model.layers, parallelism)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    if model.heads % parallelism.tp or model.ffn_hidden % parallelism.tp:
        raise UserError(
            f"parallelism.tp: {parallelism.tp} must divide model.heads={model.heads} and "
            f"model.ffn_hidden={model.ffn_hidden}; choose a common divisor"
        )
    per_step = parallelism.micro_batch * dp * parallelism.ep
    if dp < 1 or training.global_batch % per_step:
        raise UserError(
            f"training.global_batch: {training.global_batch} is not a multiple of "
            f"micro_batch·dp·ep = {parallelism.micro_batch}·{dp}·{parallelism.ep}; use a "
            f"multiple of {per_step}"
        )
    return training.global_batch // per_step, split


def _buffer_bytes(
    model: Model, parallelism: Parallelism, training: Training, dp: int, stage: int,
    layers: int,
) -> float:
    """Communication buffers on one device of ``stage``.

    * DP: two gradient buckets of ``dp_bucket_mb`` (one reducing while the next fills)
      when dp > 1 (PyTorch DDP / Megatron bucketed overlap; MB = 10^6 bytes here).
    * PP: per neighbouring stage one send and one receive tensor of one micro-batch,
      e·sbh (÷t with sequence parallelism); interleaving gives every stage two neighbours.
    * ZeRO-3: the gathered weights of two units, the one computing and the one
      prefetched (PyTorch FSDP's limit of two in-flight all-gathers, Zhao et al. 2023,
      "rate limiter"), a unit being one of the stage's ``layers`` blocks, the embedding
      or the LM head; one unit without ``prefetch_weights``.
    """
    p, t, sp = parallelism.pp, parallelism.tp, parallelism.sequence_parallel
    out = 2 * parallelism.dp_bucket_mb * _MB if dp > 1 else 0.0
    if p > 1:
        neighbours = 2 if parallelism.virtual_stages > 1 else (stage > 0) + (stage < p - 1)
        activation = _activation_bytes(training) * training.seq_len * parallelism.micro_batch
        out += neighbours * 2 * activation * model.hidden / (t if sp else 1)
    if parallelism.zero >= 3 and dp > 1:
        units = [layer_params_per_device(model, t)] if layers else []
        if stage == 0:
            units.append(embedding_params_per_device(model, t))
        if stage == p - 1:
            units.append(head_params_per_device(model, t, p))
        in_flight = 2 if parallelism.prefetch_weights else 1
        out += in_flight * max(units) * state_bytes_per_param(training.precision)[0]
    return out


def memory_per_stage(
    model: Model,
    parallelism: Parallelism,
    training: Training,
    dp: int,
    accelerator: Accelerator,
) -> list[StageMemory]:
    """Peak memory of one device of each pipeline stage.

    Model state: ``stage_params`` × :func:`state_bytes_per_param`, with ZeRO stage 1
    dividing the optimizer state by dp, 2 also the gradients, 3 also the weights
    (Rajbhandari et al. 2020 §5: 4Ψ + 12Ψ/N, 2Ψ + 14Ψ/N, 16Ψ/N). ``dp`` is the ``dp``
    axis; the dense weights are replicated, and sharded, over dp·ep·cp ranks, a routed
    expert's over dp·cp (Megatron-Core's expert-data-parallel group), each expert-parallel
    rank holding ``experts/ep`` experts. Activations (÷cp: context parallelism splits the
    sequence, Megatron-Core):
    :func:`activation_bytes_per_layer` × Σ over the stage's chunks of its layers × its
    micro-batches in flight (:func:`in_flight_chunks`), plus, when recomputing and the
    stage has layers, one block's re-materialised activations for the micro-batch being
    back-propagated; the first stage adds :func:`embedding_activation_bytes` and the last
    :func:`output_activation_bytes` per in-flight micro-batch of their chunk. Reserve:
    :data:`RUNTIME_CONTEXT_BYTES` + :data:`FRAGMENTATION_FRACTION` of everything else. Not
    fitting is a result (``fits`` False), never an error. A schedule that keeps several
    versions of a stage's weights (the registry's ``weight_versions``: PipeDream's weight
    stashing, p − i on stage i, Narayanan et al. 2019 §3.3) multiplies the weights by
    them; the gradients and optimizer state belong to the live version only. With two
    pipelines (Chimera, DualPipe: the registry's ``pipelines``) device i also holds stage
    p − 1 − i's layers, with their weights, gradients, optimizer state and activations.
    """
    m, split = _check(model, parallelism, training, dp)
    p, v, t, zero = parallelism.pp, parallelism.virtual_stages, parallelism.tp, parallelism.zero
    chunks = in_flight_chunks(parallelism.schedule, p, m, v)
    per_layer = activation_bytes_per_layer(model, parallelism, training) + \
        mla_activation_bytes_delta(model, parallelism, training, _activation_bytes(training))
    no_recompute = parallelism.model_copy(update={"recompute": "none",
                                                  "recompute_norms_and_up_proj": False})
    rematerialised = (activation_bytes_per_layer(model, no_recompute, training)
                      + mla_activation_bytes_delta(model, no_recompute, training,
                                                   _activation_bytes(training)) - per_layer)
    w_b, g_b, o_b = state_bytes_per_param(training.precision)

    ep, cp = parallelism.ep, parallelism.cp
    groups = (dp * ep * cp, dp * cp)  # dense, expert: ZeRO shards over these ranks
    moe_delta = moe_activation_bytes_delta(model, parallelism, training,
                                           _activation_bytes(training))
    layer_params = layer_params_per_device(model, t)
    hops = placement(parallelism.schedule, p, v)
    pipelines = SCHEDULES[parallelism.schedule].pipelines
    # The stages of the first and the last virtual stage (0 and p − 1 unless the schedule
    # places its chunks otherwise: ZB-V's V puts both on stage 0, one tied embedding).
    first_stage, last_stage = (hops[0][0], hops[-1][0]) if hops else (0, p - 1)
    embedding_params, head_params = (
        embedding_params_per_device(model, t),
        head_params_per_device(model, t, p if first_stage != last_stage else 1))
    embedding_acts = embedding_activation_bytes(model, parallelism, training)
    output_acts = output_activation_bytes(model, parallelism, training)
    # Stages with the same chunks, micro-batches in flight and ends of the model need the
    # same memory: each distinct one is computed once.
    distinct: dict[tuple, StageMemory] = {}
    stages = []
    for i in range(p):
        first_layers = tuple(chunk_first_layer(split, i, c, hops or None)
                             for c in range(v)) if model.moe is not None else ()
        versions = SCHEDULES[parallelism.schedule].weight_versions(p, i, m)
        key = (tuple(split[i]), tuple(chunks[i]), i == first_stage, i == last_stage,
               first_layers, versions, tuple(split[p - 1 - i]) if pipelines > 1 else ())
        known = distinct.get(key)
        if known is not None:
            stages.append(replace(known, stage=i))
            continue
        # Chimera's two pipelines: device i also holds the up pipeline's replica of stage
        # p − 1 − i, its weights, gradients and optimizer state (Li & Hoefler 2021 §3.1).
        held_stages = (i, p - 1 - i) if pipelines > 1 else (i,)
        layers = dense = expert = params = 0
        for j in held_stages:
            layers += sum(split[j])
            if model.moe is None:
                dense_j, expert_j = sum(split[j]) * layer_params, 0
            else:
                dense_j, expert_j = stage_layers_params(model, t, parallelism.expert_ranks,
                                                        split, j, parallelism.etp)
            if j == last_stage:  # the multi-token prediction modules (llmsim.mtp)
                mtp_dense, mtp_expert = mtp_params_per_device(
                    model, t, parallelism.expert_ranks, parallelism.etp,
                    first_stage != last_stage and pipelines == 1)  # DualPipe: §3.2.3
                dense_j, expert_j = dense_j + mtp_dense, expert_j + mtp_expert
            dense, expert = dense + dense_j, expert + expert_j
            params += dense_j + expert_j + (embedding_params if j == first_stage else 0) \
                + (head_params if j == last_stage else 0)
        dense_state = _state_bytes(params - expert, groups[0], zero, (w_b, g_b, o_b))
        expert_state = _state_bytes(expert, groups[1], zero, (w_b, g_b, o_b))
        weights, grads, optimizer = (a + b for a, b in zip(dense_state, expert_state,
                                                          strict=True))
        weights *= versions
        chunk_layers_held = [n for j in held_stages for n in split[j]]
        held = sum(n * layers for n, layers in zip(chunks[i], chunk_layers_held, strict=True))
        activations = held * per_layer + (rematerialised if held else 0.0)
        if pipelines > 1:  # the chunk of each held stage: the embedding's, the head's
            activations += sum(n * ((j == first_stage) * embedding_acts
                                    + (j == last_stage) * output_acts)
                               for n, j in zip(chunks[i], held_stages, strict=True))
        elif i == first_stage:
            activations += chunks[i][0] * embedding_acts
        mtp_moe = 0
        if last_stage in held_stages:  # the head's chunk: its output and the MTP modules
            in_flight = (chunks[i][-1] if pipelines == 1
                         else chunks[i][held_stages.index(last_stage)])
            activations += in_flight * ((output_acts if pipelines == 1 else 0.0)
                                        + mtp_activation_bytes(model, parallelism, training,
                                                               per_layer, output_acts,
                                                               _activation_bytes(training)))
            mtp_moe = in_flight * sum(model.mtp_is_moe(k) for k in range(model.mtp_depth))
        # the MoE delta is per rank already (of its s/cp tokens)
        activations = activations / cp + (sum(
            moe_layers_in_flight(model, split, chunks[i][k * v:(k + 1) * v], j)
            for k, j in enumerate(held_stages)) + mtp_moe) * moe_delta
        buffers = _buffer_bytes(model, parallelism, training, dp, i, layers)
        tensors = weights + grads + optimizer + activations + buffers
        stage = distinct[key] = StageMemory(
            stage=i,
            layers=layers,
            params=params,
            weights_bytes=weights,
            grads_bytes=grads,
            optimizer_bytes=optimizer,
            activations_bytes=activations,
            buffers_bytes=buffers,
            reserve_bytes=RUNTIME_CONTEXT_BYTES + FRAGMENTATION_FRACTION * tensors,
            in_flight_microbatches=sum(chunks[i]) / v,  # Chimera: both pipelines' passes
            capacity_bytes=accelerator.hbm_bytes,
            expert_params=expert,
            expert_state_bytes=sum(expert_state) + (versions - 1) * expert_state[0],
            weight_versions=versions,
        )
        stages.append(stage)
    return stages


def _state_bytes(params: int, ranks: int, zero: int,
                 per_param: tuple[int, int, int]) -> tuple[float, float, float]:
    """(weights, gradients, optimizer state) bytes of ``params`` parameters whose ZeRO
    stage ``zero`` shards them over ``ranks`` ranks (optimizer state from stage 1,
    gradients from 2, weights at 3)."""
    w_b, g_b, o_b = per_param
    return (params * w_b / (ranks if zero >= 3 else 1),
            params * g_b / (ranks if zero >= 2 else 1),
            params * o_b / (ranks if zero >= 1 else 1))


def peak_stage(stages: list[StageMemory]) -> StageMemory:
    """The stage that needs the most memory (the one that decides whether a job fits)."""
    return max(stages, key=lambda s: s.total_bytes)
