"""The core layouts a search prices, drawn from a space counted before it is made.

A space can be far larger than anything a machine can hold or price: ``--batch-range
1024..2048`` on ``selene-gpt3`` has 50 million core layouts (each of its 1,025 batches a
space of its own), ``1..100000`` five billion. :func:`draw_layouts` counts the space by its
branches (:func:`.space.branches`: a branch knows its size without making a layout), then

- with ``max_layouts`` below the count, picks that many indices with the seeded
  :meth:`random.Random.sample` over ``range(count)`` and makes only the branches that hold
  them: the same draw as ``Random(seed).sample(list_of_the_space, max_layouts)`` (CPython
  samples a sequence by index), in memory of the order of ``max_layouts`` (where the
  count is below about 12 × ``max_layouts``, CPython's ``sample`` holds a list of the
  count's indices for a moment: some 40 bytes each);
- otherwise makes the whole space, if it is at most :data:`MAX_CORE_LAYOUTS`, and refuses
  with one sentence (:class:`~llmsim.errors.UserError`, exit 2) if it is larger.

Counting costs about 5 µs of CPU a branch; a space of more than :data:`MAX_BRANCHES`
branches is refused before it is counted through. :func:`draw_batches` gives the search
its batches: a sample's layouts cut into them, the whole space's cut from its branches
(:func:`.batching.cuts`), whose layouts the workers make.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

from llmsim.errors import UserError
from llmsim.search.batch_range import batch_range_text
from llmsim.search.batching import Part, batches, cuts
from llmsim.search.layout import Layout
from llmsim.search.space import (
    Branch,
    SpaceOptions,
    StateFilter,
    branch_layout,
    branches,
    cores,
)
from llmsim.specs import Scenario

MAX_CORE_LAYOUTS = 5_000_000
"""Most core layouts a search prices (before the overlap switches): above every catalog
scenario's whole space at its own batch (the largest, ``openai-a100-moe``, has 4.1
million). ``selene-gpt3``'s 409,701 take about a minute on two cores and some 80 MB as a
list (the parent's peak RSS, 56 → 138 MB), so this bound is some 13 minutes there and
about 1 GB of layouts, before the priced rows (not measured at this size). A larger space
needs ``--max-layouts`` or a narrower one."""

MAX_BRANCHES = 10_000_000
"""Most branches counted (about a minute of CPU): ``--batch-range 1024..2048`` has
462,553 on ``selene-gpt3``, 1.6 million on ``openai-a100-moe``."""


def draw_layouts(scenario: Scenario, options: SpaceOptions, fits: StateFilter | None,
                 max_layouts: int | None, seed: int) -> tuple[list[Layout], int, bool]:
    """(the core layouts to price, the space's size, whether they are a sample).

    The whole space in the enumeration's order, or a seeded sample of ``max_layouts``
    of it, sorted, as :func:`llmsim.search.search` has always drawn it."""
    count = _count(scenario, options, fits)
    if _sampled(scenario, options, count, max_layouts):
        return _sample(scenario, options, fits, max_layouts or 0, seed, count), count, True
    return list(cores(scenario, options, fits)), count, False


@dataclass(frozen=True)
class Drawn:
    """What a search prices: :func:`draw_layouts`' layouts cut into batches."""

    batches: list[Part]
    """The batches in their order (a batch's index is its number in the store)."""
    branches: list[Branch] | None
    """The branches the batches are :class:`~.batching.Cut` s of (None: a sample's
    batches, each a list of its layouts)."""
    core_layouts: int
    """Core layouts in the batches."""
    space_layouts: int
    """Core layouts in the whole space."""
    sampled: bool


def draw_batches(scenario: Scenario, options: SpaceOptions, fits: StateFilter | None,
                 max_layouts: int | None, seed: int, bounded: bool = False) -> Drawn:
    """:func:`draw_layouts`' layouts in their batches (:func:`.batching.batches`, most
    devices first with ``bounded``). The whole space's batches are cut from its branches
    (:func:`.batching.cuts`: the same batches), and their layouts made only where they
    are priced; a sample's are made here."""
    count = _count(scenario, options, fits)
    if _sampled(scenario, options, count, max_layouts):
        drawn = _sample(scenario, options, fits, max_layouts or 0, seed, count)
        return Drawn(list(batches(drawn, bounded)), None, len(drawn), count, True)
    space = list(branches(scenario, options, fits))
    return Drawn(list(cuts(space, bounded)), space, count, count, False)


def _sampled(scenario: Scenario, options: SpaceOptions, count: int,
             max_layouts: int | None) -> bool:
    """Whether ``max_layouts`` samples the space of ``count`` core layouts; refuses a
    sample or a space larger than :data:`MAX_CORE_LAYOUTS`."""
    if max_layouts is not None and count > max_layouts:
        if max_layouts > MAX_CORE_LAYOUTS:
            raise UserError(
                f"--max-layouts: {max_layouts:,} is more than the {MAX_CORE_LAYOUTS:,} core "
                f"layouts a search prices in bounded time and memory (the space of "
                f"{scenario.name} has {count:,}); use --max-layouts {MAX_CORE_LAYOUTS} or "
                "fewer")
        return True
    if count > MAX_CORE_LAYOUTS:
        raise UserError(_too_large(scenario, options, f"has {count:,} core layouts"))
    return False


def _sample(scenario: Scenario, options: SpaceOptions, fits: StateFilter | None,
            max_layouts: int, seed: int, count: int) -> list[Layout]:
    """The seeded sample of ``max_layouts`` of the ``count`` core layouts, sorted."""
    indices = random.Random(seed).sample(range(count), max_layouts)
    return sorted(pick(scenario, options, fits, sorted(indices)))


def pick(scenario: Scenario, options: SpaceOptions, fits: StateFilter | None,
         indices: list[int]) -> Iterator[Layout]:
    """The core layouts at ``indices`` (ascending) of the enumeration's order, each made
    alone from the branch that holds it."""
    start, wanted = 0, iter(indices)
    index = next(wanted, None)
    for branch in branches(scenario, options, fits):
        if index is None:
            return
        end = start + branch.size
        while index is not None and index < end:
            yield branch_layout(branch, options.fixed, index - start)
            index = next(wanted, None)
        start = end


def _count(scenario: Scenario, options: SpaceOptions, fits: StateFilter | None) -> int:
    count = 0
    for seen, branch in enumerate(branches(scenario, options, fits), 1):
        if seen > MAX_BRANCHES:  # each holds a layout at least: no sample is drawn either
            raise UserError(_too_large(scenario, options, f"has more than {MAX_BRANCHES:,} "
                                       "branches (degrees, nodes, ZeRO stage) to count",
                                       sample=False))
        count += branch.size
    return count


def _too_large(scenario: Scenario, options: SpaceOptions, what: str,
               sample: bool = True) -> str:
    """The refusal: the option that made the space, its value, its size and the fix."""
    bound = f"more than the {MAX_CORE_LAYOUTS:,} a search prices in bounded time and memory" \
        if sample else f"more than {MAX_BRANCHES:,} core layouts"
    sampled = ", or add --max-layouts N to price a seeded sample of N" if sample else ""
    if options.batch_range is not None:
        step = "a larger step" if len(options.batch_range) > 2 else "a step, e.g. LOW..HIGH:64"
        return (f"--batch-range: {batch_range_text(options.batch_range)} on {scenario.name} "
                f"{what}, {bound}; narrow the range or give it {step} (each batch in it is a "
                f"space of its own){sampled}")
    return (f"the layout space of {scenario.name} {what}, {bound}; narrow it with --fix "
            f"(e.g. --fix parallelism.tp=8){sampled}")
