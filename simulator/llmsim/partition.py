"""How a model's transformer layers are split over pipeline stages and model chunks.

By default every model chunk (virtual stage) holds ``layers / (pp·v)`` layers, Megatron-LM's
split. The first stage also runs the embedding and the last the final norm, LM head and
loss, so frameworks let those two stages hold fewer layers:

* Megatron-Core ``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers``;
* DeepSpeed ``PipelineModule(partition_method='type:transformer|embedding')``, which counts
  the embedding and the tied LM head as one layer each — BLOOM-176B's 70 layers on 12
  stages are 5 on the first and last stage and 6 on the others (bigscience
  ``train/tr11-176B-ml/tr11-176B-ml.slurm``);
* Zero Bubble's ``--allow-padding-num-layers`` (Qi et al. 2024): the first and last stage
  one layer fewer.

``parallelism.first_stage_layers`` / ``last_stage_layers`` set those two counts; the other
stages split the rest evenly. Inside a stage of ``n`` layers and ``v`` chunks, a middle
stage needs ``v | n``; the first stage puts its shortfall on its earliest chunks (where
the embedding is) and the last stage on its latest (where the head is), which is what
Zero Bubble's padding does with one layer per chunk. Only the chunk holding the
embedding or the head may be left without layers.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from llmsim.specs.parallelism import Parallelism


def stage_layers(layers: int, par: Parallelism) -> list[int]:
    """Transformer layers on each pipeline stage, first to last.

    Raises ``ValueError`` (one sentence naming the field) when the layers cannot be split.
    """
    p, v = par.pp, par.virtual_stages
    first, last = par.first_stage_layers, par.last_stage_layers
    if par.layers_per_stage is not None:
        return _given_stage_layers(layers, par.layers_per_stage, v)
    if first is None and last is None:
        if layers % (p * v):
            raise ValueError(
                f"model.layers: {layers} is not divisible by pp·virtual_stages = "
                f"{p}·{v} = {p * v}; change pp or virtual_stages, or set "
                "parallelism.first_stage_layers / last_stage_layers"
            )
        return [layers // p] * p
    fixed = {0: first, p - 1: last}
    fixed = {s: n for s, n in fixed.items() if n is not None}
    rest = layers - sum(fixed.values())
    middle = p - len(fixed)
    if rest < 0 or (middle == 0 and rest) or (middle and rest % middle):
        named = ", ".join(f"{k}={n}" for k, n in
                          (("first_stage_layers", first), ("last_stage_layers", last))
                          if n is not None)
        raise ValueError(
            f"parallelism: {named} leave {rest} of model.layers={layers} for the other "
            f"{middle} stage(s), which must split them evenly; change those counts"
        )
    each = rest // middle if middle else 0
    out = [fixed.get(s, each) for s in range(p)]
    for s in range(p):
        if s not in fixed and out[s] % v:
            raise ValueError(
                f"parallelism.virtual_stages: {v} does not divide the {out[s]} layers of the "
                "middle stages; change virtual_stages or the first/last stage layers"
            )
    return out


def _given_stage_layers(layers: int, given: list[int], v: int) -> list[int]:
    """``parallelism.layers_per_stage`` checked: it holds every layer, and each stage's
    count splits over its ``v`` model chunks."""
    if sum(given) != layers:
        raise ValueError(
            f"parallelism.layers_per_stage: {given} sum to {sum(given)}, not model.layers="
            f"{layers}; give counts that add up to {layers}"
        )
    uneven = [n for n in given if n % v]
    if uneven:
        raise ValueError(
            f"parallelism.virtual_stages: {v} does not divide the {uneven[0]} layers a stage "
            "holds in parallelism.layers_per_stage; change virtual_stages or the counts"
        )
    return list(given)


def chunk_layers(layers: int, par: Parallelism) -> list[list[int]]:
    """Transformer layers of each model chunk: ``[stage][chunk]``.

    Raises ``ValueError`` when the layers cannot be split (see the module docstring).
    """
    p, v = par.pp, par.virtual_stages
    out = []
    for s, n in enumerate(stage_layers(layers, par)):
        base, extra = divmod(n, v)
        if s == 0 and p > 1:  # shortfall on the earliest chunks
            sizes = [base + (c >= v - extra) for c in range(v)]
        else:  # the last stage (and any evenly split stage): shortfall on the latest
            sizes = [base + (c < extra) for c in range(v)]
        for c, size in enumerate(sizes):
            vs = c * p + s
            if size == 0 and vs not in (0, p * v - 1):
                field = "first_stage_layers" if s == 0 else "last_stage_layers"
                raise ValueError(
                    f"parallelism.{field}: {n} layers over {v} virtual stages leave model "
                    f"chunk {c} of stage {s} empty; give that stage at least {v - 1} layers"
                )
        out.append(sizes)
    return out


def chunk_first_layer(split: list[list[int]], stage: int, chunk: int,
                      hops: tuple[tuple[int, int], ...] | None = None) -> int:
    """Index of the first transformer layer of model chunk ``chunk`` of ``stage``, given
    :func:`chunk_layers`' split: the virtual stages hold the layers in order, virtual
    stage ``k`` being ``hops[k]`` (stage, chunk) — by default ``chunk·pp + stage``
    (Narayanan et al. 2021 §2.2.2); ZB-V's V places them otherwise."""
    p = len(split)
    if hops is None:
        vs = chunk * p + stage
        return sum(split[v % p][v // p] for v in range(vs))
    vs = hops.index((stage, chunk))
    return sum(split[s][c] for s, c in hops[:vs])


class _Split(NamedTuple):
    """The parallelism's fields :func:`chunk_layers` reads."""

    pp: int
    virtual_stages: int
    first_stage_layers: int | None
    last_stage_layers: int | None
    layers_per_stage: list[int] | None


@functools.lru_cache(maxsize=4096)
def split_refused(layers: int, pp: int, virtual_stages: int, first: int | None,
                  last: int | None, per_stage: tuple[int, ...] | None) -> str:
    """:func:`chunk_layers`' refusal of this split ("" where the layers split), memoised:
    the scenario's validation checks it, and a layout search validates a few dozen splits
    some 100,000 times."""
    try:
        chunk_layers(layers, _Split(pp, virtual_stages, first, last,  # type: ignore[arg-type]
                                    None if per_stage is None else list(per_stage)))
    except ValueError as exc:
        return str(exc)
    return ""
