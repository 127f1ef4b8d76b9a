"""Every Eval Ever (schema 0.3.0): one aggregate log per cell, in the datastore's layout
`data/<task>/<developer>/<model>/<uuid>.json`, with its instance-level `<uuid>_samples.jsonl`;
every metric is an evaluation result of its own, with its bootstrap interval.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from pathlib import Path, PurePosixPath

from softeval._io import write_json_atomic, write_text_atomic
from softeval.reports.export_cells import (
    BOOTSTRAP_RESAMPLES,
    CI_METHOD,
    CONFIDENCE_LEVEL,
    GOLD_KEYS,
    KNOWLEDGE_SCORING,
    METRIC_FILTERS,
    Cell,
    method_details,
    portable,
    row_outcome,
    samples_held,
    sha256_text,
    strings,
)
from softeval.scoring import GOLD_MEANINGS, GOLD_METRICS, LOWER_IS_BETTER, MEANINGS, METRICS

EEE_SCHEMA_VERSION = "0.3.0"


def write_eee(cells: list[Cell], output: Path) -> list[Path]:
    """One aggregate log and its instance-level samples per cell, in the datastore's layout."""
    retrieved = str(int(time.time()))
    written = []
    for cell in cells:
        with samples_held(cell.result):  # read once, gone through per metric, let go before the next cell
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
        "evaluation_results": [eee_result(cell, metric) for metric in METRICS if metric not in undefined]
        + [eee_gold_result(cell, metric) for metric in cell.gold_metrics],
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
            "weights_sha256": identity.get("weights_sha256"),
            **cell.checkpoint,
            "revision": identity.get("revision"),
            "commit": identity.get("commit"),
        }),
    }


def eee_result(cell: Cell, metric: str) -> dict:
    r = cell.result
    value = r.metrics[metric]
    counted = sum(row_outcome(sample, metric) is not None for sample in r.samples)  # conditional accuracy: the rows that kept the format
    uncertainty = {"num_samples": counted, "num_bootstrap_samples": BOOTSTRAP_RESAMPLES}
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


def eee_gold_result(cell: Cell, metric: str) -> dict:
    """A continuous metric (the gold answer's likelihood) as an evaluation result: a mean over
    rows with its bootstrap interval; each row's value is in its instance's metadata."""
    result = eee_result(cell, "task_accuracy")  # the shared parts: source data, generation, uncertainty's shape
    value = cell.result.metrics[metric]
    uncertainty = {"num_samples": len(cell.result.samples), "num_bootstrap_samples": BOOTSTRAP_RESAMPLES}
    if value.ci_low is not None and value.ci_high is not None:
        uncertainty["confidence_interval"] = {"lower": value.ci_low, "upper": value.ci_high, "confidence_level": CONFIDENCE_LEVEL, "method": CI_METHOD}
    bounded = metric in ("gold_prob", "cloze_gold_prob", "prompt_knowledge")
    result["evaluation_result_id"] = metric
    result["metric_config"] = {
        "evaluation_description": GOLD_MEANINGS[metric],
        "metric_id": f"softeval.{metric}",
        "metric_name": metric,
        "metric_kind": "accuracy" if metric == "prompt_knowledge" else "likelihood",
        "metric_unit": "proportion" if bounded else "bits_per_byte" if metric in LOWER_IS_BETTER else "nats",
        "metric_parameters": {"context": GOLD_KEYS[metric].split(",")[1], "aggregation": "mean over rows"},
        "lower_is_better": metric in LOWER_IS_BETTER,
        "score_type": "continuous",
        "min_score": 0.0 if bounded or metric in LOWER_IS_BETTER else "-Infinity",
        "max_score": 1.0 if bounded else "Infinity" if metric in LOWER_IS_BETTER else 0.0,
        "additional_details": {"lm_eval_key": GOLD_KEYS[metric]},
    }
    result["score_details"] = result["score_details"] | {"score": value.value, "uncertainty": uncertainty}
    return result


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
        arguments["prompt_template"] = cell.prompt_template
    details = method_details(cell) | {"stop": config.get("stop")} | cell.checkpoint
    return {"generation_args": arguments, "additional_details": strings(details)}


def eee_instances(cell: Cell, evaluation_id: str) -> list[dict]:
    """Each row once per result it counts in, as the schema asks (conditional accuracy counts the
    rows that kept the format): its score is the row's outcome for that metric."""
    defined = [m for m in METRICS if cell.result.metrics[m].value is not None]
    rows = []
    for sample in cell.result.samples:
        shared = row_record(sample)  # the same in each of the row's records
        for metric in defined:
            outcome = row_outcome(sample, metric)
            if outcome is not None:
                rows.append(eee_instance(cell, evaluation_id, sample, metric, outcome, shared))
        for metric in cell.gold_metrics:
            value = getattr(sample, GOLD_METRICS[metric])
            # a likelihood has no verdict of its own: whether the row's answer is right stays the strict one
            row = eee_instance(cell, evaluation_id, sample, metric, value if metric == "prompt_knowledge" else sample.task_correct, shared)
            row["evaluation"]["score"] = float(value)
            rows.append(row)
    return rows


def row_record(sample) -> dict:
    """What every record of one row holds, whichever metric it is for: the input given, the
    row's hash (the every-eval-ever recipe, so that hashes match across tools) and its judgement
    as metadata."""
    reference = [sample.gold]
    given = {"raw": sample.prompt, "formatted": sample.prompt, "reference": reference}
    if sample.choices is not None:
        given["choices"] = sample.choices
    return {"input": given, "sample_hash": sha256_text(json.dumps({"raw": sample.prompt, "reference": reference}, sort_keys=True, separators=(",", ":"))),
            "metadata": strings(sample.model_dump(exclude={"index", "prompt", "completion", "gold", "choices"}))}


def eee_instance(cell: Cell, evaluation_id: str, sample, metric: str, outcome: bool, shared: dict | None = None) -> dict:
    """One row's record for one metric: the prompt as the model saw it, the gold answer, the
    completion the parsers judged, the answer the metric read, and the whole judgement (`shared`:
    the row's `row_record`, made once for its records)."""
    shared = shared or row_record(sample)
    return {
        "schema_version": EEE_SCHEMA_VERSION,
        "evaluation_id": evaluation_id,
        "model_id": cell.model_id,
        "evaluation_name": cell.task,
        "evaluation_result_id": metric,
        "sample_id": str(sample.index),
        "sample_hash": shared["sample_hash"],
        "interaction_type": "single_turn",
        "input": shared["input"],
        "output": {"raw": [sample.completion]},
        "answer_attribution": [attribution(cell, sample, metric)],
        "evaluation": {"score": float(outcome), "is_correct": bool(outcome)},
        "metadata": shared["metadata"],
    }


def attribution(cell: Cell, sample, metric: str) -> dict:
    """The answer a metric judged: the strict or lenient parser's reading of the completion, or
    for knowledge of a multiple-choice task the option the log-likelihoods pick."""
    if metric in GOLD_METRICS:
        value, method, source = sample.gold, f"teacher_forced_gold_likelihood:{GOLD_KEYS[metric].split(',')[1]}", "metadata"
    elif metric == "knowledge" and cell.knowledge != "lenient":
        value, method, source = sample.knowledge_answer, f"option_loglikelihood:{cell.knowledge}", "metadata.option_loglikelihoods"
    elif metric in ("lenient_accuracy", "knowledge"):
        value, method, source = sample.lenient_answer, "softeval.lenient_parser", "output.raw"
    else:
        value, method, source = sample.strict_answer, "softeval.strict_parser", "output.raw"
    return {"turn_idx": 0, "source": source, "extracted_value": value or "", "extraction_method": method, "is_terminal": True}


