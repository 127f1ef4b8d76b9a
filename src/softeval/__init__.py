"""softeval: LLM benchmark evaluation that separates format-following from knowledge."""

from softeval.data import load_examples
from softeval.errors import SoftevalError
from softeval.evaluate import METHODS, EvalResult, evaluate
from softeval.formats import FORMATS, Example
from softeval.export import export_peft
from softeval.models import ALIASES, LoadedModel, load_model, prepare_alias
from softeval.softprompt import SoftPrompt, initial_vectors, load_soft_prompt, save_soft_prompt
from softeval.rank import rank_study
from softeval.study import Study, load_study, run_study
from softeval.task import TaskSpec, builtin_tasks, load_task
from softeval.tune import TuneConfig, sweep, tune

__all__ = [
    "ALIASES",
    "METHODS",
    "EvalResult",
    "Example",
    "FORMATS",
    "LoadedModel",
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
