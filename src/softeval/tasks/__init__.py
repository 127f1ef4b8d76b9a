"""Tasks: specs declared in YAML (`builtin/` holds the built-in ones), their data (the benchmark
mirror, local files or the hub), read and checked row by row, and the prompts built from them.
"""

from softeval._lazy import lazy_exports

EXPORTS = {
    # data
    "DATA_ENV": "data",
    "apart_from_evaluation": "data",
    "data_identity": "data",
    "load_examples": "data",
    "resolve_data_dir": "data",
    "split_sizes": "data",
    "split_source": "data",
    "with_answer_words": "data",
    # prompts
    "Cloze": "prompts",
    "PromptBuilder": "prompts",
    "cloze_context_ends_in_space": "prompts",
    "choose_demos": "prompts",
    "tuning_target": "prompts",
    # spec
    "TaskSpec": "spec",
    "builtin_tasks": "spec",
    "load_task": "spec",
}
__all__ = sorted(EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, EXPORTS)
