"""A cell's per-row values in columns: what the analysis, the comparison and the findings read of
samples.jsonl, one array per field instead of one record per row.

samples.jsonl holds every prompt and completion (a few kB a row): a folder of thousands of cells
holds GBs of it, and reading it as records for every analysis would hold it all in memory. The
columns (the row indices, the 0/1 outcomes and the gold answer's likelihoods; NaN where a cell
did not score one) take 8 bytes a value. They are kept beside samples.jsonl as rows.npz (plain
arrays: read without pickles), with the size and modification time of the samples.jsonl they were
read from, and read again from samples.jsonl wherever those changed (a cell rejudged, a folder
copied without its times).
"""

from __future__ import annotations

import io
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from softeval._io import write_bytes_atomic

log = logging.getLogger("softeval")

SAMPLES = "samples.jsonl"
ROWS = "rows.npz"
# the fields of a sample the analysis reads: 0/1 outcomes (None allowed for the prompt's own
# knowledge, scored only where the options were) and the gold answer's likelihoods
FIELDS = ("format_ok", "task_correct", "lenient_correct", "knowledge_correct", "prompt_knowledge_correct",
          "gold_logprob", "gold_bpb", "gold_prob", "cloze_gold_prob", "cloze_gold_bpb")
REQUIRED = ("index", "format_ok", "task_correct", "lenient_correct", "knowledge_correct")  # in every sample
FORMAT = 1  # rows.npz's layout: a file of another layout is read again from samples.jsonl


@dataclass(frozen=True)
class Rows:
    """One cell's rows: `index` (the task rows, in the order samples.jsonl holds them) and one
    float column per field of FIELDS (1.0/0.0 for outcomes, NaN where a row has no value)."""

    index: np.ndarray
    columns: dict[str, np.ndarray]

    def __len__(self) -> int:
        return len(self.index)

    def values(self, field: str, rows: list[int] | np.ndarray) -> np.ndarray:
        """The field's values on `rows` (task row indices, each one the cell evaluated), in that order."""
        return self.columns[field][self.positions(rows)]

    def positions(self, rows: list[int] | np.ndarray) -> np.ndarray:
        """Where each of `rows` sits in the columns; a KeyError names a row the cell lacks."""
        wanted = np.asarray(rows, dtype=np.int64)
        if len(wanted) == len(self.index) and np.array_equal(wanted, self.index):  # the common case: every row, in order
            return np.arange(len(wanted))
        order = np.argsort(self.index, kind="stable")
        found = order[np.minimum(np.searchsorted(self.index, wanted, sorter=order), len(order) - 1)] if len(order) else order
        if len(found) != len(wanted) or not np.array_equal(self.index[found], wanted):
            missing = next(int(r) for r in wanted if r not in set(self.index.tolist()))
            raise KeyError(f"row {missing} is not among the cell's rows")
        return found

    def has(self, field: str, rows: list[int] | np.ndarray) -> bool:
        """Whether every one of `rows` has a value of `field`."""
        return not np.isnan(self.values(field, rows)).any()


def from_samples(samples) -> Rows:
    """The columns of a list of `Sample`s (or of dicts with the same keys)."""
    records = samples if samples and isinstance(samples[0], dict) else [s.model_dump(include={"index", *FIELDS}) for s in samples]
    index = np.array([r["index"] for r in records], dtype=np.int64)
    columns = {f: np.array([np.nan if (v := r.get(f)) is None else v for r in records], dtype=np.float64) for f in FIELDS}
    return Rows(index, columns)


def read_rows(folder: Path) -> Rows:
    """A cell's columns: from rows.npz where it was made from the samples.jsonl now in the folder,
    else read from samples.jsonl (and kept as rows.npz where the folder can be written)."""
    samples = Path(folder) / SAMPLES
    source = samples_identity(folder)
    cached = _cached(Path(folder) / ROWS, source)
    if cached is not None:
        return cached
    records = [json.loads(line) for line in samples.read_text(encoding="utf-8").splitlines() if line.strip()]
    for number, record in enumerate(records, 1):
        if not isinstance(record, dict) or any(record.get(f) is None for f in REQUIRED):
            lacking = [f for f in REQUIRED if not isinstance(record, dict) or record.get(f) is None]
            raise ValueError(f"line {number} of {samples} lacks {', '.join(lacking)}")
    rows = from_samples(records)
    write_rows(folder, rows, source)
    return rows


def samples_identity(folder: Path) -> np.ndarray:
    """What rows.npz records of the samples.jsonl it was read from: its layout, size and time."""
    stat = (Path(folder) / SAMPLES).stat()
    return np.array([FORMAT, stat.st_size, stat.st_mtime_ns], dtype=np.int64)


def write_rows(folder: Path, rows: Rows, source: np.ndarray | None = None) -> None:
    """rows.npz beside samples.jsonl, atomically; a folder that cannot be written keeps none (the
    columns are read from samples.jsonl again next time)."""
    source = samples_identity(folder) if source is None else source
    buffer = io.BytesIO()
    np.savez(buffer, source=source, index=rows.index, **{f"column_{f}": c for f, c in rows.columns.items()})
    try:
        write_bytes_atomic(Path(folder) / ROWS, buffer.getvalue())
    except OSError as exc:
        log.debug("no %s kept in %s (%s): its rows are read from %s each time", ROWS, folder, exc, SAMPLES)


def _cached(path: Path, source: np.ndarray) -> Rows | None:
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as saved:
            if not np.array_equal(saved["source"], source) or any(f"column_{f}" not in saved for f in FIELDS):
                return None
            return Rows(saved["index"], {f: saved[f"column_{f}"] for f in FIELDS})
    except (OSError, ValueError, KeyError) as exc:  # damaged: read samples.jsonl instead
        log.debug("%s cannot be read (%s); reading %s", path, exc, SAMPLES)
        return None
