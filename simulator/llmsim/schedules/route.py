"""Routes: the (stage, chunk) pairs a micro-batch's forward visits, in order.

A schedule places model chunks on stages; the route of a micro-batch lists, for virtual
stage ``k = 0, 1, …``, the stage and the chunk that run its ``k``-th piece of the model.
Its backward visits the route in reverse. Three placements exist:

- looping (Narayanan et al. 2021 §2.2, Fig. 4): virtual stage ``c·p + s`` is chunk ``c``
  of stage ``s``; with one chunk, the plain pipeline ``0, 1, …, p−1``;
- V-shape (Qi et al. 2024, ZB-V, §6): two chunks, the first down the stages and the
  second back up, so that stage 0 holds the first and the last virtual stage;
- bidirectional (Li & Hoefler 2021 §3.1, Chimera): two pipelines of ``p`` stages each in
  opposite directions; of each p micro-batches, the first half goes down pipeline 0
  (chunk 0 of stage ``s`` is its stage ``s``), the second half up pipeline 1 (chunk 1 of stage
  ``s`` is its stage ``p − 1 − s``).
"""

from __future__ import annotations

from collections.abc import Callable

Hop = tuple[int, int]
"""(stage, chunk)."""
Route = Callable[[int], tuple[Hop, ...]]
"""micro-batch → the (stage, chunk) of each of its virtual stages, first to last."""


def looping(stages: int, chunks: int) -> Route:
    """Virtual stage ``c·p + s`` on stage ``s``, chunk ``c``, for every micro-batch."""
    hops = tuple((s, c) for c in range(chunks) for s in range(stages))
    return lambda _mb: hops


def v_shape(stages: int) -> Route:
    """Down the stages in chunk 0, back up in chunk 1: virtual stage ``k < p`` is stage
    ``k`` chunk 0, virtual stage ``k ≥ p`` is stage ``2p − 1 − k`` chunk 1."""
    hops = tuple((s, 0) for s in range(stages)) + tuple(
        (s, 1) for s in reversed(range(stages)))
    return lambda _mb: hops


def bidirectional(stages: int) -> Route:
    """Chimera's two pipelines, in units of p micro-batches: the first p/2 of each unit
    down chunk 0, the others up chunk 1 (stage ``p − 1`` first)."""
    down = tuple((s, 0) for s in range(stages))
    up = tuple((s, 1) for s in reversed(range(stages)))
    half = max(stages // 2, 1)
    return lambda mb: down if mb % (2 * half) < half else up


def position(route: Route, microbatch: int, stage: int, chunk: int) -> int:
    """The virtual stage of (stage, chunk) on ``microbatch``'s route; ValueError if the
    micro-batch never visits it."""
    return route(microbatch).index((stage, chunk))
