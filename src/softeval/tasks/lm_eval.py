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
  from the name (`lm-eval:NAME:number`), known for the common ones (GSM8K, TriviaQA, NQ-open, MATH);
  any other is read as lm-eval reads it (the `lm_eval` format): the strict answer is what its
  first (or `strict`-named) filter pipeline extracts, the lenient one what its flexible one
  extracts, and an answer is right where lm-eval's own `process_results` scores it so by its first
  metric (exact match with the options it configures, or a task's own scoring, such as DROP's).

lm-eval is an optional dependency: `pip install 'softeval[lm-eval]'`.
"""

from __future__ import annotations

import logging
import random
import re
from contextlib import nullcontext
from dataclasses import dataclass
from functools import cache
from importlib.resources import files

from softeval.errors import SoftevalError
from softeval.formats import LETTERS
from softeval.formats.lm_eval import READINGS
from softeval.models import hub_unreachable, offline, offline_mode_set

PREFIX = "lm-eval:"
# generation tasks whose answer format is known: by name, or by the start of the name
KNOWN_FORMATS = {"gsm8k": "number", "triviaqa": "short_answer", "nq_open": "short_answer", "hendrycks_math": "math", "minerva_math": "math"}
MATH_FAMILIES = ("hendrycks_math", "minerva_math")
CHOICE_FORMATS = ("multiple_choice", "option_text")
GENERATION_FORMATS = ("number", "short_answer", "math", "lm_eval")
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
        answer_format = answer_format or _default_format(task_name, config)
        if answer_format not in GENERATION_FORMATS:
            metric = _first_metric(config)
            scored = f"lm-eval scores it by {metric}, which counts no answer right or wrong" if metric else "lm-eval names no metric for it"
            raise SoftevalError(f"lm-eval task '{task_name}' generates text and {scored}; name an answer format to read it by: "
                                f"lm-eval:{task_name}:FORMAT, FORMAT one of {', '.join(f for f in GENERATION_FORMATS if f != 'lm_eval')}")
        if answer_format == "lm_eval" and not _scored_by_lm_eval(config):
            raise SoftevalError(f"lm-eval task '{task_name}' is scored by {_first_metric(config) or 'no metric'}, not right or wrong: the lm_eval "
                                f"format reads tasks scored by {', '.join(RIGHT_OR_WRONG)}; name another format")
    else:
        raise SoftevalError(f"lm-eval task '{task_name}' is a {output_type} task; softeval evaluates multiple-choice and generation tasks")
    spec = {
        "name": _spec_name(task_name, answer_format, config),
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
    fields = {"question": "lm_eval_text", "answer": "lm_eval_right_answer" if answer_format == "lm_eval" else "lm_eval_answer"}
    fields |= {"aliases": "lm_eval_aliases"} if answer_format == "short_answer" else {"solution": "lm_eval_target"}
    target = {"math": "\\boxed{{ '{' }}{{ lm_eval_answer }}{{ '}' }}", "lm_eval": "{{ lm_eval_strict_target }}"}.get(answer_format, "{{ lm_eval_target }}")
    return {
        "fields": fields,
        "instruction": (config.get("description") or "").strip(),
        "template": "{{ lm_eval_text }}",
        # a MATH answer is read from \\boxed{}: the target writes it so; lm-eval's own reading,
        # as its strict filter extracts it
        "target": (config.get("target_delimiter", " ") or "") + target,
        "stop": [until] if isinstance(until, str) else list(until),
        "max_new_tokens": int(generation.get("max_gen_toks", 256)),
    }


def _spec_name(task_name: str, answer_format: str, config: dict) -> str:
    """Where results are filed: lm-eval-NAME, and the answer format where it is not the task's own."""
    usual = answer_format in ("multiple_choice", _default_format(task_name, config))
    return f"lm-eval-{task_name}" if usual else f"lm-eval-{task_name}-{answer_format}"


def _default_format(task_name: str, config: dict) -> str | None:
    """A generation task's answer format where none is named: softeval's own where it is known
    to fit, else lm-eval's reading where its configuration defines one."""
    return _known_format(task_name) or ("lm_eval" if _scored_by_lm_eval(config) else None)


def _known_format(task_name: str) -> str | None:
    """softeval's format of a task it knows: by its name, or for the MATH families (whose subject
    tasks share one reading) by the start of its name. GSM8K's variants (`gsm8k_cot`) read their
    answers otherwise than `#### N`, so they take lm-eval's own reading."""
    if task_name in KNOWN_FORMATS:
        return KNOWN_FORMATS[task_name]
    return next((fmt for family, fmt in KNOWN_FORMATS.items() if family in MATH_FAMILIES and task_name.startswith(family + "_")), None)


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
    # a task's module may load metrics from the hub as it is imported: where the hub is not to be
    # asked, or cannot be reached, they fail at once rather than after seconds of retries
    without_hub = offline_mode_set() or hub_unreachable() is not None
    try:
        with offline() if without_hub else nullcontext():
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
        READINGS[task_name] = _TaskReading(task)  # the `lm_eval` format reads answers by it
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
        written, right = strict_target(task, doc, targets[0])
        return {"lm_eval_text": text, "lm_eval_target": targets[0], "lm_eval_answer": _final_answer(targets[0]), "lm_eval_aliases": targets,
                "lm_eval_task": task.config.task, "lm_eval_strict_target": written, "lm_eval_right_answer": right}
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


# --- lm-eval's own reading of an answer (the `lm_eval` format) ---------------------------------------

@dataclass(frozen=True)
class _TaskReading:
    """An lm-eval task's reading of answers, as the `lm_eval` format asks for it (`READINGS`):
    lm-eval's task object, as `lm_eval_docs` last built it."""

    task: object  # lm_eval.api.task.ConfigurableTask

    def extract(self, completion: str, doc: dict, *, flexible: bool = False) -> str | None:
        return lm_eval_extract(self.task.config.task, completion, doc, flexible=flexible)

    def score(self, answer: str, doc: dict) -> float:
        return lm_eval_scores(self.task, answer, doc)


INVALID = "[invalid]"  # what lm-eval's regex filter gives where it finds no answer


# lm-eval's metrics that score a row right or wrong (1 or 0): an answer is right where it scores 1
RIGHT_OR_WRONG = ("exact_match", "em", "acc")


def _scored_by_lm_eval(config: dict) -> bool:
    """Whether lm-eval's configuration scores an answer right or wrong: its first metric is one
    of RIGHT_OR_WRONG (a task scored by BLEU or ROUGE alone has no right answer to count)."""
    return _first_metric(config) in RIGHT_OR_WRONG


def _first_metric(config: dict) -> str | None:
    """The name of the first metric of lm-eval's `metric_list` (a function's name where it names one)."""
    listed = [m.get("metric") for m in config.get("metric_list") or [] if isinstance(m, dict)]
    if not listed:
        return None
    first = listed[0]
    return first if isinstance(first, str) else getattr(first, "__name__", None)


@cache
def _pipelines(task_name: str) -> tuple:
    """(strict, flexible or None): lm-eval's filter pipelines of a task, built by lm-eval. Strict
    is the one named `strict...`, else the first; flexible the one named `flex...`, else the
    second. Without filters, lm-eval takes the completion as it is (its `take_first`)."""
    from lm_eval.filters import build_filter_ensemble

    listed = _config(task_name).get("filter_list") or [{"name": "none", "filter": [{"function": "take_first"}]}]
    built = [build_filter_ensemble(f["name"], [(step["function"], {k: v for k, v in step.items() if k != "function"}) for step in f["filter"]])
             for f in listed]
    names = [f["name"].lower() for f in listed]
    strict = next((b for b, n in zip(built, names) if n.startswith("strict")), built[0])
    flexible = next((b for b, n in zip(built, names) if n.startswith("flex")), built[1] if len(built) > 1 else None)
    return strict, flexible if flexible is not strict else None


def lm_eval_extract(task_name: str, completion: str, doc: dict, *, flexible: bool = False) -> str | None:
    """The answer lm-eval's strict (or flexible) filter pipeline reads in a completion; None where
    it finds none (its regex filters' fallback, or nothing at all) or where the task has no
    flexible pipeline."""
    strict, loose = _pipelines(task_name)
    pipeline = loose if flexible else strict
    if pipeline is None:
        return None
    responses = [[completion]]
    for make in pipeline.filters:
        responses = list(make().apply(responses, [doc]))  # take_first gives a map
    answer = responses[0]
    while isinstance(answer, list | tuple):  # a pipeline without take_first keeps a list
        answer = answer[0] if answer else None
    # nothing extracted: the regex filters' fallback, or an empty completion taken as it is
    return None if answer is None or str(answer) == INVALID or not str(answer).strip() else str(answer)


def lm_eval_scores(task, answer: str, doc: dict) -> float:
    """lm-eval's own score of an extracted answer by its task object, through its
    `process_results` and the first metric of its `metric_list` (exact match with its options, or
    the task's own scoring)."""
    task_name = task.config.task
    first = _first_metric(_config(task_name))  # the metric `_scored_by_lm_eval` found right or wrong
    scored = task.process_results(doc, [answer])
    if first not in scored:
        raise SoftevalError(f"lm-eval task {task_name}: its process_results gives no {first} (it gives {', '.join(scored) or 'nothing'})")
    return float(scored[first])


def strict_target(task, doc: dict, target: str) -> tuple[str, str]:
    """(written, answer): a right answer, and its text as lm-eval's strict filter reads it back as
    right. The answer is lm-eval's target, else (where lm-eval's own scoring does not take its
    target as right: DROP's joins the keys of its answer) the first text of the row it does; it
    is written as it is, else in the phrasings chain-of-thought tasks end with ("The answer is
    6."), the first that lm-eval's filter and scoring accept. The target itself where none does.
    `task` is lm-eval's task object."""
    task_name = task.config.task
    if not _scored_by_lm_eval(_config(task_name)):
        return target, target
    for answer in dict.fromkeys([target, *_texts(doc)]):
        for text in (answer, f"The answer is {answer}.", f"the answer is {answer}.", f"So the answer is {answer}.", f"#### {answer}"):
            try:
                read = lm_eval_extract(task_name, text, doc)
                right = read is not None and lm_eval_scores(task, read, doc) == 1.0
            except Exception:  # noqa: BLE001 - a task's own scoring may refuse a phrasing: try the next
                right = False
            if right:
                return text, answer
    return target, target


def _texts(value, found: list | None = None, limit: int = 20) -> list[str]:
    """The short texts a row holds, nested ones included, in order (at most `limit`)."""
    found = [] if found is None else found
    if isinstance(value, str):
        if value.strip() and len(value) <= 200 and len(found) < limit:
            found.append(value.strip())
    elif isinstance(value, dict):
        for item in value.values():
            _texts(item, found, limit)
    elif isinstance(value, list | tuple):
        for item in value:
            _texts(item, found, limit)
    return found
