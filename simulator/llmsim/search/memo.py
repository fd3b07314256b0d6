"""A bounded memo of walks' results, by their exact inputs."""

from __future__ import annotations

from typing import Any


class BoundedMemo(dict):
    """Results by their exact inputs, emptied when ``size`` are held: a search meets its
    layouts in batches of one walk key (:mod:`.batching`), so what a clear drops is rarely
    asked for again. ``owner`` ties the results to one object (a compiled order): asking
    for another's empties the memo first."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size
        self.owner: Any = None

    def put(self, key: tuple, value: Any) -> Any:
        """Keep ``value`` for ``key`` (emptying a full memo first); returns it."""
        if len(self) >= self.size:
            self.clear()
        self[key] = value
        return value

    def keep_for(self, owner: object) -> None:
        """Hold results of ``owner`` only from now on."""
        if self.owner is not owner:
            self.clear()
            self.owner = owner
