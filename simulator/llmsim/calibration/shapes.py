"""The GEMM shapes a scenario runs: the ones worth timing for its GEMM table."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from typing import TYPE_CHECKING

from llmsim.ops import ComputeOp

if TYPE_CHECKING:
    import pandas as pd

    from llmsim.workload import Workload


SHAPE_COLUMNS: tuple[str, ...] = (
    "m", "n", "k", "dtype", "batch", "calls_per_step", "gflop_per_call", "flop_share_pct",
)


def gemm_shapes(workloads: Iterable[tuple[Workload, str]]) -> pd.DataFrame:
    """The distinct GEMMs the workloads run: the shapes to time for a GEMM table.

    Each item is a workload and its training precision (the dtype of a GEMM that names
    none). A GEMM split into chunks (Transformer Engine's overlapped GEMMs) is listed as
    the chunk's shape, the one its price is looked up by. ``calls_per_step`` counts one
    pipeline replica's calls in a step (all its stages and micro-batches, recompute
    included, summed over the workloads); ``flop_share_pct`` is the shape's share of
    those GEMM FLOPs. Sorted by share, largest first, in :data:`SHAPE_COLUMNS`.
    """
    import pandas as pd

    calls: dict[tuple[int, int, int, str, int], int] = defaultdict(int)
    for workload, precision in workloads:
        for chunk in workload.chunks.values():
            for op in chunk.ops:
                if not isinstance(op, ComputeOp) or op.kind != "gemm" or op.mnk is None:
                    continue
                m, n, k = op.mnk
                key = (math.ceil(m / op.splits), n, k, op.dtype or precision, op.batch)
                calls[key] += op.splits * workload.microbatches_per_chunk
    rows = [{"m": m, "n": n, "k": k, "dtype": dtype, "batch": batch,
             "calls_per_step": count,
             "gflop_per_call": 2 * batch * m * n * k / 1e9}
            for (m, n, k, dtype, batch), count in calls.items()]
    df = pd.DataFrame(rows, columns=list(SHAPE_COLUMNS[:-1]))
    flop = df["calls_per_step"] * df["gflop_per_call"]
    df["flop_share_pct"] = 100 * flop / flop.sum()
    return df.sort_values("flop_share_pct", ascending=False, ignore_index=True)
