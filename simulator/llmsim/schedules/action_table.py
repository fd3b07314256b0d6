"""Pipeline actions made once per process and shared by the orders that list them.

An :class:`~llmsim.schedules.action.Action` is a frozen value; creating one costs about
a microsecond of Python (its dataclass ``__init__``), and the layout search builds
orders of up to a million passes, the same (stage, kind, micro-batch, chunk) again for
each number of micro-batches of a pipeline depth. The orders that the search builds
(:mod:`.chimera`, :mod:`.dualpipe`, :func:`.orders.greedy_order`) take their actions from
:func:`actions` instead: equal values, the same object each time.
"""

from __future__ import annotations

import threading

from llmsim.schedules.action import Action, Kind

MAX_ACTIONS = 1_000_000
"""Most actions the table keeps (at most some 80 MB: an action and its micro-batch's integer);
past it, it starts again empty. The deepest order of selene-gpt3's space (96 stages,
1,536 micro-batches, two chunks, three kinds: 885 k actions) fits."""

_TABLE: dict[tuple[int, str, int], list[Action]] = {}
_HELD = [0]
_LOCK = threading.Lock()


def actions(stage: int, kind: Kind, chunk: int, microbatches: int) -> list[Action]:
    """``Action(stage, kind, mb, chunk)`` for every ``mb < microbatches``, at index mb
    (the list may be longer; do not change it); the same objects on every call. A list
    handed out is never changed: a longer one replaces it (so threads that price at once,
    as a Dask worker's may, read whole lists)."""
    row = _TABLE.get((stage, kind, chunk))
    if row is not None and len(row) >= microbatches:
        return row
    with _LOCK:
        row = _TABLE.get((stage, kind, chunk), [])
        if len(row) >= microbatches:
            return row
        if _HELD[0] + microbatches - len(row) > MAX_ACTIONS:
            _TABLE.clear()
            _HELD[0] = 0
            row = []
        _HELD[0] += microbatches - len(row)
        row = row + [Action(stage, kind, mb, chunk) for mb in range(len(row), microbatches)]
        _TABLE[stage, kind, chunk] = row
        return row
