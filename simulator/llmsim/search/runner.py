"""Running the pricing batches: in this process, on a local process pool, or on Dask.

Each runner takes the batches still to price and yields ``(index, BatchResult)`` as
they finish, in any order; the caller stores them. A local pool uses every core
(``workers``); a Dask ``Client`` spreads the batches over its cluster's workers, for
sweeps beyond one machine (``llmsim search --scheduler tcp://host:8786``).
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any

from llmsim.search.price import BatchResult, price_batch
from llmsim.search.space import Layout
from llmsim.specs import Scenario

Batches = list[tuple[int, list[Layout]]]


def run_serial(base: Scenario, batches: Batches, fixed: dict[str, Any],
               headroom: float) -> Iterator[tuple[int, BatchResult]]:
    """Price the batches one after another in this process."""
    for index, cores in batches:
        yield index, price_batch(base, cores, fixed, headroom)


def run_pool(base: Scenario, batches: Batches, fixed: dict[str, Any], headroom: float,
             workers: int) -> Iterator[tuple[int, BatchResult]]:
    """Price the batches on ``workers`` local processes."""
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(price_batch, base, cores, fixed, headroom): index
                   for index, cores in batches}
        try:
            for future in as_completed(futures):
                yield futures[future], future.result()
        finally:
            for future in futures:
                future.cancel()


def run_dask(base: Scenario, batches: Batches, fixed: dict[str, Any], headroom: float,
             client: Any) -> Iterator[tuple[int, BatchResult]]:
    """Price the batches on a ``dask.distributed`` cluster through ``client``."""
    from distributed import as_completed as dask_completed

    base_future = client.scatter(base, broadcast=True)
    futures = {client.submit(price_batch, base_future, cores, fixed, headroom,
                             key=f"llmsim-price-{index}-{id(batches)}", pure=False): index
               for index, cores in batches}
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
