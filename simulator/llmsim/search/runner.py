"""Running the pricing batches: in this process, on a local process pool, or on Dask.

Each runner takes the batches still to price and yields ``(index, BatchResult)`` as
they finish, in any order; the caller stores them. A batch is its core layouts, or a
:class:`~.batching.Cut` of the space's ``branches`` whose layouts are made where it is
priced (a local worker is given the branches once, when it starts). A local pool uses every core
(``workers``); a Dask ``Client`` spreads the batches over its cluster's workers, for
sweeps beyond one machine (``llmsim search --scheduler tcp://host:8786``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from contextlib import ExitStack
from typing import Any

from llmsim.search.affinity import Affinity, affinity_groups, static_owners
from llmsim.search.batching import Part, layouts_of
from llmsim.search.price import BatchResult, price_batch
from llmsim.search.space import Branch
from llmsim.search.store import arrow_text
from llmsim.specs import Scenario

Batches = list[tuple[int, Part]]

AHEAD = 1
"""Batches queued per local worker process beyond the one it prices: one, so that it never
waits for the next. A queued batch is sent to its process at once (the executor's call
queue holds it, marked running), where no other worker can take it: at c7b064b's five a
worker, the last three of a worker left with long ones kept it busy while the other
idled (a whole search's tail, 2.2–2.7 s of wall at load 2–5, session s15)."""

LAST = 2
"""Once the feed holds at most ``LAST`` batches a worker, a worker is sent its next batch
only when it has none left, so that the last ones go to whichever is free first."""

Keep = Callable[[int], bool]
"""``keep(index)``: whether batch ``index`` is still worth pricing (False: neither it nor
any later batch is: the search's bound, :mod:`llmsim.search.bound`)."""


Space = Sequence[Branch] | None
"""The space's branches the batches' :class:`~.batching.Cut` s are cut from (None: every
batch is a list of layouts)."""


def price_part(base: Scenario, branches: Space, part: Part, fixed: dict[str, Any],
               headroom: float) -> BatchResult:
    """:func:`price_batch` of a batch's layouts, made here if it is a Cut."""
    return price_batch(base, layouts_of(part, branches, fixed), fixed, headroom)


def run_serial(base: Scenario, batches: Batches, fixed: dict[str, Any],
               headroom: float, keep: Keep | None = None,
               branches: Space = None) -> Iterator[tuple[int, BatchResult]]:
    """Price the batches one after another in this process."""
    for index, part in batches:
        if keep is not None and not keep(index):
            return
        yield index, price_part(base, branches, part, fixed, headroom)


_BASE: list[tuple[Scenario, Space]] = []
"""A pool worker's base scenario and the space's branches, given once when the worker
starts (:func:`run_pool`)."""


def _keep_base(base: Scenario, branches: Space) -> None:
    _BASE[:] = [(base, branches)]


def _price_on_worker(part: Part, fixed: dict[str, Any], headroom: float) -> BatchResult:
    """:func:`price_part` of the worker's base scenario and branches, its text columns
    as Arrow strings (:func:`.store.arrow_text`: a quarter of the bytes to send back)."""
    base, branches = _BASE[0]
    result = price_part(base, branches, part, fixed, headroom)
    result.columns = arrow_text(result.columns)
    return result


def run_pool(base: Scenario, batches: Batches, fixed: dict[str, Any], headroom: float,
             workers: int, keep: Keep | None = None,
             branches: Space = None) -> Iterator[tuple[int, BatchResult]]:
    """Price the batches on ``workers`` local processes, each fed by affinity group
    (:mod:`.affinity`: the batches of one pipeline depth to one worker, so that their
    placements are priced once in the search) and a batch ahead of it (:data:`AHEAD`,
    the last ones as a worker is free: :data:`LAST`): the batches not yet sent and the
    results already stored are not held twice. Each worker gets the base scenario and
    ``branches`` once, when it starts (pickling the scenario with every batch cost more
    than a small batch's layouts), and makes a Cut's layouts itself. With ``keep`` (the
    days bound) the groups go most devices first and a batch ``keep`` refuses is not
    priced."""
    feed = Affinity(affinity_groups(batches, bounded=keep is not None), workers)
    with ExitStack() as stack:
        pools = [stack.enter_context(ProcessPoolExecutor(
            max_workers=1, initializer=_keep_base, initargs=(base, branches)))
            for _ in range(workers)]
        futures: dict[Future, tuple[int, int]] = {}  # → (index, worker)

        def fill(worker: int) -> None:
            """Send ``worker`` batches up to its share in flight (:data:`AHEAD`,
            :data:`LAST`)."""
            while in_flight(worker) < (1 + AHEAD if feed.left > LAST * workers else 1):
                batch = feed.next(worker)
                while batch is not None and keep is not None and not keep(batch[0]):
                    batch = feed.next(worker)
                if batch is None:
                    return
                index, part = batch
                futures[pools[worker].submit(_price_on_worker, part, fixed, headroom)] = \
                    (index, worker)

        def in_flight(worker: int) -> int:
            return sum(1 for _, owner in futures.values() if owner == worker)

        for worker in range(workers):
            fill(worker)
        try:
            while futures:
                done, _ = wait(futures, return_when=FIRST_COMPLETED)
                finished = [(futures.pop(future), future) for future in done]
                for (_, worker), _ in finished:  # first the next batches, then the store
                    fill(worker)
                for (index, _), future in finished:
                    yield index, future.result()
        finally:
            for future in futures:
                future.cancel()


def run_dask(base: Scenario, batches: Batches, fixed: dict[str, Any], headroom: float,
             client: Any, branches: Space = None) -> Iterator[tuple[int, BatchResult]]:
    """Price the batches on a ``dask.distributed`` cluster through ``client``, each
    affinity group (:mod:`.affinity`) asked of one worker (the groups split by their
    layouts); Dask's work stealing may still move a batch to an idle worker."""
    from distributed import as_completed as dask_completed

    base_future = client.scatter(base, broadcast=True)
    space_future = client.scatter([branches], broadcast=True)[0] \
        if branches is not None else None  # one object (a list is scattered by element)
    groups = affinity_groups(batches)
    addresses = sorted(client.scheduler_info()["workers"])
    owners = static_owners(groups, len(addresses)) if addresses else [None] * len(groups)
    futures = {}
    for group, owner in zip(groups, owners, strict=True):
        where = {"workers": [addresses[owner]], "allow_other_workers": True} \
            if owner is not None else {}
        for index, part in group:
            futures[client.submit(price_part, base_future, space_future, part, fixed,
                                  headroom,
                                  key=f"llmsim-price-{index}-{id(batches)}", pure=False,
                                  **where)] = index
    try:
        for future in dask_completed(list(futures)):
            yield futures[future], future.result()
    finally:
        client.cancel(list(futures))


def connect(scheduler: str) -> Any:
    """A Dask client for the scheduler at ``scheduler`` (``tcp://host:8786``)."""
    try:
        from distributed import Client
    except ImportError as err:  # pragma: no cover - a declared dependency
        raise RuntimeError("dask.distributed is not installed") from err
    from llmsim.errors import UserError

    try:
        return Client(scheduler, timeout="10s")
    except (OSError, TimeoutError, ValueError) as err:
        raise UserError(f"--scheduler: cannot reach the Dask scheduler at {scheduler!r} "
                        f"({err}); start one (`dask scheduler`) or drop --scheduler") from None
