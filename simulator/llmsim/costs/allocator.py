"""The page round trip of tensors a CPU framework takes from glibc's ``malloc``.

PyTorch on a CPU has no caching allocator: every tensor comes from the C library
(``c10::alloc_cpu``: ``posix_memalign``) and goes back to it with ``free``. glibc serves
a request at or above its mmap threshold with its own ``mmap`` and returns it with
``munmap`` at ``free``; the threshold adapts upward after such a free but never past
``DEFAULT_MMAP_THRESHOLD_MAX`` = 4·1024·1024·sizeof(long) = 32 MiB on 64-bit (glibc
``malloc/malloc.c``). So a tensor of 32 MiB or more is unmapped when freed, and the next
one is faulted in again, page by page, as its kernel first writes it. tcmalloc keeps
freed spans and maps nothing in a steady step (``training.allocator: caching``).

Each such tensor costs its bytes twice:

* the ``munmap`` on the thread that frees it (PyTorch's main thread, between kernels, so
  the kernels wait), at the measured ``unmap_gbps``;
* the faults that map and zero its pages, taken by the kernel's threads, each core at
  the measured ``fault_gbps_per_core`` and all together at most at the memory's write
  peak, ``write_gbps``, which the zeroing streams through.

Both rates are the device's (``Accelerator.host_pages``, with their source). The cost is
charged to the op that allocates the tensor (``ComputeOp.output_bytes``); tensors below
the threshold come from glibc's arenas and are charged nothing, which leaves out the
arenas' own trimming (a lower bound).
"""

from __future__ import annotations

from llmsim.errors import UserError
from llmsim.ops import ComputeOp
from llmsim.specs import Accelerator

GLIBC_MMAP_THRESHOLD_MAX_BYTES = 4 * 1024 * 1024 * 8
"""glibc's ``DEFAULT_MMAP_THRESHOLD_MAX`` on 64-bit, bytes (32 MiB): the largest the
dynamic mmap threshold becomes, so every request of this size or more is mmapped."""


class PageRoundTrip:
    """Seconds a glibc-allocated tensor costs in ``munmap`` and page faults on one device."""

    def __init__(self, accelerator: Accelerator) -> None:
        pages = accelerator.host_pages
        if pages is None:
            raise UserError(
                f"training.allocator: glibc needs measured page costs of {accelerator.name} "
                "(host_pages: unmap_gbps, fault_gbps_per_core, write_gbps) and it has none; "
                "use training.allocator: caching, or add host_pages to the accelerator"
            )
        self.threads = accelerator.gemm.compute_units
        """Cores that fault a tensor's pages in together (the op's threads), one per
        compute unit."""
        self.unmap_bytes_per_s = pages.unmap_gbps * 1e9
        """Bytes the freeing thread returns to the OS per second."""
        self.fault_bytes_per_s = min(self.threads * pages.fault_gbps_per_core,
                                     pages.write_gbps) * 1e9
        """Bytes the device's threads fault in per second: each core's rate times the
        cores, at most the memory's write peak."""
        self.s_per_byte = 1.0 / self.unmap_bytes_per_s + 1.0 / self.fault_bytes_per_s
        """Seconds per byte of one tensor's round trip (unmapped, then faulted in)."""

    def op_s(self, op: ComputeOp) -> float:
        """Seconds ``op`` waits for its output's pages: its bytes × the round trip when the
        output is at or above glibc's mmap threshold, else 0."""
        if op.output_bytes < GLIBC_MMAP_THRESHOLD_MAX_BYTES:
            return 0.0
        return op.output_bytes * self.s_per_byte
