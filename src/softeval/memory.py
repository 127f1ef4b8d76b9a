"""Keep freed memory in the process when models run on the CPU.

glibc's malloc serves blocks above its mmap threshold (128 KiB, rising to at most 32 MiB as
such blocks are freed) straight from the operating system and hands them back when they are
freed; it also trims the top of its heap. A freed block's pages are then gone, and the next
block of that size starts as fresh pages, each zeroed by the kernel on first touch. Evaluation
allocates blocks of that size at every batch and decode step: activations, logits, KV caches
merged into new buffers. On 200 GSM8K generations with smollm2-135m-instruct that was 1.9-2.2
million page faults and 110-125 s, against 0.66 million and 91 s with freed memory kept.

PyTorch's CPU performance guide recommends a caching allocator (jemalloc, tcmalloc) preloaded
when the process starts. Without one, softeval asks glibc to do the same: no mmap below 1 GiB,
no heap trimming below 2 GiB of free space at its top. The process then holds on to its peak
memory between batches instead of returning and refaulting it.
"""

from __future__ import annotations

import ctypes
import os
import sys

M_TRIM_THRESHOLD = -1  # mallopt parameters, from glibc's malloc.h
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 1 << 30
TRIM_THRESHOLD = 2**31 - 1  # mallopt takes an int

_kept: bool | None = None  # whether the setting is in force; None: not tried yet


def keep_freed_memory() -> bool:
    """Ask glibc to keep freed blocks for reuse, once per process; returns whether it is in force.

    Nothing happens on other C libraries, or when the user tuned glibc's malloc themselves
    (MALLOC_* or GLIBC_TUNABLES in the environment) or preloaded another allocator."""
    global _kept
    if _kept is None:
        _kept = _glibc_without_user_tuning() and _set_thresholds()
    return _kept


def _glibc_without_user_tuning() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc"):
            return False
    except (ValueError, OSError):
        return False
    tuned = any(name.startswith("MALLOC_") for name in os.environ) or "malloc" in os.environ.get("GLIBC_TUNABLES", "")
    preloaded = os.environ.get("LD_PRELOAD", "")
    return not tuned and not any(name in preloaded for name in ("jemalloc", "tcmalloc", "mimalloc"))


def _set_thresholds() -> bool:
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    # mallopt returns 1 on success; a glibc that refuses a threshold this high keeps its own
    return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
