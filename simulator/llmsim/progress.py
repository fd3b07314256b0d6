"""Progress of long work: a bar on a terminal, a plain line every few seconds otherwise."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TextIO, TypeVar

T = TypeVar("T")

LINE_EVERY_S = 5.0
"""Seconds between two progress lines when stderr is not a terminal."""


def track(items: Sequence[T], what: str, label: Callable[[T], str] = str,
          stream: TextIO | None = None, every_s: float = LINE_EVERY_S,
          clock: Callable[[], float] = time.monotonic) -> Iterator[T]:
    """Yield ``items`` while showing how far the work is and an estimate of what is left.

    On a terminal a transient rich bar; otherwise (CI logs, ``2> log``, a pipe) one line
    on ``stream`` (stderr) at most every ``every_s`` seconds and, if there was one, one
    at the end, e.g.
    ``validating: 12/86 done, 14 s elapsed, about 86 s left (NAR21-…)``. The estimate
    assumes the items left take as long as the mean of those done.
    """
    stream = sys.stderr if stream is None else stream
    if stream.isatty():
        from rich.progress import Progress

        with Progress(transient=True) as bar:
            task = bar.add_task(what, total=len(items))
            for item in items:
                bar.update(task, description=f"{label(item):<28}")
                yield item
                bar.advance(task)
        return
    start = last = clock()
    shown = False
    for done, item in enumerate(items):
        now = clock()
        if done and now - last >= every_s:
            shown = True
            left = (now - start) / done * (len(items) - done)
            stream.write(f"{what}: {done}/{len(items)} done, {now - start:.0f} s elapsed, "
                         f"about {left:.0f} s left ({label(item)})\n")
            stream.flush()
            last = now
        yield item
    if shown:  # work that took less than ``every_s`` needs no word
        stream.write(f"{what}: {len(items)}/{len(items)} done in {clock() - start:.0f} s\n")
        stream.flush()
