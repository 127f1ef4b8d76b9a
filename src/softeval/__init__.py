"""softeval: LLM benchmark evaluation that separates format-following from knowledge."""

from softeval.data import Example, load_examples
from softeval.errors import SoftevalError
from softeval.evaluate import METHODS, EvalResult, evaluate
from softeval.models import ALIASES, LoadedModel, load_model, prepare_alias
from softeval.task import TaskSpec, builtin_tasks, load_task

__all__ = [
    "ALIASES",
    "METHODS",
    "EvalResult",
    "Example",
    "LoadedModel",
    "SoftevalError",
    "TaskSpec",
    "builtin_tasks",
    "evaluate",
    "load_examples",
    "load_model",
    "load_task",
    "prepare_alias",
]
