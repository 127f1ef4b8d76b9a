"""Freed memory stays in the process once a model is loaded onto the CPU (softeval.memory)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from softeval.models import memory

# Counts the page faults of filling a 64 MiB block right after an equal one was freed (the fewest
# of three rounds: the heap's layout settles after the first). Mmapped, all of the block's 16,384
# pages fault again each time; kept in the heap, they are reused; handed back, they fault again.
# Transparent huge pages are off for the probe, so that a fault is one 4 KiB page.
PROBE = """
import ctypes, resource, sys, torch
from softeval.models import memory
from softeval.models import load_model

ctypes.CDLL(None).prctl(41, 1, 0, 0, 0)  # PR_SET_THP_DISABLE

def faults(fill):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    fill()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

def refaults(between=lambda: None):
    counts = []
    for _ in range(3):
        torch.empty(16 << 20).fill_(1.0)
        between()
        counts.append(faults(lambda: torch.empty(16 << 20).fill_(1.0)))
    return min(counts)

print(refaults())
load_model(sys.argv[1], device="cpu")
print(memory.keep_freed_memory(), refaults(), refaults(between=memory.release_freed_memory))
"""

PAGES = (64 << 20) // 4096


@pytest.mark.skipif(not memory._glibc_without_user_tuning(), reason="glibc's malloc, as its defaults leave it")
def test_a_cpu_model_load_makes_freed_blocks_reusable(tiny_model_dirs):
    out = subprocess.run([sys.executable, "-c", PROBE, str(tiny_model_dirs["llama"])], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    before, kept, after, released = out.stdout.split()
    if kept != "True":
        pytest.skip("this glibc refuses the thresholds")
    assert int(before) > PAGES // 2, "the probe should see a freed block's pages fault again before the load"
    assert int(after) < PAGES // 8
    assert int(released) > PAGES // 2, "released pages should be the system's again"


@pytest.mark.parametrize(
    "variable, value, applies",
    [
        ("MALLOC_ARENA_MAX", "2", False),
        ("GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=65536", False),
        ("GLIBC_TUNABLES", "glibc.rtld.optional_static_tls=512", True),
        ("LD_PRELOAD", "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2", False),
    ],
)
def test_malloc_the_user_tuned_is_left_alone(monkeypatch, variable, value, applies):
    if not memory._glibc_without_user_tuning():
        pytest.skip("glibc's malloc, as its defaults leave it")
    monkeypatch.setenv(variable, value)
    assert memory._glibc_without_user_tuning() is applies


KEPT = """
import torch
from softeval.models import memory
memory.keep_freed_memory()
before = memory.kept_free_bytes()
block = torch.empty(64 << 20)  # 256 MiB
block.fill_(1.0)
del block
print(memory.kept_free_bytes() - before)
"""


@pytest.mark.skipif(not memory._glibc_without_user_tuning(), reason="glibc's malloc, as its defaults leave it")
def test_freed_memory_the_process_keeps_is_counted():
    """The KV budget counts it as free: the system does not, though the process reuses it."""
    out = subprocess.run([sys.executable, "-c", KEPT], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert int(out.stdout) >= 250 << 20
