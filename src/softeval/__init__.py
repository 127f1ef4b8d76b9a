"""softeval: LLM benchmark evaluation that separates format-following from knowledge."""

from __future__ import annotations

import importlib as _importlib
from typing import TYPE_CHECKING

# The public API, by the module that defines each name. A name is imported on first use, so
# `import softeval` (and the command line's `--help`) does not wait for torch and transformers.
_EXPORTS = {
    "ALIASES": "softeval.models",
    "METHODS": "softeval.tuning",
    "EvalResult": "softeval.scoring",
    "Example": "softeval.formats",
    "FORMATS": "softeval.formats",
    "LoadedModel": "softeval.models",
    "SoftPrompt": "softeval.tuning",
    "SoftevalError": "softeval.errors",
    "Study": "softeval.study",
    "TaskSpec": "softeval.tasks",
    "TuneConfig": "softeval.tuning",
    "builtin_tasks": "softeval.tasks",
    "evaluate": "softeval.study",
    "export_peft": "softeval.tuning",
    "initial_vectors": "softeval.tuning",
    "load_examples": "softeval.tasks",
    "load_model": "softeval.models",
    "load_soft_prompt": "softeval.tuning",
    "load_study": "softeval.study",
    "load_task": "softeval.tasks",
    "prepare_alias": "softeval.models",
    "rank_study": "softeval.reports",
    "run_study": "softeval.study",
    "save_soft_prompt": "softeval.tuning",
    "sweep": "softeval.tuning",
    "tune": "softeval.tuning",
}

__all__ = [
    "ALIASES",
    "EvalResult",
    "Example",
    "FORMATS",
    "LoadedModel",
    "METHODS",
    "SoftPrompt",
    "SoftevalError",
    "Study",
    "TaskSpec",
    "TuneConfig",
    "builtin_tasks",
    "evaluate",
    "export_peft",
    "initial_vectors",
    "load_examples",
    "load_model",
    "load_soft_prompt",
    "load_study",
    "load_task",
    "prepare_alias",
    "rank_study",
    "run_study",
    "save_soft_prompt",
    "sweep",
    "tune",
]


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'softeval' has no attribute {name!r}")
    value = getattr(_importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value  # found here directly from now on
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


if TYPE_CHECKING:  # for type checkers and editors: the same names, imported eagerly
    from softeval.errors import SoftevalError
    from softeval.formats import FORMATS, Example
    from softeval.models import ALIASES, LoadedModel, load_model, prepare_alias
    from softeval.reports import rank_study
    from softeval.scoring import EvalResult
    from softeval.study import Study, evaluate, load_study, run_study
    from softeval.tasks import TaskSpec, builtin_tasks, load_examples, load_task
    from softeval.tuning import (
        METHODS,
        SoftPrompt,
        TuneConfig,
        export_peft,
        initial_vectors,
        load_soft_prompt,
        save_soft_prompt,
        sweep,
        tune,
    )
