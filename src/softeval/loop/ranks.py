"""An evaluation under `torch.distributed`: the cells spread over the ranks, rank 0 gathers.

Each rank evaluates its share of the cells (every world-size-th unit, in one fixed order, so a
recipe's soft prompt for a task is tuned by the same rank at every step and warm-starts from
its own prompt) on its own replica, writes them into the output folder, then reports in a small
file. Rank 0 waits for every rank's report, up to a timeout, and files the checkpoint.

No collective operation is used: a collective that one rank never reaches (it crashed, or its
cells take longer) would hang the others, and one on the training's own process group would
interleave with training's collectives. A rank that fails reports its error; one that does not
report in time is named in one line and the others go on. Its cells, where they land later, are
read by the next refresh of the folder. The output folder must therefore be one every rank sees
(a shared file system, as checkpoints need).
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from softeval._io import write_json_atomic

POLL_S = 0.2
REPORTS = ".ranks"  # OUTPUT/.ranks/<recipe>/step-N/rank-R.json


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1

    @classmethod
    def current(cls) -> World:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return cls(dist.get_rank(), dist.get_world_size())
        return cls()

    def share(self, units: list) -> list:
        """This rank's units: every size-th, from its own rank on."""
        return units[self.rank :: self.size]


def report_folder(output: Path, recipe: str, step: int) -> Path:
    return Path(output) / REPORTS / recipe / f"step-{step}"


def report(output: Path, recipe: str, step: int, rank: int, record: dict) -> None:
    """A rank's report of its share: its cells and failures, and what they cost."""
    write_json_atomic(report_folder(output, recipe, step) / f"rank-{rank}.json", record)


def gather(output: Path, recipe: str, step: int, world: World, timeout: float, weights: str) -> tuple[dict[int, dict], list[int]]:
    """Every other rank's report of this step, of these weights (a report left by an earlier
    attempt at the step, before a restart, is not this one), waiting up to `timeout` seconds;
    returns the reports by rank and the ranks that did not report in time."""
    folder = report_folder(output, recipe, step)
    wanted = set(range(1, world.size))
    found: dict[int, dict] = {}
    deadline = time.monotonic() + timeout
    while True:
        for rank in sorted(wanted - set(found)):
            path = folder / f"rank-{rank}.json"
            if path.is_file():
                try:
                    record = json.loads(path.read_text(encoding="utf-8"))
                except (OSError, ValueError):  # written atomically: unreadable means damaged, not half-written
                    record = {"weights_sha256": weights, "cells": [], "failures": [f"its report {path} cannot be read"]}
                # a report of these weights; or of none, from a rank that failed before it read them
                if record.get("weights_sha256") in (weights, "") or not weights:
                    found[rank] = record
        if set(found) == wanted or time.monotonic() >= deadline:
            break
        time.sleep(POLL_S)
    shutil.rmtree(folder, ignore_errors=True)  # read: a late report of this step is never waited for again
    return found, sorted(wanted - set(found))
