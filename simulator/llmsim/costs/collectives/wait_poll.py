"""A collective as a polling host sees it: the wait ends at the first poll after the
collective has finished (``parallelism.collective_wait_poll_ms``)."""

from __future__ import annotations

import math


def polled_s(duration_s: float, period_s: float) -> float:
    """``duration_s`` rounded up to a whole number of poll periods ``period_s``, seconds.

    PyTorch's ``ProcessGroupNCCL::WorkNCCL::synchronizeInternal`` under
    ``NCCL_BLOCKING_WAIT=1`` checks ``isCompleted()`` when the wait begins and then after
    every ``sleep_for(kSynchronizeBusyWaitMillis)`` (10 ms up to October 2024; 1 ms in
    ``WorkNCCL::wait`` of the sources after it), so a call issued and waited on at once
    holds its thread for ⌈t / p⌉·p. The wait is taken to begin when the
    collective does (the host issues it and waits at once; device work queued before it
    is not counted). A zero duration (a one-rank group) stays zero; ``period_s`` 0: no
    poll.
    """
    if period_s <= 0 or duration_s <= 0:
        return duration_s
    periods = math.ceil(duration_s / period_s - 1e-9)
    return max(periods, 1) * period_s
