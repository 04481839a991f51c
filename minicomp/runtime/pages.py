"""Big CPU buffers on transparent huge pages.

A new tensor's memory comes from the OS untouched, and its first write faults in one 4 KiB page at
a time, each zeroed: on this machine filling a new 64 MiB tensor takes 14.5 ms, of which the
faults are 11 (a kernel over it runs in 2-4). Linux can back a region with 2 MiB pages instead,
512 times fewer faults, where the program asks (madvise MADV_HUGEPAGE; the kernel's default mode
is "madvise"): the same fill then takes 3.5 ms. minicomp asks for the outputs it makes fresh and
for its arenas, before anything touches them. It is advice: where the kernel has no huge pages to
give, or is not Linux, nothing changes. The memory is torch's own allocation (freed, resized and
shared as any tensor's); only the 2 MiB-aligned part of it is advised.

Where that loses: a virtual machine that hands freed memory back to its host (free-page reporting,
as the CI-class machine does for free blocks of 8 MiB and up) gives out huge pages the host has
discarded, and their first touch faults on the host too. There a fresh 32 MiB buffer filled in
2.3 ms in five processes of six and in 37 ms in the sixth (each of its 20 fills alike), against
6 ms on 4 KiB pages every time, whose small blocks the guest keeps; the first calls of HF BERT's
training step took 15-20 ms longer with the advice (arenas and first outputs, touched once). The
advice stays: where the host keeps the memory (bare metal; most processes here) it wins as above,
and the steady state does not depend on it (recycled outputs and arenas are faulted in once, and
kernels over them ran alike on either page size). A fresh-output figure in the benchmark can move
5x between runs for this reason (softmax: 3.5 or 17 ms).
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
