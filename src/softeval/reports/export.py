"""Export: a folder's finished cells in the files other tools read, keeping what softeval tells
apart (strict from lenient answers, format from knowledge, each score's bootstrap interval).

- `eee`: Every Eval Ever (schema 0.3.0), the datastore layout
  `data/<task>/<developer>/<model>/<uuid>.json` with its `<uuid>_samples.jsonl`, one pair per
  cell (model x task x method x chat mode); every metric is an evaluation result of its own.
- `lm-eval`: lm-evaluation-harness 0.4's `<model>/results_<time>.json` and
  `<model>/samples_<task>_<time>.jsonl`, one results file per model, method and chat mode with
  that group's tasks; the method is part of the model's name, so methods never share a file.

Metric names in lm-eval's `metric,filter` spelling: the filter says how the answer was read.

| softeval             | lm-eval key                                                              |
| format_following     | format_following,strict                                                  |
| task_accuracy        | task_accuracy,strict                                                     |
| conditional_accuracy | conditional_accuracy,strict                                              |
| lenient_accuracy     | lenient_accuracy,lenient                                                 |
| knowledge            | knowledge,acc_norm: option log-likelihoods per character (acc: summed);  |
|                      | knowledge,lenient: open-ended tasks; knowledge,loglikelihood: multiple   |
|                      | choice whose spec has changed since, so its normalisation is not known   |

lm-eval has standard errors, not intervals: `<metric>_stderr` is the 95% interval's half-width
/ 1.96, and the exact bounds are kept in the results file's `softeval` block.

No torch here, and nothing of the every-eval-ever or lm-eval packages: softeval writes the JSON.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import re
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from softeval._io import write_json_atomic, write_text_atomic
from softeval.errors import SoftevalError
from softeval.models import model_name
from softeval.scoring import MEANINGS, METRICS, ROW_METRICS, EvalResult, Metric, aggregate

if TYPE_CHECKING:
    from softeval.tasks import TaskSpec

EXPORT_FORMATS = ("eee", "lm-eval")
EEE_SCHEMA_VERSION = "0.3.0"
CONFIDENCE_LEVEL = 0.95
Z_95 = 1.96  # a 95% normal interval is the estimate +- 1.96 standard errors
# the resamples behind every cell's intervals: `aggregate`'s own default, which cells do not record
BOOTSTRAP_RESAMPLES = inspect.signature(aggregate).parameters["n_resamples"].default
CI_METHOD = "percentile bootstrap over the evaluated rows, resampled jointly for all metrics"
# the hub ids of the model aliases (GGUF packages of these models)
ALIAS_HUB_IDS = {"smollm2-135m-instruct": "HuggingFaceTB/SmolLM2-135M-Instruct", "gemma-3-270m": "google/gemma-3-270m"}
# the answer each metric reads: its lm-eval filter, but for knowledge, which depends on the task
METRIC_FILTERS = {
    "format_following": "strict",
    "task_accuracy": "strict",
    "conditional_accuracy": "strict",
    "lenient_accuracy": "lenient",
}
KNOWLEDGE_SCORING = {
    "acc_norm": {"scoring": "option_loglikelihood", "normalization": "characters"},
    "acc": {"scoring": "option_loglikelihood", "normalization": "none"},
    "loglikelihood": {"scoring": "option_loglikelihood", "normalization": None},  # the spec that said it has changed
    "lenient": {"scoring": "lenient_parser"},
}
_UNPORTABLE = re.compile(r'[<>:"/\\|?*\x00-\x1f]')
_WINDOWS_RESERVED = {"CON", "PRN", "AUX", "NUL", *(f"COM{i}" for i in range(1, 10)), *(f"LPT{i}" for i in range(1, 10))}


@dataclass
class Cell:
    """A finished cell and what the exports say of it beyond its results file."""

    result: EvalResult
    label: str  # method and chat mode, as the cell's folder is named: soft-prompt-chat
    model_id: str  # hub id (developer/name) where known, else softeval's name of the model
    knowledge: str  # how knowledge was scored: a key of KNOWLEDGE_SCORING
    spec: TaskSpec | None  # the task spec the cell read, where it still says the same
    flags: list[str]  # why its scores may mean little (see analysis.cell_flags)

    @property
    def task(self) -> str:
        return self.result.config["task"]

    @property
    def model_folder(self) -> str:
        """softeval's name of the model, its folder in the output folder, where it is unique (an alias and
        the hub model it packages share a hub id, not a name)."""
        return model_name(self.result.config["model"])

    @property
    def created(self) -> datetime:
        """When the cell was evaluated (UTC)."""
        created = self.result.created
        when = datetime.fromisoformat(created) if created else datetime.now(UTC)
        return when.astimezone(UTC) if when.tzinfo else when.replace(tzinfo=UTC)

    def filter_of(self, metric: str) -> str:
        return self.knowledge if metric == "knowledge" else METRIC_FILTERS[metric]


def export_folder(folder: str | Path, fmt: str, output: str | Path | None = None) -> list[Path]:
    """Write every finished cell of `folder` in format `fmt` (see EXPORT_FORMATS) under `output`
    (default: FOLDER/export/<fmt>/); returns the files written."""
    if fmt not in EXPORT_FORMATS:
        raise SoftevalError(f"--format: unknown format '{fmt}'; choose one of: {', '.join(EXPORT_FORMATS)}")
    folder = Path(folder)
    if not folder.is_dir():
        raise SoftevalError(f"no results folder at {folder}; give the --output folder of softeval eval, run or study")
    from softeval.analysis import finished_cells  # with scipy (1.5 s): not imported to answer a mistake

    results = finished_cells(folder)
    if not results:
        raise SoftevalError(f"{folder} holds no finished cells (OUTPUT/<model>/<task>/<method>/results.json); run softeval eval, run or study into it")
    cells = described(results)
    output = Path(output) if output is not None else folder / "export" / fmt
    return write_eee(cells, output) if fmt == "eee" else write_lm_eval(cells, output)


def described(results: list[EvalResult]) -> list[Cell]:
    """The cells with what the exports say of them, each task spec read once."""
    from softeval.analysis import cell_flags, cell_label

    flagged = cell_flags(results)
    specs: dict[tuple, TaskSpec | None] = {}
    cells = []
    for r in results:
        where = (r.data.get("task_spec"), r.config["task"], r.data.get("spec_sha256"))
        if where not in specs:
            specs[where] = task_spec(*where)
        cells.append(Cell(r, cell_label(r.config), model_id(r), knowledge_scoring(r, specs[where]), specs[where], flagged[id(r)]))
    return cells


def task_spec(path: str | None, task: str, sha256: str | None) -> TaskSpec | None:
    """The task spec a cell read, where it can still be read and still says the same (its sha256
    is the cell's); None otherwise: the exports then say only what the cell itself records."""
    from softeval.tasks import load_task

    for where in (path, task):
        if not where:
            continue
        try:
            spec = load_task(where)
        except (SoftevalError, OSError, ValueError):
            continue
        if spec.sha256() == sha256:
            return spec
    return None


def knowledge_scoring(result: EvalResult, spec: TaskSpec | None) -> str:
    """How a cell's knowledge metric was scored, in lm-eval's words where it has them."""
    multiple_choice = any(s.choices is not None or s.option_loglikelihoods is not None for s in result.samples)
    if not multiple_choice:
        return "lenient"  # open-ended: knowledge is the lenient parser's verdict
    if spec is None:
        return "loglikelihood"
    return "acc_norm" if spec.cloze_normalization == "characters" else "acc"


def model_id(result: EvalResult) -> str:
    """The model as `developer/name` where its hub id is known (the hub model, or the model an
    alias packages); else softeval's name of it (a local folder or file)."""
    spec = result.config["model"]
    hub = (result.identity.get("model") or {}).get("hub_id") or ALIAS_HUB_IDS.get(spec)
    if hub and "/" in hub:
        developer, _, name = hub.split("@")[0].partition("/")
        return f"{portable(developer)}/{portable(name.replace('/', '_'))}"
    return portable(model_name(spec))


def portable(name: str) -> str:
    """A name that is one portable path component (the datastore's rule for its folders)."""
    safe = _UNPORTABLE.sub("_", name).rstrip(". ") or "_"
    return "_" + safe if safe == "data" or safe.split(".", 1)[0].upper() in _WINDOWS_RESERVED else safe


def stderr(metric: Metric) -> float | str:
    """lm-eval's standard error from a 95% bootstrap interval: its half-width / 1.96; "N/A", as
    lm-eval writes it, where the interval is undefined."""
    if metric.ci_low is None or metric.ci_high is None:
        return "N/A"
    return round((metric.ci_high - metric.ci_low) / 2 / Z_95, 6)


def row_outcome(sample, metric: str) -> bool | None:
    """A row's outcome for a metric; None where the metric does not count the row (conditional
    accuracy counts the rows that kept the format)."""
    if metric == "conditional_accuracy":
        return sample.task_correct if sample.format_ok else None
    return getattr(sample, ROW_METRICS[metric])


def strings(details: dict) -> dict[str, str]:
    """`details` as the schema's string map: None left out, other values as JSON."""
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in details.items() if v is not None}


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# --- Every Eval Ever -----------------------------------------------------------------------------


def write_eee(cells: list[Cell], output: Path) -> list[Path]:
    """One aggregate log and its instance-level samples per cell, in the datastore's layout."""
    retrieved = str(int(time.time()))
    written = []
    for cell in cells:
        written += write_eee_cell(cell, output, retrieved)
    return written


def write_eee_cell(cell: Cell, output: Path, retrieved: str) -> list[Path]:
    developer, _, name = cell.model_id.rpartition("/")
    folder = PurePosixPath("data", portable(cell.task), developer or "local", name)
    # the same cell goes to the same file on every export: a cell evaluated again replaces its log
    file_uuid = str(uuid.UUID(bytes=hashlib.sha256(f"{folder}/{cell.model_folder}/{cell.label}".encode()).digest()[:16], version=4))
    evaluation_id = f"{cell.task}/{cell.model_id}/{cell.label}/{int(cell.created.timestamp())}"
    rows = eee_instances(cell, evaluation_id)
    text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    samples_path = output / folder / f"{file_uuid}_samples.jsonl"
    write_text_atomic(samples_path, text)
    log = eee_log(cell, evaluation_id, retrieved)
    log["detailed_evaluation_results"] = {
        "format": "jsonl",
        "file_path": str(folder / samples_path.name),
        "hash_algorithm": "sha256",
        "checksum": sha256_text(text),
        "total_rows": len(rows),
    }
    log_path = output / folder / f"{file_uuid}.json"
    write_json_atomic(log_path, log)
    return [log_path, samples_path]


def eee_log(cell: Cell, evaluation_id: str, retrieved: str) -> dict:
    """A cell's aggregate log: each defined metric an evaluation result with its interval."""
    r = cell.result
    undefined = [m for m in METRICS if r.metrics[m].value is None]
    versions = r.versions
    return {
        "schema_version": EEE_SCHEMA_VERSION,
        "evaluation_id": evaluation_id,
        "evaluation_timestamp": str(int(cell.created.timestamp())),
        "retrieved_timestamp": retrieved,
        "source_metadata": {
            "source_name": "softeval",
            "source_type": "evaluation_run",
            "source_organization_name": "unknown",  # softeval does not know who ran it: fill in before publishing
            "evaluator_relationship": "other",
            "additional_details": strings({
                "cell": f"{cell.model_folder}/{cell.task}/{cell.label}",
                # a metric with no value (conditional accuracy where no completion kept the format) has no result
                "undefined_metrics": ", ".join(undefined) or None,
            }),
        },
        "eval_library": {
            "name": "softeval",
            "version": versions.get("softeval") or "unknown",
            "additional_details": strings({
                "parsers": versions.get("parsers"),
                "python": versions.get("python"),
                "torch": versions.get("torch"),
                "transformers": versions.get("transformers"),
                "datasets": versions.get("datasets"),
                "engine": r.engine,
            }),
        },
        "model_info": eee_model_info(cell),
        "evaluation_results": [eee_result(cell, metric) for metric in METRICS if metric not in undefined],
    }


def eee_model_info(cell: Cell) -> dict:
    r = cell.result
    model, identity = r.model, r.identity.get("model") or {}
    developer, _, _ = cell.model_id.rpartition("/")
    return {
        "name": cell.model_folder,
        "id": cell.model_id,
        "developer": developer or "local",
        "inference_engine": {"name": "softeval", "version": r.versions.get("softeval") or "unknown"},
        "additional_details": strings({
            "deployment_type": "self_deployed",  # softeval runs the weights itself
            "model_availability": "open_weights" if developer else "unknown",  # a hub model's weights are published; a local folder's may not be
            "spec": r.config["model"],
            "post_trained": r.config.get("post_trained"),
            "role": r.config.get("role"),
            "model_type": model.get("model_type"),
            "n_parameters": model.get("n_parameters"),
            "dtype": model.get("dtype"),
            "config_sha256": model.get("config_sha256"),
            "gguf_sha256": identity.get("gguf_sha256"),
            "revision": identity.get("revision"),
            "commit": identity.get("commit"),
        }),
    }


def eee_result(cell: Cell, metric: str) -> dict:
    r = cell.result
    value = r.metrics[metric]
    uncertainty = {"num_samples": len(r.samples), "num_bootstrap_samples": BOOTSTRAP_RESAMPLES}
    if value.ci_low is not None and value.ci_high is not None:
        uncertainty["confidence_interval"] = {
            "lower": value.ci_low, "upper": value.ci_high, "confidence_level": CONFIDENCE_LEVEL, "method": CI_METHOD,
        }
    return {
        "evaluation_result_id": metric,
        "evaluation_name": cell.task,
        "source_data": eee_source_data(cell),
        "evaluation_timestamp": str(int(cell.created.timestamp())),
        "metric_config": {
            "evaluation_description": MEANINGS[metric],
            "metric_id": f"softeval.{metric}",  # softeval's own metrics: a namespaced id, not a global one
            "metric_name": metric,
            "metric_kind": "pass_rate" if metric == "format_following" else "accuracy",
            "metric_unit": "proportion",
            "metric_parameters": metric_parameters(cell, metric),
            "lower_is_better": False,
            "score_type": "continuous",
            "min_score": 0.0,
            "max_score": 1.0,
            "additional_details": {"lm_eval_key": f"{metric},{cell.filter_of(metric)}"},
        },
        "score_details": {
            "score": value.value,
            "uncertainty": uncertainty,
            "details": strings({"flags": cell.flags or None, "n_truncated_prompts": r.n_truncated or None}),
        },
        "generation_config": eee_generation(cell),
    }


def metric_parameters(cell: Cell, metric: str) -> dict:
    """What sets a metric apart from its neighbours: the parser it reads, or how knowledge was scored."""
    if metric == "knowledge":
        return KNOWLEDGE_SCORING[cell.knowledge]
    parameters = {"parser": METRIC_FILTERS[metric]}
    if metric == "conditional_accuracy":
        parameters["given"] = "format_following"  # the share correct among the rows that kept the format
    return parameters


def eee_source_data(cell: Cell) -> dict:
    """The evaluation data: the hub dataset where the task reads one, else the file the cell read."""
    data, spec = cell.result.data, cell.spec
    details = strings({"split": data.get("split"), "rows": data.get("rows"), "filtered_out": data.get("filtered_out"),
                       "source": data.get("source"), "sha256": data.get("sha256"), "task_spec_sha256": data.get("spec_sha256")})
    if spec is not None and spec.dataset.data_files is None:
        ds = spec.dataset
        hub = {"dataset_name": cell.task, "source_type": "hf_dataset", "hf_repo": ds.path, "hf_split": ds.eval_split}
        return hub | {"samples_number": len(cell.result.samples), "additional_details": details | strings({"hf_config": ds.config})}
    return {"dataset_name": cell.task, "source_type": "other", "additional_details": details}


def eee_generation(cell: Cell) -> dict:
    """Greedy decoding with the cell's settings; the method, and the soft prompt or adapter it
    evaluates by sha256, in the details."""
    config, spec = cell.result.config, cell.spec
    arguments = {"temperature": 0.0, "max_tokens": config["max_new_tokens"]}
    if spec is not None:
        arguments["prompt_template"] = spec.template
    return {"generation_args": arguments, "additional_details": strings(method_details(cell) | {"stop": config.get("stop")})}


def method_details(cell: Cell) -> dict:
    """The method a cell evaluates and all that identifies it: demonstrations, chat mode, the tuned
    soft prompt or LoRA adapter (sha256, path) and its tuning record."""
    config = cell.result.config
    soft_prompt, adapter = config.get("soft_prompt") or {}, config.get("adapter") or {}
    return {
        "method": config["method"],
        "chat": config.get("chat", False),
        "num_fewshot": config.get("k", 0),
        "decoding": "greedy",
        "seed": config.get("seed"),
        "limit": config.get("limit"),
        "soft_prompt_sha256": soft_prompt.get("sha256"),
        "soft_prompt_length": soft_prompt.get("length"),
        "soft_prompt_path": soft_prompt.get("path"),
        "adapter_sha256": adapter.get("sha256"),
        "adapter_path": adapter.get("path"),
        "tuning": cell.result.tuning,
        "max_answer_words": config.get("max_answer_words"),
    }


def eee_instances(cell: Cell, evaluation_id: str) -> list[dict]:
    """Each row once per result it counts in, as the schema asks (conditional accuracy counts the
    rows that kept the format): its score is the row's outcome for that metric."""
    defined = [m for m in METRICS if cell.result.metrics[m].value is not None]
    rows = []
    for sample in cell.result.samples:
        for metric in defined:
            outcome = row_outcome(sample, metric)
            if outcome is not None:
                rows.append(eee_instance(cell, evaluation_id, sample, metric, outcome))
    return rows


def eee_instance(cell: Cell, evaluation_id: str, sample, metric: str, outcome: bool) -> dict:
    """One row's record for one metric: the prompt as the model saw it, the gold answer, the
    completion the parsers judged, the answer the metric read, and the whole judgement."""
    reference = [sample.gold]
    given = {"raw": sample.prompt, "formatted": sample.prompt, "reference": reference}
    if sample.choices is not None:
        given["choices"] = sample.choices
    return {
        "schema_version": EEE_SCHEMA_VERSION,
        "evaluation_id": evaluation_id,
        "model_id": cell.model_id,
        "evaluation_name": cell.task,
        "evaluation_result_id": metric,
        "sample_id": str(sample.index),
        # the every-eval-ever recipe, so that hashes match across tools
        "sample_hash": sha256_text(json.dumps({"raw": sample.prompt, "reference": reference}, sort_keys=True, separators=(",", ":"))),
        "interaction_type": "single_turn",
        "input": given,
        "output": {"raw": [sample.completion]},
        "answer_attribution": [attribution(cell, sample, metric)],
        "evaluation": {"score": float(outcome), "is_correct": bool(outcome)},
        "metadata": strings(sample.model_dump(exclude={"index", "prompt", "completion", "gold", "choices"})),
    }


def attribution(cell: Cell, sample, metric: str) -> dict:
    """The answer a metric judged: the strict or lenient parser's reading of the completion, or
    for knowledge of a multiple-choice task the option the log-likelihoods pick."""
    if metric == "knowledge" and cell.knowledge != "lenient":
        value, method, source = sample.knowledge_answer, f"option_loglikelihood:{cell.knowledge}", "metadata.option_loglikelihoods"
    elif metric in ("lenient_accuracy", "knowledge"):
        value, method, source = sample.lenient_answer, "softeval.lenient_parser", "output.raw"
    else:
        value, method, source = sample.strict_answer, "softeval.strict_parser", "output.raw"
    return {"turn_idx": 0, "source": source, "extracted_value": value or "", "extraction_method": method, "is_terminal": True}


# --- lm-evaluation-harness -----------------------------------------------------------------------


def write_lm_eval(cells: list[Cell], output: Path) -> list[Path]:
    """Per model, method and chat mode: a results file of its tasks and a samples file per task."""
    groups: dict[tuple[str, str], list[Cell]] = {}
    for cell in cells:
        groups.setdefault((cell.model_folder, cell.label), []).append(cell)
    written = []
    for (model, label), group in groups.items():
        name = f"{model}:{label}"  # the method in the model's name: lm-eval files results by model
        folder = output / sanitize_model_name(name)
        # lm-eval's time stamp, from the group's last evaluation: the same cells give the same files
        stamp = max(c.created for c in group).replace(tzinfo=None).isoformat().replace(":", "-")
        samples = {cell.task: lm_eval_samples(cell) for cell in group}
        for task, lines in samples.items():
            path = folder / f"samples_{task}_{stamp}.jsonl"
            write_text_atomic(path, "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines))
            written.append(path)
        path = folder / f"results_{stamp}.json"
        write_json_atomic(path, lm_eval_results(group, name, samples))
        written.append(path)
    return written


def sanitize_model_name(name: str) -> str:
    """lm-eval's folder name for a model (lm_eval.utils.sanitize_model_name)."""
    return re.sub(r"[\"<>:/|\\?*\[\]]+", "__", name)


def lm_eval_results(group: list[Cell], name: str, samples: dict[str, list[dict]]) -> dict:
    """A results file of one model, method and chat mode: the run-wide settings where its tasks'
    cells agree on them, each task's own (its soft prompt or adapter, say) in its config."""
    first = group[0].result

    def shared(key: str):
        return common(c.result.config.get(key) for c in group)

    return {
        "results": {c.task: lm_eval_task_results(c) for c in group},
        "group_subtasks": {c.task: [] for c in group},
        "configs": {c.task: lm_eval_task_config(c) for c in group},
        "versions": {c.task: (c.result.data.get("spec_sha256") or "")[:12] or None for c in group},
        "n-shot": {c.task: c.result.config.get("k", 0) for c in group},
        "higher_is_better": {c.task: {m: True for m in METRICS} for c in group},
        "n-samples": {c.task: {"original": c.result.data.get("rows", len(c.result.samples)), "effective": len(c.result.samples)} for c in group},
        "config": {
            "model": "softeval",
            "model_args": {"pretrained": first.config["model"], "method": first.config["method"], "chat": bool(first.config.get("chat"))},
            "model_num_parameters": first.model.get("n_parameters"),
            "model_dtype": first.model.get("dtype"),
            "model_revision": (first.identity.get("model") or {}).get("revision"),
            "model_sha": first.model.get("config_sha256"),
            "batch_size": shared("batch_size"),
            "device": common((c.result.engine or {}).get("device") for c in group),
            "limit": shared("limit"),
            "bootstrap_iters": BOOTSTRAP_RESAMPLES,
            "gen_kwargs": None,
            "random_seed": shared("seed"),
            "numpy_seed": shared("seed"),
            "torch_seed": shared("seed"),
            "fewshot_seed": shared("seed"),
        },
        "git_hash": None,
        "date": min(c.created for c in group).timestamp(),
        "transformers_version": first.versions.get("transformers"),
        "softeval": lm_eval_softeval_block(group),
        "task_hashes": {task: sha256_text("".join(s["doc_hash"] + s["prompt_hash"] + s["target_hash"] for s in lines)) for task, lines in samples.items()},
        "model_source": "softeval",
        "model_name": name,
        "model_name_sanitized": sanitize_model_name(name),
        "system_instruction": None,
        "system_instruction_sha": None,
        "fewshot_as_multiturn": False,
        "chat_template": None,
        "chat_template_sha": None,
        "total_evaluation_time_seconds": str(round(sum(c.result.timings.get("total", 0.0) for c in group), 3)),
    }


def lm_eval_task_results(cell: Cell) -> dict:
    """`metric,filter` and `metric_stderr,filter` of each metric (null where undefined)."""
    entry = {"alias": cell.task}
    for metric in METRICS:
        value, key = cell.result.metrics[metric], cell.filter_of(metric)
        entry[f"{metric},{key}"] = value.value
        entry[f"{metric}_stderr,{key}"] = stderr(value)
    return entry


def lm_eval_task_config(cell: Cell) -> dict:
    config, data, spec = cell.result.config, cell.result.data, cell.spec
    task_config = {"task": cell.task, "test_split": config.get("eval_split") or data.get("split")}
    if spec is not None:
        ds = spec.dataset
        task_config |= {"dataset_path": ds.path, "dataset_name": ds.config, "doc_to_text": spec.template, "description": spec.instruction or None}
    return task_config | {
        "output_type": "generate_until",
        "generation_kwargs": {"until": config.get("stop"), "max_gen_toks": config["max_new_tokens"], "do_sample": False, "temperature": 0.0},
        "num_fewshot": config.get("k", 0),
        # no aggregation named: the values are softeval's, not lm-eval's mean with its standard error
        "metric_list": [{"metric": m, "higher_is_better": True} for m in METRICS],
        "metadata": lm_eval_task_metadata(cell),
    }


def lm_eval_task_metadata(cell: Cell) -> dict:
    """The task's data, and the method as this task's cell ran it: its soft prompt or LoRA adapter
    (`peft`, as lm-eval's model_args name an adapter) is the task's own."""
    data, details = cell.result.data, method_details(cell)
    shown = {"spec_sha256": data.get("spec_sha256"), "data_sha256": data.get("sha256"), "data_source": data.get("source"), "peft": details["adapter_path"]}
    return {k: v for k, v in (shown | details).items() if v is not None}


def common(values):
    """The one value all of `values` share; None where they differ."""
    distinct = list(dict.fromkeys(json.dumps(v, sort_keys=True) for v in values))
    return json.loads(distinct[0]) if len(distinct) == 1 else None


def lm_eval_softeval_block(group: list[Cell]) -> dict:
    """What lm-eval's format has no place for: each metric's exact interval, and the flags."""
    return {
        "version": group[0].result.versions.get("softeval"),
        "stderr": f"half-width of the {CONFIDENCE_LEVEL:.0%} interval / {Z_95}",
        "confidence_level": CONFIDENCE_LEVEL,
        "ci_method": CI_METHOD,
        "num_bootstrap_samples": BOOTSTRAP_RESAMPLES,
        "intervals": {
            c.task: {f"{m},{c.filter_of(m)}": c.result.metrics[m].model_dump() for m in METRICS} for c in group
        },
        "flags": {c.task: c.flags for c in group},
    }


def lm_eval_samples(cell: Cell) -> list[dict]:
    """Per row and filter one line, as lm-eval logs samples: the strict reading with format and
    task accuracy (and conditional accuracy where the format was kept), the lenient one, and for
    multiple choice the option log-likelihoods' pick with knowledge."""
    config = cell.result.config
    until = {"until": config.get("stop"), "max_gen_toks": config["max_new_tokens"], "do_sample": False, "temperature": 0.0}
    lines = []
    for sample in cell.result.samples:
        doc = {"index": sample.index, "source": sample.source, "gold": sample.gold, "choices": sample.choices}
        shared = {
            "doc_id": sample.index,
            "doc": doc,
            "target": sample.gold,
            "arguments": {"gen_args_0": {"arg_0": sample.prompt, "arg_1": until}},
            "resps": [[sample.raw_completion]],
        }
        hashes = {
            "doc_hash": sha256_text(json.dumps(doc, indent=2, ensure_ascii=False)),  # as lm-eval hashes its documents
            "prompt_hash": sha256_text(sample.prompt),
            "target_hash": sha256_text(sample.gold),
        }
        judgement = sample.model_dump(exclude={"index", "source", "prompt", "gold", "choices", "raw_completion"})
        for key, metrics, answer in sample_filters(cell, sample):
            outcomes = {m: float(row_outcome(sample, m)) for m in metrics if row_outcome(sample, m) is not None}
            lines.append(shared | {"filtered_resps": [answer if answer is not None else "[invalid]"], "filter": key,
                                   "metrics": list(outcomes)} | hashes | outcomes | {"softeval": judgement})
    return lines


def sample_filters(cell: Cell, sample) -> list[tuple[str, list[str], str | None]]:
    """(filter, its metrics, the answer it read) for one row."""
    strict = ["format_following", "task_accuracy", "conditional_accuracy"]
    if cell.knowledge == "lenient":
        return [("strict", strict, sample.strict_answer), ("lenient", ["lenient_accuracy", "knowledge"], sample.lenient_answer)]
    return [("strict", strict, sample.strict_answer), ("lenient", ["lenient_accuracy"], sample.lenient_answer),
            (cell.knowledge, ["knowledge"], sample.knowledge_answer)]
