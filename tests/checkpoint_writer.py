"""A slow trainer's saves, for `softeval watch` to see land: copies the checkpoint folders of
STAGED (checkpoint-N/, each a model folder) into RUN one after another, config and tokenizer
first, then the weights in pieces, pausing between them; the checkpoint named by HALF stays
half-written for HOLD seconds.

    python tests/checkpoint_writer.py STAGED RUN HALF HOLD
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path


def write_slowly(source: Path, target: Path, hold: float) -> None:
    target.mkdir(parents=True)
    weights = source / "model.safetensors"
    for file in sorted(source.iterdir()):
        if file != weights:
            shutil.copy(file, target / file.name)
    data = weights.read_bytes()
    with (target / "model.safetensors").open("wb") as out:
        for start in range(0, len(data), len(data) // 4 + 1):
            out.write(data[start : start + len(data) // 4 + 1])
            out.flush()
            time.sleep(hold if start == 0 else 0.2)


def main(staged: str, run: str, half: str, hold: str) -> None:
    for source in sorted(Path(staged).iterdir(), key=lambda p: int(p.name.split("-")[1])):
        write_slowly(source, Path(run) / source.name, float(hold) if source.name == half else 0.2)
        time.sleep(0.5)


if __name__ == "__main__":
    main(*sys.argv[1:])
