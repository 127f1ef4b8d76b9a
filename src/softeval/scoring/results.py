"""The files of an output folder that hold results: a finished cell's results.json and
samples.jsonl (read and written by `EvalResult`), and the study's models.json.

No torch here: reports, rankings and the report page read results without loading a model.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from softeval._io import write_json_atomic, write_jsonl_atomic
from softeval.models import model_name
from softeval.scoring.metrics import Diagnostics, Metric, Sample
from softeval.scoring.rows import SAMPLES, Rows, from_samples, read_rows, write_rows

MODELS_FILE = "models.json"  # family and role (base, post-trained) of each model of the folder
SERIES_FILE = "series.json"  # each pre-training recipe's checkpoints: model name, step, tokens
TRUTH_FILE = "ground_truth.json"  # each model's known test facts, where a study declares them


@dataclass
class EvalResult:
    config: dict
    metrics: dict[str, Metric]
    samples: list[Sample]
    model: dict
    data: dict
    timings: dict[str, float]
    n_truncated: int
    diagnostics: Diagnostics | None = None
    versions: dict = field(default_factory=dict)
    identity: dict = field(default_factory=dict)  # what the cell's results depend on (see evaluate.cell_identity)
    tuning: dict | None = None  # tuned methods: trainable parameters, tuning seconds and steps
    engine: dict | None = None  # the path the cell ran on and the self-check's figures (softeval.engine.selfcheck)
    created: str | None = None  # when the cell was evaluated; None: now
    # the folder a cell was loaded from, where its samples are read lazily (`SampleFile`)
    folder: Path | None = field(default=None, repr=False, compare=False)
    # the size, time and inode of results.json and samples.jsonl when the cell was read from a
    # folder's listing (`analysis.finished_cells`); empty otherwise. Figures computed from the cell
    # are kept under it, and computed again once the files change.
    files: tuple = field(default=(), repr=False, compare=False)
    _rows: tuple[object, Rows] | None = field(default=None, init=False, repr=False, compare=False)  # (the samples, their columns)

    @property
    def rows(self) -> Rows:
        """The per-row values the analysis reads, in columns (see `scoring.rows`), of the samples
        the cell holds now."""
        if self._rows is None or self._rows[0] is not self.samples:
            columns = read_rows(self.folder) if isinstance(self.samples, SampleFile) else from_samples(list(self.samples))
            self._rows = (self.samples, columns)
        return self._rows[1]

    def to_json(self) -> dict:
        return {
            "config": self.config,
            "identity": self.identity,
            "tuning": self.tuning,
            "engine": self.engine,
            "metrics": {k: m.model_dump() for k, m in self.metrics.items()},
            "diagnostics": self.diagnostics.model_dump() if self.diagnostics else None,
            "n_examples": len(self.samples),
            "n_truncated_prompts": self.n_truncated,
            "model": self.model,
            "data": self.data,
            "timings_s": self.timings,
            "versions": self.versions,
            "created": self.created or datetime.now(timezone.utc).isoformat(timespec="seconds"),
        }

    @classmethod
    def load(cls, folder: str | Path, *, lazy: bool = False) -> EvalResult:
        """A finished cell from its folder (results.json and samples.jsonl). `lazy`: the samples
        are read from samples.jsonl each time they are iterated, never held (a folder's thousands
        of cells would not fit in memory), and the analysis reads the rows' columns."""
        folder = Path(folder)
        saved = json.loads((folder / "results.json").read_text(encoding="utf-8"))
        if lazy:
            samples = SampleFile(folder / SAMPLES, saved.get("n_examples"))
        else:
            lines = (folder / SAMPLES).read_text(encoding="utf-8").splitlines()
            samples = [Sample.model_validate_json(line) for line in lines if line.strip()]
        return cls(
            config=saved["config"],
            metrics={k: Metric(**m) for k, m in saved["metrics"].items()},
            samples=samples,
            model=saved["model"],
            data=saved["data"],
            timings=saved.get("timings_s", {}),
            n_truncated=saved.get("n_truncated_prompts", 0),
            diagnostics=Diagnostics(**saved["diagnostics"]) if saved.get("diagnostics") else None,
            versions=saved.get("versions", {}),
            identity=saved.get("identity", {}),
            tuning=saved.get("tuning"),
            engine=saved.get("engine"),
            created=saved.get("created"),
            folder=folder,
        )

    def save(self, output: str | Path) -> Path:
        """Write the cell into an output folder, where `softeval report`, `analyze` and the
        exports read it: OUTPUT/<model>/<task>/<method>[-chat]/; returns that folder. Cells of
        other models, tasks or methods saved into the same output sit beside it."""
        return self.write(cell_path(output, self.config))

    def write(self, folder: str | Path) -> Path:
        """Write samples.jsonl then results.json into `folder` itself, each atomically: a folder
        with results.json is complete."""
        folder = Path(folder)
        write_jsonl_atomic(folder / SAMPLES, [s.model_dump() for s in self.samples])
        write_rows(folder, from_samples(list(self.samples)))
        write_json_atomic(folder / "results.json", self.to_json())
        return folder


class SampleFile(Sequence):
    """A cell's samples.jsonl as a sequence of `Sample`s read when iterated, none held: the report
    page and the exports go through a folder's cells one at a time."""

    def __init__(self, path: Path, n: int | None):
        self.path = path
        self._n = n

    def __len__(self) -> int:
        if self._n is None:
            self._n = sum(1 for _ in self)
        return self._n

    def __iter__(self) -> Iterator[Sample]:
        with open(self.path, encoding="utf-8") as lines:
            for line in lines:
                if line.strip():
                    yield Sample.model_validate_json(line)

    def __getitem__(self, i):
        return list(self)[i]


def cell_path(output: str | Path, config: dict) -> Path:
    """The folder of a cell in an output folder: <model>/<task>/<method>[-chat]."""
    return Path(output) / model_name(config["model"]) / config["task"] / (config["method"] + ("-chat" if config.get("chat") else ""))
