"""What the exports say of a finished cell beyond its results file (`Cell`): how its knowledge was
scored, the model's hub id, its flags, and the small conversions both formats share (lm-eval's
standard error from an interval, a row's outcome per metric). See `export.py` for the formats.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from softeval.errors import SoftevalError
from softeval.models import ALIASES, model_name
from softeval.scoring import ROW_METRICS, SERIES_FILE, EvalResult, Metric, aggregate

if TYPE_CHECKING:
    from softeval.tasks import TaskSpec

CONFIDENCE_LEVEL = 0.95
Z_95 = 1.96  # a 95% normal interval is the estimate +- 1.96 standard errors
# the resamples behind every cell's intervals: `aggregate`'s own default, which cells do not record
BOOTSTRAP_RESAMPLES = inspect.signature(aggregate).parameters["n_resamples"].default
CI_METHOD = "percentile bootstrap over the evaluated rows, resampled jointly for all metrics"
# the answer each metric reads: its lm-eval filter, but for knowledge, which depends on the task
METRIC_FILTERS = {
    "format_following": "strict",
    "task_accuracy": "strict",
    "conditional_accuracy": "strict",
    "lenient_accuracy": "lenient",
}
# the continuous metrics and the context they were scored in, under lm-eval's name where it has
# one that means the same (`acc`: the option of highest summed log-likelihood). Not lm-eval's
# `bits_per_byte`: it is a corpus total (all log-likelihoods over all bytes), softeval's the mean
# of each row's ratio, which OLMES reports per instance.
GOLD_KEYS = {
    "gold_logprob": "gold_logprob,prompt",
    "gold_bpb": "gold_bpb,prompt",
    "gold_prob": "gold_prob,prompt",
    "prompt_knowledge": "acc,prompt",
    "cloze_gold_prob": "gold_prob,cloze",
    "cloze_gold_bpb": "gold_bpb,cloze",
}
KNOWLEDGE_SCORING = {
    "acc_norm": {"scoring": "option_loglikelihood", "normalization": "characters"},
    "acc": {"scoring": "option_loglikelihood", "normalization": "none"},
    "loglikelihood": {"scoring": "option_loglikelihood", "normalization": None},  # the spec that said it has changed
    "lenient": {"scoring": "lenient_parser"},
}
_UNPORTABLE = re.compile(r'[<>:"/\\|?*\x00-\x1f]')
_WINDOWS_RESERVED = {"CON", "PRN", "AUX", "NUL", *(f"COM{i}" for i in range(1, 10)), *(f"LPT{i}" for i in range(1, 10))}


@dataclass
class Cell:
    """A finished cell and what the exports say of it beyond its results file."""

    result: EvalResult
    label: str  # method and chat mode, as the cell's folder is named: soft-prompt-chat
    model_id: str  # hub id (developer/name) where known, else softeval's name of the model
    knowledge: str  # how knowledge was scored: a key of KNOWLEDGE_SCORING
    spec: TaskSpec | None  # the task spec the cell read, where it still says the same
    flags: list[str]  # why its scores may mean little (see analysis.cell_flags)
    checkpoint: dict = field(default_factory=dict)  # a series checkpoint's recipe, checkpoint name, step and tokens; {} for other models

    @property
    def prompt_template(self) -> str | None:
        """The task's own prompt: its spec's template, or for a task of lm-eval, lm-eval's
        `doc_to_text` (softeval's template of such a task only reads what lm-eval computed)."""
        if self.spec is None:
            return None
        if self.spec.lm_eval is not None:
            from softeval.tasks.lm_eval import lm_eval_prompt

            return lm_eval_prompt(self.spec.lm_eval.task)
        return self.spec.template

    @property
    def task(self) -> str:
        return self.result.config["task"]

    @property
    def model_folder(self) -> str:
        """softeval's name of the model, its folder in the output folder, where it is unique (an alias and
        the hub model it packages share a hub id, not a name)."""
        return model_name(self.result.config["model"])

    @property
    def created(self) -> datetime:
        """When the cell was evaluated (UTC)."""
        created = self.result.created
        when = datetime.fromisoformat(created) if created else datetime.now(UTC)
        return when.astimezone(UTC) if when.tzinfo else when.replace(tzinfo=UTC)

    @property
    def gold_metrics(self) -> list[str]:
        """The continuous metrics the cell holds with a value (see `scoring.likelihood`)."""
        return [m for m in GOLD_KEYS if m in self.result.metrics and self.result.metrics[m].value is not None]

    def filter_of(self, metric: str) -> str:
        return self.knowledge if metric == "knowledge" else METRIC_FILTERS[metric]


def described(results: list[EvalResult], checkpoints: dict[str, dict] | None = None) -> list[Cell]:
    """The cells with what the exports say of them, each task spec read once; `checkpoints` are
    the folder's series checkpoints by model name (see `series_checkpoints`)."""
    from softeval.analysis import cell_flags, cell_label

    flagged = cell_flags(results)
    specs: dict[tuple, TaskSpec | None] = {}
    cells = []
    for r in results:
        where = (r.data.get("task_spec"), r.config["task"], r.data.get("spec_sha256"))
        if where not in specs:
            specs[where] = task_spec(*where)
        checkpoint = (checkpoints or {}).get(model_name(r.config["model"]), {})
        cells.append(Cell(r, cell_label(r.config), model_id(r), knowledge_scoring(r, specs[where]), specs[where], flagged[id(r)], checkpoint))
    return cells


def series_checkpoints(folder: Path) -> dict[str, dict]:
    """Each series checkpoint of a folder (its series.json) by model name: its recipe, checkpoint
    name, step and tokens, so that a series can be rebuilt from the exported files."""
    from softeval.analysis.series import read_series

    if not (Path(folder) / SERIES_FILE).is_file():
        return {}
    found = {}
    for recipe, recorded in read_series(folder).items():
        for point in recorded["checkpoints"]:
            label = point["model"].split("@", 1)[-1]
            found[point["model"]] = {"recipe": recipe, "checkpoint": label, "step": point.get("step"), "tokens": point.get("tokens")}
    return found


def task_spec(path: str | None, task: str, sha256: str | None) -> TaskSpec | None:
    """The task spec a cell read, where it can still be read and still says the same (its sha256
    is the cell's); None otherwise: the exports then say only what the cell itself records."""
    from softeval.tasks import load_task

    for where in (path, task):
        if not where:
            continue
        try:
            spec = load_task(where)
        except (SoftevalError, OSError, ValueError):
            continue
        if spec.sha256() == sha256:
            return spec
    return None


@contextmanager
def samples_held(result: EvalResult) -> Iterator[None]:
    """A cell's samples read from its samples.jsonl once and held inside, for a writer that goes
    through them several times; let go after (a folder's cells are written one at a time)."""
    kept = result.samples
    result.samples = list(kept)
    try:
        yield
    finally:
        result.samples = kept


def knowledge_scoring(result: EvalResult, spec: TaskSpec | None) -> str:
    """How a cell's knowledge metric was scored, in lm-eval's words where it has them."""
    multiple_choice = any(s.choices is not None or s.option_loglikelihoods is not None for s in result.samples)
    if not multiple_choice:
        return "lenient"  # open-ended: knowledge is the lenient parser's verdict
    # as the cell recorded it, else as its spec (unchanged since) says
    normalization = result.config.get("cloze_normalization") or (spec.cloze_normalization if spec is not None else None)
    if normalization is None:
        return "loglikelihood"
    return "acc_norm" if normalization == "characters" else "acc"


def model_id(result: EvalResult) -> str:
    """The model as `developer/name` where its hub id is known (the hub model, or the model an
    alias packages); else softeval's name of it (a local folder or file)."""
    spec = result.config["model"]
    alias = ALIASES.get(spec)
    hub = (result.identity.get("model") or {}).get("hub_id") or (alias.upstream if alias else None)
    if hub and "/" in hub:
        developer, _, name = hub.split("@")[0].partition("/")
        return f"{portable(developer)}/{portable(name.replace('/', '_'))}"
    return portable(model_name(spec))


def portable(name: str) -> str:
    """A name that is one portable path component (the datastore's rule for its folders)."""
    safe = _UNPORTABLE.sub("_", name).rstrip(". ") or "_"
    return "_" + safe if safe == "data" or safe.split(".", 1)[0].upper() in _WINDOWS_RESERVED else safe


def stderr(metric: Metric) -> float | str:
    """lm-eval's standard error from a 95% bootstrap interval: its half-width / 1.96; "N/A", as
    lm-eval writes it, where the interval is undefined."""
    if metric.ci_low is None or metric.ci_high is None:
        return "N/A"
    return round((metric.ci_high - metric.ci_low) / 2 / Z_95, 6)


def row_outcome(sample, metric: str) -> bool | None:
    """A row's outcome for a metric; None where the metric does not count the row (conditional
    accuracy counts the rows that kept the format)."""
    if metric == "conditional_accuracy":
        return sample.task_correct if sample.format_ok else None
    return getattr(sample, ROW_METRICS[metric])


def strings(details: dict) -> dict[str, str]:
    """`details` as the schema's string map: None left out, other values as JSON."""
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in details.items() if v is not None}


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def method_details(cell: Cell) -> dict:
    """The method a cell evaluates and all that identifies it: demonstrations, chat mode, the tuned
    soft prompt or LoRA adapter (sha256, path) and its tuning record."""
    config = cell.result.config
    soft_prompt, adapter = config.get("soft_prompt") or {}, config.get("adapter") or {}
    return {
        "method": config["method"],
        "chat": config.get("chat", False),
        "num_fewshot": config.get("k", 0),
        "decoding": "greedy",
        "seed": config.get("seed"),
        "limit": config.get("limit"),
        "soft_prompt_sha256": soft_prompt.get("sha256"),
        "soft_prompt_length": soft_prompt.get("length"),
        "soft_prompt_path": soft_prompt.get("path"),
        "adapter_sha256": adapter.get("sha256"),
        "adapter_path": adapter.get("path"),
        "tuning": cell.result.tuning,
        "max_answer_words": config.get("max_answer_words"),
    }
