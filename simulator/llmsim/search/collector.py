"""Python's cyclic garbage collector held off while the search makes objects that live.

The search makes millions of objects that stay alive — the enumeration's layouts, each
worker's memo tables of priced parts (:mod:`.parts`, :mod:`.estimate`) — and, measured,
no cyclic garbage at all: over every 10th batch of selene-gpt3 (37,486 layouts priced)
a collection of each batch's new objects found 0 unreachable ones; everything the
pricing drops is freed by reference counting. Yet the collector, triggered every 700
allocations (Python's default threshold), walked them again and again: 3,768 young,
343 middle and 8 whole-heap passes, 2.3 of 14.9 CPU-seconds (15 %; a pool worker, forked
from the parent, also walks the parent's enumeration in its whole-heap passes).

So a batch is priced with the automatic collector off (:func:`paused`) and its young
objects collected once at the end, so that a cycle made in a batch would still be freed
as before; a pool worker, a process of the search's own, also moves what survives a
batch to the collector's permanent generation (:func:`freeze_survivors`), which later
passes skip. The parent's enumeration is made with the collector paused too.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused() -> Iterator[None]:
    """The automatic cyclic collection off inside the block; on leaving it, the objects
    made in it that are still young collected once (cycles among them freed) and the
    collector's state restored. Nested or with the collector already off: the outermost
    enabled block does the collecting."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.collect(0)
            gc.enable()


def freeze_survivors() -> None:
    """Move every object the collector tracks to its permanent generation, which its
    passes skip (a pool worker after each batch: its memo tables are walked no more).
    Only for processes the search owns: a cycle among frozen objects that later becomes
    garbage is never collected (the pricing makes none: above)."""
    gc.freeze()
