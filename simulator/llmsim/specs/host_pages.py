"""Host page costs: what the OS charges a CPU device's framework for fresh memory."""

from __future__ import annotations

from pydantic import PositiveFloat

from llmsim.specs._base import Spec


class HostPageCosts(Spec):
    """Measured rates of the OS's page round trip on a CPU device, whose framework takes
    every tensor from the C library's allocator (no caching allocator of its own).

    A block the allocator returns to the OS at ``free`` (``munmap``) is mapped again at the
    next allocation and faulted in page by page when first written: the kernel allocates
    and zeroes each page. The rates are bytes per second of the whole round trip's parts.
    """

    unmap_gbps: PositiveFloat
    """Bytes one thread returns to the OS per second (``munmap`` of freed blocks), GB/s."""
    fault_gbps_per_core: PositiveFloat
    """Bytes one core faults in per second (page allocation and zeroing), GB/s."""
    write_gbps: PositiveFloat
    """Peak write bandwidth of the device's memory, GB/s: the zeroing of all cores'
    faults together streams through it."""
