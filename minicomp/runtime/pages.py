"""Big CPU buffers on transparent huge pages.

A new tensor's memory comes from the OS untouched, and its first write faults in one 4 KiB page at
a time, each zeroed: on this machine filling a new 64 MiB tensor takes 14.5 ms, of which the
faults are 11 (a kernel over it runs in 2-4). Linux can back a region with 2 MiB pages instead,
512 times fewer faults, where the program asks (madvise MADV_HUGEPAGE; the kernel's default mode
is "madvise"): the same fill then takes 3.5 ms. minicomp asks for the outputs it makes fresh and
for its arenas, before anything touches them. It is advice: where the kernel has no huge pages to
give, or is not Linux, nothing changes. The memory is torch's own allocation (freed, resized and
shared as any tensor's); only the 2 MiB-aligned part of it is advised.
"""
from __future__ import annotations

import ctypes
import sys

HUGE_MIN_BYTES = 4 << 20  # below this, a buffer spans at most one whole huge page: not worth a syscall
HUGE_PAGE = 2 << 20
MADV_HUGEPAGE = 14


def _madvise():
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    return fn


_MADVISE = _madvise()


def advise_huge(t):
    """`t` (a new CPU tensor nothing has written yet), its memory advised onto huge pages."""
    n = t.untyped_storage().nbytes()
    if _MADVISE is None or n < HUGE_MIN_BYTES or t.device.type != "cpu":
        return t
    start = t.untyped_storage().data_ptr()
    lo, hi = -(-start // HUGE_PAGE) * HUGE_PAGE, (start + n) // HUGE_PAGE * HUGE_PAGE
    if hi > lo:
        _MADVISE(lo, hi - lo, MADV_HUGEPAGE)  # EINVAL where huge pages are off: advice, ignored
    return t
