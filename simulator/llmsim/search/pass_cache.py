"""A per-process memo of compiled schedule orders, bounded by the passes they hold: the
least recently used ones are dropped once the total exceeds the bound (ZB-V's walks,
:mod:`.zb_v_walk`; Chimera's and DualPipe's orders, :mod:`.two_pipelines`)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")


class PassBoundedCache(Generic[T]):
    """``get(key, make)``: the value kept for ``key``, else ``make()`` kept; values of
    ``size(value)`` passes together at most ``max_passes`` (the newest always kept)."""

    def __init__(self, max_passes: int, size: Callable[[T], int]) -> None:
        self.max_passes = max_passes
        self._size = size
        self._kept: OrderedDict[Hashable, T] = OrderedDict()
        self._passes = 0

    def get(self, key: Hashable, make: Callable[[], T]) -> T:
        hit = self._kept.get(key)
        if hit is not None:
            self._kept.move_to_end(key)
            return hit
        hit = self._kept[key] = make()
        self._passes += self._size(hit)
        while self._passes > self.max_passes and len(self._kept) > 1:
            _, old = self._kept.popitem(last=False)
            self._passes -= self._size(old)
        return hit

    def __len__(self) -> int:
        return len(self._kept)

    @property
    def passes(self) -> int:
        """Passes of the values kept."""
        return self._passes
