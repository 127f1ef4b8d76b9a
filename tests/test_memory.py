"""Freed memory stays in the process once a model is loaded onto the CPU (softeval.memory)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# Counts the page faults of filling a 64 MiB block right after an equal one was freed (the fewest
# of three rounds: the heap's layout settles after the first). Mmapped, all of the block's 16,384
# pages fault again each time; kept in the heap, they are reused.
PROBE = """
import resource, sys, torch
from softeval.models import load_model

def refaults():
    counts = []
    for _ in range(3):
        torch.empty(16 << 20).fill_(1.0)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        torch.empty(16 << 20).fill_(1.0)
        counts.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return min(counts)

print(refaults())
load_model(sys.argv[1], device="cpu")
print(refaults())
"""

PAGES = (64 << 20) // 4096


def _glibc() -> bool:
    try:
        return os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc")
    except (ValueError, OSError):
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux") or not _glibc(), reason="glibc's malloc only")
def test_a_cpu_model_load_makes_freed_blocks_reusable(tiny_model_dirs):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k not in ("GLIBC_TUNABLES", "LD_PRELOAD")}
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(tiny_model_dirs["llama"])], capture_output=True, text=True, env=env, check=True
    )
    before, after = map(int, out.stdout.split())
    assert before > PAGES // 2, "the probe should see a freed block's pages fault again before the load"
    assert after < PAGES // 8
