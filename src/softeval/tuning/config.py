"""The methods and the tuning settings: what `softeval tune` and a study's `tuning:` block set,
the check that a task has rows enough to tune on, and the file a soft prompt's path names.

No torch here: the command line validates these before any model loads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from softeval.errors import SoftevalError
from softeval.tasks import TaskSpec

Method = Literal["zero-shot", "few-shot", "soft-prompt", "lora"]

METHODS: tuple[str, ...] = ("zero-shot", "few-shot", "soft-prompt", "lora")

TUNED = ("soft-prompt", "lora")  # the methods that evaluate something tuned

Init = Literal["vocab", "text", "random"]  # where soft-prompt vectors start (see softprompt.initial_vectors)

MIN_TUNING_ROWS = 5  # without a validation split, a fifth of these is held out for validation


class TuneConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt setting is an error, not a default
    steps: int = Field(120, gt=0)
    batch_size: int = Field(8, gt=0)
    lr: float = Field(0.01, gt=0, allow_inf_nan=False)
    length: int = Field(10, gt=0)
    init: Init = "vocab"
    init_text: str | None = None
    seed: int = Field(0, ge=0)  # numpy's generators take no negative seeds
    eval_every: int = Field(10, gt=0)
    val_size: int = Field(64, gt=0)
    max_grad_norm: float = 1.0
    chat: bool = False
    # what is tuned: the soft prompt, or LoRA adapters (length and init then do not apply)
    method: Literal["soft-prompt", "lora"] = "soft-prompt"
    lora_rank: int = Field(8, gt=0)
    lora_alpha: int = Field(16, gt=0)
    lora_targets: list[str] | None = None  # None: the model's own projections (see lora.default_targets)
    # opt-in adaptive tuning: stop once validation format-following has not risen above its best
    # for this many validations in a row (None: every step is run, as the method's protocol says)
    patience: int | None = Field(None, gt=0)


def check_tuning_rows(spec: TaskSpec, n_rows: int) -> None:
    """Without a validation split, a fifth of the tuning split is held out: it needs a few rows."""
    ds = spec.dataset
    if (not ds.validation_split or ds.validation_split == ds.tune_split) and n_rows < MIN_TUNING_ROWS:
        raise SoftevalError(
            f"task {spec.name}'s tuning split '{ds.tune_split}' has {n_rows} rows; tuning holds out a fifth "
            f"for validation and needs at least {MIN_TUNING_ROWS}, or a validation_split in the spec"
        )


def soft_prompt_file(path: str | Path) -> Path:
    """The soft prompt file a path names: the file itself, or the one in a folder `softeval tune` wrote."""
    path = Path(path)
    if path.is_dir():
        path = path / "soft_prompt.safetensors"
    if not path.is_file():
        raise SoftevalError(f"soft prompt not found: {path}; give the file or folder `softeval tune` wrote")
    return path
