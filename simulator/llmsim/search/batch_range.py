"""The global batches a search tries: the scenario's, or a ``--batch-range``.

``LOW..HIGH`` is every whole number from LOW to HIGH, ``LOW..HIGH:STEP`` every STEP-th from
LOW (docs/search.md, "A range of global batches"): each is a space of its own, which
:func:`.space.branches` enumerates batch after batch and :mod:`.draw` counts.
"""

from __future__ import annotations

from llmsim.errors import UserError


def global_batches(own: int, batch_range: tuple[int, ...] | None) -> range:
    """The global batches searched: the scenario's own, or every whole number of
    ``batch_range`` (a third number: every step-th from the first); a batch that no layout
    can make adds nothing to the space."""
    if batch_range is None:
        return range(own, own + 1)
    low, high, *step = batch_range
    return range(low, high + 1, *step)


def check_batch_range(batch_range: tuple[int, ...] | None) -> None:
    """Refuse a batch range that is not (low, high) or (low, high, step) of positive
    whole numbers with low ≤ high (:class:`~llmsim.errors.UserError`, one sentence)."""
    if batch_range is None:
        return
    if len(batch_range) not in (2, 3) or not all(isinstance(x, int) for x in batch_range):
        raise UserError(f"--batch-range: {batch_range!r} must be LOW..HIGH or LOW..HIGH:STEP "
                        "in whole sequences, e.g. 1024..2048:128")
    if batch_range[0] < 1 or batch_range[0] > batch_range[1] or min(batch_range) < 1:
        raise UserError(f"--batch-range: {batch_range_text(batch_range)} must be positive "
                        "numbers, the first not above the second (e.g. 1024..2048:128)")


def batch_range_text(batch_range: tuple[int, ...]) -> str:
    """``1024..2048``, or ``1024..2048:128`` with a step: as ``--batch-range`` takes it."""
    low, high, *step = batch_range
    return f"{low}..{high}" + "".join(f":{s}" for s in step)
