"""softeval: LLM benchmark evaluation that separates format-following from knowledge."""

from __future__ import annotations

import importlib as _importlib
import sys as _sys
import types as _types
from typing import TYPE_CHECKING

# The public API, by the module that defines each name. A name is imported on first use, so
# `import softeval` (and the command line's `--help`) does not wait for torch and transformers.
_EXPORTS = {
    "ALIASES": "softeval.models",
    "METHODS": "softeval.settings",
    "EvalResult": "softeval.results",
    "Example": "softeval.formats",
    "FORMATS": "softeval.formats",
    "LoadedModel": "softeval.models",
    "SoftPrompt": "softeval.softprompt",
    "SoftevalError": "softeval.errors",
    "Study": "softeval.settings",
    "TaskSpec": "softeval.task",
    "TuneConfig": "softeval.settings",
    "builtin_tasks": "softeval.task",
    "evaluate": "softeval.evaluate",
    "export_peft": "softeval.export",
    "initial_vectors": "softeval.softprompt",
    "load_examples": "softeval.data",
    "load_model": "softeval.models",
    "load_soft_prompt": "softeval.softprompt",
    "load_study": "softeval.settings",
    "load_task": "softeval.task",
    "prepare_alias": "softeval.models",
    "rank_study": "softeval.rank",
    "run_study": "softeval.study",
    "save_soft_prompt": "softeval.softprompt",
    "sweep": "softeval.tune",
    "tune": "softeval.tune",
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


class _Package(_types.ModuleType):
    def __setattr__(self, name: str, value) -> None:
        # Importing the module softeval.evaluate sets the package's `evaluate` to it; the public
        # `softeval.evaluate` is the function (as `tune` is), so a module never replaces an export.
        if name in _EXPORTS and isinstance(value, _types.ModuleType):
            return
        super().__setattr__(name, value)


_sys.modules[__name__].__class__ = _Package


if TYPE_CHECKING:  # for type checkers and editors: the same names, imported eagerly
    from softeval.data import load_examples
    from softeval.errors import SoftevalError
    from softeval.evaluate import evaluate
    from softeval.export import export_peft
    from softeval.formats import FORMATS, Example
    from softeval.models import ALIASES, LoadedModel, load_model, prepare_alias
    from softeval.rank import rank_study
    from softeval.results import EvalResult
    from softeval.settings import METHODS, Study, TuneConfig, load_study
    from softeval.softprompt import SoftPrompt, initial_vectors, load_soft_prompt, save_soft_prompt
    from softeval.study import run_study
    from softeval.task import TaskSpec, builtin_tasks, load_task
    from softeval.tune import sweep, tune
