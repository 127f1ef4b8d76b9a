"""softeval: LLM benchmark evaluation that separates format-following from knowledge."""

from __future__ import annotations

from typing import TYPE_CHECKING

from softeval._lazy import lazy_exports

# The public API, by the module or package that offers each name. A name is imported on first use,
# so `import softeval` (and the command line's `--help`) does not wait for torch and transformers.
_EXPORTS = {
    "ALIASES": "models",
    "METHODS": "tuning",
    "EvalResult": "scoring",
    "Example": "formats",
    "FORMATS": "formats",
    "InLoop": "loop",
    "LoadedModel": "models",
    "SoftPrompt": "tuning",
    "SoftevalCallback": "loop",
    "SoftevalError": "errors",
    "SoftevalLightningCallback": "loop",
    "Study": "study",
    "TaskSpec": "tasks",
    "TuneConfig": "tuning",
    "builtin_tasks": "tasks",
    "evaluate": "study",
    "export_peft": "tuning",
    "initial_vectors": "tuning",
    "load_examples": "tasks",
    "load_model": "models",
    "load_soft_prompt": "tuning",
    "load_study": "study",
    "load_task": "tasks",
    "prepare_alias": "models",
    "rank_study": "reports",
    "run_study": "study",
    "save_soft_prompt": "tuning",
    "sweep": "tuning",
    "tune": "tuning",
    "watch": "loop",
}

__all__ = [
    "ALIASES",
    "EvalResult",
    "Example",
    "FORMATS",
    "InLoop",
    "LoadedModel",
    "METHODS",
    "SoftPrompt",
    "SoftevalCallback",
    "SoftevalError",
    "SoftevalLightningCallback",
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
    "watch",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)


if TYPE_CHECKING:  # for type checkers and editors: the same names, imported eagerly
    from softeval.errors import SoftevalError
    from softeval.formats import FORMATS, Example
    from softeval.loop import InLoop, SoftevalCallback, SoftevalLightningCallback, watch
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
