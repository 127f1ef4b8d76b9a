"""Where a study's cells live: each cell's folder and its tuned prompt's or adapter's, what a
finished cell recorded of itself, and what a cell's run reports. No torch here: the command
line names folders and checks them before any model loads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from softeval.errors import SoftevalError
from softeval.models import model_name
from softeval.study.settings import Study
from softeval.tasks import TaskSpec
from softeval.tuning import TUNED


def cell_folder(output: Path, model: str, task: str, method: str, chat: bool) -> Path:
    """The folder of one cell's results.json and samples.jsonl."""
    return Path(output) / model / task / (method + ("-chat" if chat else ""))


def tuned_folder(output: Path, model: str, task: str, method: str, chat: bool) -> Path:
    """The folder of the soft prompt or LoRA adapter a tuned cell evaluates."""
    kind = {"soft-prompt": "prompt", "lora": "adapter"}[method]
    return Path(output) / model / task / (kind + ("-chat" if chat else ""))


def check_cell_folders(output: Path, study: Study, specs: list[TaskSpec]) -> None:
    """No file stands where the study will make a folder (a cell's, or the prompt or adapter it
    tunes): found before any work, not once a cell's results cannot be written."""
    for entry in study.models:
        for spec in specs:
            unit = Path(output) / model_name(entry.model) / spec.name
            folders = [unit.parent, unit]
            for method in study.methods:
                for chat in (False, True):
                    folders.append(cell_folder(output, model_name(entry.model), spec.name, method, chat))
                    if method in TUNED:
                        folders.append(tuned_folder(output, model_name(entry.model), spec.name, method, chat))
            blocking = next((f for f in folders if f.exists() and not f.is_dir()), None)
            if blocking is not None:
                raise SoftevalError(f"{blocking} is a file where softeval keeps results; move it away or choose another --output")


def finished_identity(folder: Path) -> dict | None:
    """The identity recorded by a finished cell (its results.json), or None."""
    path = folder / "results.json"
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8")).get("identity")
    except (ValueError, OSError):  # unreadable: the cell is redone and the file replaced
        return None


@dataclass
class CellReport:
    """What happened to one cell in this command."""

    folder: Path
    status: Literal["done", "skipped", "failed"]
    message: str = ""
