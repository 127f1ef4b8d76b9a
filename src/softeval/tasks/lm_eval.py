"""Tasks of lm-evaluation-harness, read through its own task registry: `--task lm-eval:NAME`.

lm-eval's configuration of a task says where its data lives, how a row becomes a prompt
(`doc_to_text`), its options (`doc_to_choice`) and its answer (`doc_to_target`), often through
Python functions of its own (`process_docs`, `!function utils.doc_to_text`). softeval does not copy
any of that: it reads each split as it reads any task's (the mirror folder by the task's
`dataset_path` and `dataset_name`, else the hub), hands the rows to lm-eval's task object, and
keeps what lm-eval computes for each row beside the row (`lm_eval_text`, `lm_eval_choices`,
`lm_eval_answer`, ...). The spec built here reads those values:

* a `multiple_choice` task becomes a generative letter task (`lm-eval:NAME`) or an option-text
  task (`lm-eval:NAME:option_text`), whose knowledge is lm-eval's own log-likelihood formulation:
  its `doc_to_text` as the context and its options as continuations, per character where lm-eval
  reports `acc_norm` (so knowledge is lm-eval's acc_norm), summed where it reports only `acc`;
* a `generate_until` task takes its prompt and stop strings from lm-eval, and an answer format
  from the name (`lm-eval:NAME:number`), known for the common ones (GSM8K, TriviaQA, NQ-open, MATH).

lm-eval is an optional dependency: `pip install 'softeval[lm-eval]'`.
"""

from __future__ import annotations

import logging
import random
import re
from functools import cache
from importlib.resources import files

from softeval.errors import SoftevalError
from softeval.formats import LETTERS

PREFIX = "lm-eval:"
# generation tasks whose answer format is known: by name, or by the start of the name
KNOWN_FORMATS = {"gsm8k": "number", "triviaqa": "short_answer", "nq_open": "short_answer", "hendrycks_math": "math", "minerva_math": "math"}
CHOICE_FORMATS = ("multiple_choice", "option_text")
GENERATION_FORMATS = ("number", "short_answer", "math")
# a prompt's last line that cues the answer ("Answer:"): the options are shown above it
CUE = re.compile(r"\n([^\n]{1,30}:)[ \t]*$")


def is_lm_eval_task(name: str) -> bool:
    return str(name).startswith(PREFIX)


def lm_eval_spec(name: str) -> dict:
    """The task spec (as a mapping, validated by the caller) of `lm-eval:NAME[:FORMAT]`."""
    task_name, _, answer_format = str(name)[len(PREFIX) :].partition(":")
    config = _config(task_name)
    output_type = config.get("output_type", "generate_until")
    if output_type == "multiple_choice":
        answer_format = answer_format or "multiple_choice"
        if answer_format not in CHOICE_FORMATS:
            raise SoftevalError(f"lm-eval task '{task_name}' is multiple choice: answer it as {' or '.join(CHOICE_FORMATS)}, not '{answer_format}'")
    elif output_type == "generate_until":
        answer_format = answer_format or _known_format(task_name)
        if answer_format not in GENERATION_FORMATS:
            raise SoftevalError(f"lm-eval task '{task_name}' generates text; name its answer format: lm-eval:{task_name}:FORMAT, "
                                f"FORMAT one of {', '.join(GENERATION_FORMATS)}")
    else:
        raise SoftevalError(f"lm-eval task '{task_name}' is a {output_type} task; softeval evaluates multiple-choice and generation tasks")
    spec = {
        "name": _spec_name(task_name, answer_format),
        "description": f"lm-evaluation-harness task {task_name}, answered as {answer_format}",
        "dataset": _dataset(task_name, config),
        "answer_format": answer_format,
        "lm_eval": {"task": task_name, "version": _lm_eval_version(), "task_version": str((config.get("metadata") or {}).get("version"))},
    }
    if output_type == "multiple_choice":
        return spec | _choice_spec(config, answer_format)
    return spec | _generation_spec(config, answer_format)


def _choice_spec(config: dict, answer_format: str) -> dict:
    description = (config.get("description") or "").strip()
    metrics = {m.get("metric") for m in config.get("metric_list") or []}
    if answer_format == "multiple_choice":
        ask, shown, target = "the letter of the correct option", "options", " {{ letter }}"
    else:
        ask, shown, target = "the text of the correct option", "'Options:\n- ' ~ choices | join('\n- ')", " {{ answer_text }}"
    return {
        # partial scoring (Winogrande: lm-eval scores each option as a context) where a row has it
        "fields": {"question": "lm_eval_stem", "choices": "lm_eval_choices", "answer": "lm_eval_answer",
                   "cloze_contexts": "lm_eval_contexts", "cloze_continuation": "lm_eval_continuation"},
        "instruction": (description + "\n" if description else "") + f"Answer with {ask}.",
        # the options above the answer cue, unless lm-eval's prompt lists them already (MMLU's
        # options are its letters)
        "template": "{{ lm_eval_text if lm_eval_lists_options else (lm_eval_stem ~ '\n' ~ " + shown + " ~ '\n' ~ lm_eval_cue) }}",
        # lm-eval's own context, after its description: options are scored as lm-eval scores them
        "cloze_template": "{{ cloze_context if cloze_context is defined else lm_eval_text }}",
        "cloze_instruction": description,
        "target": target,
        "stop": ["\n"],
        "max_new_tokens": 8 if answer_format == "multiple_choice" else 48,
        "cloze_normalization": "characters" if "acc_norm" in metrics else "none",
    }


def _generation_spec(config: dict, answer_format: str) -> dict:
    generation = config.get("generation_kwargs") or {}
    until = generation.get("until") or ["\n\n"]
    fields = {"question": "lm_eval_text", "answer": "lm_eval_answer"}
    fields |= {"aliases": "lm_eval_aliases"} if answer_format == "short_answer" else {"solution": "lm_eval_target"}
    return {
        "fields": fields,
        "instruction": (config.get("description") or "").strip(),
        "template": "{{ lm_eval_text }}",
        # a MATH answer is read from \\boxed{}: the target writes it so
        "target": (config.get("target_delimiter", " ") or "")
        + ("\\boxed{{ '{' }}{{ lm_eval_answer }}{{ '}' }}" if answer_format == "math" else "{{ lm_eval_target }}"),
        "stop": [until] if isinstance(until, str) else list(until),
        "max_new_tokens": int(generation.get("max_gen_toks", 256)),
    }


def _spec_name(task_name: str, answer_format: str) -> str:
    """Where results are filed: lm-eval-NAME, and the answer format where it is not the task's own."""
    usual = answer_format in ("multiple_choice", _known_format(task_name))
    return f"lm-eval-{task_name}" if usual else f"lm-eval-{task_name}-{answer_format}"


def _known_format(task_name: str) -> str | None:
    return next((fmt for known, fmt in KNOWN_FORMATS.items() if task_name == known or task_name.startswith(known + "_")), None)


def _dataset(task_name: str, config: dict) -> dict:
    """Which splits evaluate, tune, give demonstrations and validate the tuning, from lm-eval's."""
    train, validation, test = config.get("training_split"), config.get("validation_split"), config.get("test_split")
    evaluated = test or validation
    if evaluated is None:
        raise SoftevalError(f"lm-eval task '{task_name}' names no test or validation split to evaluate")
    tune = next((s for s in (train, validation, config.get("fewshot_split")) if s and s != evaluated), evaluated)
    fewshot = config.get("fewshot_split") or tune
    held_out = validation if validation not in (None, evaluated, tune) else None
    return {"path": config["dataset_path"], "config": config.get("dataset_name"), "eval_split": evaluated, "tune_split": tune,
            "fewshot_split": fewshot, "validation_split": held_out}


# --- lm-eval's side ----------------------------------------------------------------------------


def _lm_eval_version() -> str:
    from importlib.metadata import version

    return version("lm-eval")


@cache
def _task_manager():
    try:
        from lm_eval.tasks import TaskManager
    except ImportError as exc:
        raise SoftevalError("lm-eval tasks need lm-evaluation-harness; install it with: pip install 'softeval[lm-eval]'") from exc
    return TaskManager()


@cache
def _config(task_name: str) -> dict:
    """lm-eval's configuration of a task, its includes merged and its `!function`s resolved.
    (`_index` and `_yaml_loader` are lm-eval's own modules, the ones its task manager reads
    configurations with: hence the pin below 0.5.)"""
    manager = _task_manager()  # first: it tells how to install lm-eval where it is missing
    from lm_eval.tasks._index import Kind
    from lm_eval.tasks._yaml_loader import load_yaml

    entry = manager.task_index.get(task_name)
    if entry is None:
        # names that start with it first (arc: arc_easy), then names that hold it
        close = sorted(t for t in manager.all_tasks if task_name in t and not t.startswith(task_name))
        close = (sorted(t for t in manager.all_tasks if t.startswith(task_name)) + close)[:5]
        hint = f"; did you mean {', '.join(close)}?" if close else "; `lm-eval ls tasks` lists them"
        raise SoftevalError(f"unknown lm-eval task '{task_name}'{hint}")
    if entry.kind == Kind.PY_TASK or (entry.yaml_path is None and entry.kind == Kind.TASK):
        raise SoftevalError(f"lm-eval defines task '{task_name}' with code of its own (a task class or a custom dataset), which softeval cannot use")
    if entry.kind != Kind.TASK:
        members = _members(manager, task_name)
        example = f" (such as {', '.join(members[:3])})" if members else ""
        builtin = (files("softeval.tasks") / "builtin" / f"{task_name}.yaml").is_file()
        own = f"; or use softeval's built-in --task {task_name}" if builtin else ""
        raise SoftevalError(f"lm-eval '{task_name}' names several tasks (a {entry.kind.name.lower()}); give them one by one{example}{own}")
    try:
        config = load_yaml(entry.yaml_path, resolve_func=True)
    # a task's own module may import what is not installed, or end the process when it is imported
    except (Exception, SystemExit) as exc:  # noqa: BLE001
        raise SoftevalError(f"lm-eval task '{task_name}': its configuration cannot be loaded ({_said(exc)})") from exc
    if "class" in config or config.get("custom_dataset"):
        raise SoftevalError(f"lm-eval defines task '{task_name}' with code of its own (a task class or a custom dataset), which softeval cannot use")
    return {key: value for key, value in config.items() if key not in ("tag", "group", "task_list")}


def _said(exc: BaseException) -> str:
    """A third-party exception as one line: its kind and its own message."""
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


def lm_eval_prompt(task_name: str) -> str | None:
    """lm-eval's own prompt of a task, as its configuration writes it: the `doc_to_text` template,
    or the function that makes it (`!function utils.doc_to_text`)."""
    made_by = _config(task_name).get("doc_to_text")
    if callable(made_by):
        return f"!function {made_by.__module__}.{made_by.__qualname__}"
    return None if made_by is None else str(made_by)


def _members(manager, name: str, depth: int = 0) -> list[str]:
    """The tasks a group or tag of lm-eval stands for, through its subgroups and tags."""
    from lm_eval.tasks._index import Kind
    from lm_eval.tasks._yaml_loader import load_yaml

    entry = manager.task_index.get(name)
    if entry is None or entry.kind == Kind.TASK or depth > 4:
        return [name] if entry is not None and entry.kind == Kind.TASK else []
    if entry.kind == Kind.TAG:
        children = sorted(t for t, e in manager.task_index.items() if name in e.tags)
    else:
        listed = load_yaml(entry.yaml_path, resolve_func=False).get("task") or [] if entry.yaml_path else []
        children = [c if isinstance(c, str) else c.get("task", "") for c in listed]
    return [task for child in children for task in _members(manager, child, depth + 1)]


def lm_eval_docs(task_name: str, split: str, rows: list[tuple[dict, str]]) -> list[tuple[dict, str]]:
    """The rows as lm-eval's task makes them into documents (its `process_docs`), each with what
    lm-eval computes of it: prompt, options, answer."""
    import datasets
    from lm_eval.api.task import ConfigurableTask

    config = dict(_config(task_name))
    table = datasets.Dataset.from_list([row for row, _ in rows])
    splits = {s for s in (config.get(k) for k in ("training_split", "validation_split", "test_split", "fewshot_split")) if s}
    # the task reads these rows for every split it names, instead of downloading its dataset
    config["custom_dataset"] = lambda **_: datasets.DatasetDict(dict.fromkeys(splits | {split}, table))
    lm_eval_log = logging.getLogger("lm_eval")
    level = lm_eval_log.level
    lm_eval_log.setLevel(logging.ERROR)  # its note on custom datasets is addressed to its own command line
    try:
        task = ConfigurableTask(config=config)
        process = task.config.process_docs
        docs = list(process(table) if process is not None else table)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - lm-eval's task set-up and its processing raise many kinds
        raise SoftevalError(f"lm-eval task {task_name} cannot read split '{split}' ({_said(exc)[:200]}); check the data") from exc
    finally:
        lm_eval_log.setLevel(level)
    # lm-eval's processing may drop rows: a document is then known by its position
    where = [w for _, w in rows] if len(docs) == len(rows) else [f"{rows[0][1].rsplit(':', 1)[0]} document {i}" for i in range(len(docs))]
    computed = []
    for doc, source in zip(docs, where):
        try:
            computed.append((doc | _computed(task, doc), source))
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - lm-eval's templates and functions raise many kinds
            raise SoftevalError(f"{source}: lm-eval task {task_name} cannot read this row ({_said(exc)}); check the data") from exc
    return computed


def _computed(task, doc: dict) -> dict:
    """What lm-eval makes of one document: softeval's fields, under lm_eval_ names."""
    text, target = task.doc_to_text(doc), task.doc_to_target(doc)
    if task.config.output_type != "multiple_choice":
        targets = target if isinstance(target, list) else [target]
        targets = [str(t).strip() for t in targets]
        return {"lm_eval_text": text, "lm_eval_target": targets[0], "lm_eval_answer": _final_answer(targets[0]), "lm_eval_aliases": targets}
    choices = [str(c) for c in task.doc_to_choice(doc)]
    if isinstance(text, int):
        return _partial(task, choices, gold=text, target=target)
    answer = choices.index(target) if isinstance(target, str) else int(target[0] if isinstance(target, list) else target)
    if isinstance(task.config.doc_to_target, int):
        # the answer always at one position (SciQ's is the last): a prompt answered by position
        # would learn the position, so the options are shown in an order of their own (seeded by
        # their texts); knowledge scores each option's text, whatever its position
        order = list(range(len(choices)))
        random.Random("\x1f".join(sorted(choices))).shuffle(order)
        choices, answer = [choices[i] for i in order], order.index(answer)
    cue = CUE.search(text)
    stem, cue_text = (text[: cue.start()], cue.group(1)) if cue else (text, "Answer:")
    return {"lm_eval_text": text, "lm_eval_stem": stem, "lm_eval_cue": cue_text, "lm_eval_choices": choices, "lm_eval_answer": answer,
            "lm_eval_lists_options": choices == list(LETTERS[: len(choices)]), "lm_eval_contexts": None, "lm_eval_continuation": None}


def _partial(task, contexts: list[str], gold: int, target) -> dict:
    """lm-eval's partial scoring (Winogrande): each option is a context, the continuation after it
    is shared, and lm-eval's `doc_to_text` gives the gold option's index. Asked generatively, the
    options are the whole sentences (each context with the continuation), under a bare question."""
    continuation = target if isinstance(target, str) else contexts[target]
    sentences = [f"{context}{task.config.target_delimiter}{continuation}" for context in contexts]
    return {"lm_eval_text": "", "lm_eval_stem": "Which is right?", "lm_eval_cue": "Answer:", "lm_eval_answer": gold, "lm_eval_lists_options": False,
            "lm_eval_choices": sentences, "lm_eval_contexts": contexts, "lm_eval_continuation": continuation}


def _final_answer(target: str) -> str:
    """A worked solution's final answer (GSM8K's "#### 72"), else the target itself."""
    return target.split("####")[-1].strip().replace(",", "") if "####" in target else target
