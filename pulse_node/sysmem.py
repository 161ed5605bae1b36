"""Process memory policy: large blocks go back to the OS when freed.

glibc serves an allocation above its mmap threshold with its own mapping, returned to the OS on
free, and below it from per-thread heaps that keep freed memory for reuse. The threshold is
dynamic: freeing a mapped block raises it to that block's size (up to 32 MB), so after the
first version's 13 MB undo arrays are freed, the next ones come from the heaps of whichever
thread made them, and each decode, sink and scatter thread's heap keeps its share. At 1 B
parameters that kept ~240 MB (0.24 B/param) beside the state after a pipelined apply, and the
peak above the live model rose from 2.3 to 2.7-2.8 B/param (bench/RESULTS.md, "Live sync at 1 B:
the decode's own cost"). A fixed threshold of 1 MiB keeps every array of that size on its own
mapping: freed at once, for the price of faulting its pages in again on the next version.
"""

from __future__ import annotations

import ctypes
import logging

log = logging.getLogger(__name__)

#: glibc's ``M_MMAP_THRESHOLD`` parameter of ``mallopt``
_M_MMAP_THRESHOLD = -3
#: allocations at least this large get their own mapping (a fixed value also stops the dynamic raise)
MMAP_THRESHOLD = 1 << 20


def return_large_frees(threshold: int = MMAP_THRESHOLD) -> bool:
    """Make allocations of ``threshold`` bytes or more mapped on their own (glibc only); True if set."""
    try:  # the process's own symbols: libc is loaded already (no library search at start-up)
        ok = bool(ctypes.CDLL(None).mallopt(_M_MMAP_THRESHOLD, int(threshold)))
    except (OSError, AttributeError):  # not glibc (musl, macOS): their allocators keep their own policy
        return False
    if not ok:
        log.debug("mallopt(M_MMAP_THRESHOLD, %d) refused", threshold)
    return ok
