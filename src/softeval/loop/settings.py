"""What an evaluator inside a training loop is set to: a study's settings for its cells (tasks,
methods, rows, tuning), and how it runs beside training: warm starts, a fast set evaluated at
every call with the full set less often, tokens per step, how long rank 0 waits for the others.

No torch here: the settings are checked when the evaluator is made, before training starts.
"""

from __future__ import annotations

import logging
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from softeval._io import read_yaml_mapping
from softeval.errors import SoftevalError, validation_problem
from softeval.study.settings import Settings

log = logging.getLogger("softeval")

FAST_FOLDER = "fast"  # the fast set's cells go to OUTPUT/fast, a folder (and analysis) of their own


class FastSet(BaseModel):
    """A cheaper evaluation run at every call, as OLMo-core's fast task set: fewer rows, fewer
    tuning steps for a prompt warm-started from the step before, fewer tasks. Its cells are not
    comparable with the full set's (other rows, other tuning), so they live in OUTPUT/fast."""

    model_config = ConfigDict(extra="forbid")
    limit: int | None = Field(None, ge=1)
    steps: int | None = Field(None, gt=0)  # tuning steps from a warm start (a series' first prompt tunes tuning.steps)
    tasks: list[str] | None = Field(None, min_length=1)  # a subset of the evaluator's tasks; None: all of them


class LoopSettings(Settings):
    """An in-loop evaluator's settings: those of a study's cells, and how it runs beside training."""

    warm_start: bool = True  # tune each step's soft prompt from the last evaluated step's
    fast: FastSet | None = None
    full_every: int = Field(1, ge=1)  # with a fast set: the full set runs at every full_every-th call
    tokens_per_step: float | None = Field(None, gt=0)  # tokens when the call gives none: step x this
    # distributed: seconds rank 0 waits for the other ranks' cells, beyond its own share (the ranks
    # that return first wait in training's next collective: keep it well under that group's timeout)
    rank_timeout: float = Field(300.0, gt=0)
    # the analysis, comparison and page are written after a call once this many seconds have
    # passed since they last were (0: after every call; `close()` writes any that are behind);
    # the cells, the series and evaluations.jsonl are written at every call
    refresh_every: float = Field(300.0, ge=0)

    @model_validator(mode="after")
    def _fast_set_is_a_subset(self) -> LoopSettings:
        if self.warm_start and self.sweep:
            raise ValueError("warm_start and sweep both choose where a prompt starts: drop one of them")
        unknown = [task for task in (self.fast.tasks or []) if task not in self.tasks] if self.fast else []
        if unknown:
            raise ValueError(f"fast.tasks names '{unknown[0]}', which is not among tasks; the fast set is a subset of the tasks")
        if self.fast is None and self.full_every > 1:
            raise ValueError("full_every spaces the full set between fast ones: give a fast set (fast: limit, steps, tasks) or drop full_every")
        return self

    def full_settings(self) -> Settings:
        """The full set's cells as a grid of their own."""
        return Settings(**{name: getattr(self, name) for name in Settings.model_fields})

    def fast_settings(self) -> Settings:
        """The fast set's cells as a grid of their own (their tuning steps are set per call:
        `fast.steps` applies to warm-started prompts only)."""
        fast = self.fast or FastSet()
        return self.full_settings().model_copy(update={"tasks": fast.tasks or self.tasks, "limit": fast.limit or self.limit})


# what a study file holds beyond its cells' settings: its models, and how its analysis reads them
STUDY_ONLY = ("models", "series", "reference", "ground_truth", "free_weights", "resources")


def load_loop_settings(path: str | Path, **overrides) -> LoopSettings:
    """The cells' settings of a study file (tasks, methods, limit, tuning, ...), for checkpoints
    evaluated as they land; its models and series are the study's own, and are left out."""
    path = Path(path)
    if not path.is_file():
        raise SoftevalError(f"study file not found: {path}; give the path of a study YAML")
    raw = read_yaml_mapping(path, "study file", "tasks, methods and settings")
    left_out = [key for key in STUDY_ONLY if key in raw]
    if left_out:
        log.info("%s: its %s are left out; the checkpoints are those of the run folders given", path, ", ".join(left_out))
    try:
        return LoopSettings.model_validate({key: value for key, value in raw.items() if key not in STUDY_ONLY} | overrides)
    except ValidationError as exc:
        raise SoftevalError(f"study file {path}: {validation_problem(exc, LoopSettings)}; fix the study file") from exc
