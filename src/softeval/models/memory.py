"""Keep freed memory in the process when models run on the CPU.

glibc's malloc serves blocks above its mmap threshold (128 KiB, rising with the blocks freed to at
most 32 MiB) straight from the operating system, hands them back when they are freed, and trims
the top of its heap. The next block of that size then starts as fresh pages, each zeroed by the
kernel on its first touch. Evaluation allocates such blocks at every batch and decode step
(activations, logits, KV caches merged into new buffers), so without reuse it pays page faults
for most of the memory it touches.

PyTorch's CPU performance guide recommends a caching allocator (jemalloc, tcmalloc) preloaded
when the process starts. Without one, softeval asks glibc for the same effect: no mmap below
1 GiB (32 MiB on glibc before 2.35, which refuses more) and no trimming below 2 GiB free at the
heap's top. This covers the main heap, where the main thread allocates; a thread's heap is capped
at 64 MiB and still maps larger blocks. The process then holds on to its peak memory between
batches instead of returning and refaulting it; `release_freed_memory` hands the free part back
when one model is done and the next is about to load.
"""

from __future__ import annotations

import ctypes
import os

M_TRIM_THRESHOLD = -1  # mallopt parameters, from glibc's malloc.h
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLDS = (1 << 30, 32 << 20)  # the first one glibc accepts is used
TRIM_THRESHOLD = 2**31 - 1  # mallopt takes an int

_libc: ctypes.CDLL | None = None  # set once the setting is in force
_tried = False


def keep_freed_memory() -> bool:
    """Ask glibc to keep freed blocks for reuse, once per process; returns whether it is in force.

    Nothing happens on other C libraries, or when the user tuned glibc's malloc themselves (a
    MALLOC_* variable, or GLIBC_TUNABLES naming malloc) or preloaded jemalloc, tcmalloc or
    mimalloc."""
    global _libc, _tried
    if not _tried:
        _tried = True
        _libc = _set_thresholds() if _glibc_without_user_tuning() else None
    return _libc is not None


def release_freed_memory() -> None:
    """Return the heap's free pages to the operating system (between models: the next one is
    not the same size, and the last one's memory would otherwise stay with the process)."""
    if _libc is not None:
        _libc.malloc_trim(0)


class _Mallinfo2(ctypes.Structure):
    """glibc's `struct mallinfo2` (glibc 2.33 and later): sizes of the heap, in bytes."""

    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


def kept_free_bytes() -> int:
    """Bytes the process freed and glibc keeps for its reuse (so the system does not count them
    as available, though this process can use them again); 0 where the setting is not in force
    or glibc has no mallinfo2."""
    if _libc is None or not hasattr(_libc, "mallinfo2"):
        return 0
    _libc.mallinfo2.restype = _Mallinfo2
    return int(_libc.mallinfo2().fordblks)


def _glibc_without_user_tuning() -> bool:
    try:
        libc_version = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):  # not a POSIX system that knows the name
        return False
    if not libc_version.startswith("glibc"):
        return False
    tuned = any(name.startswith("MALLOC_") for name in os.environ) or "malloc" in os.environ.get("GLIBC_TUNABLES", "")
    preloaded = os.environ.get("LD_PRELOAD", "")
    return not tuned and not any(name in preloaded for name in ("jemalloc", "tcmalloc", "mimalloc"))


def _set_thresholds() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return None
    # mallopt returns 1 when it takes a value, 0 when it refuses one
    if not any(libc.mallopt(M_MMAP_THRESHOLD, threshold) for threshold in MMAP_THRESHOLDS):
        return None
    libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    return libc
