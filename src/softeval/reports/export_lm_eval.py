"""lm-evaluation-harness 0.4's files: per model, method and chat mode, `results_<time>.json` with
that group's tasks and a `samples_<task>_<time>.jsonl` per task, under lm-eval's metric names
(`metric,filter`; see `export.py`), `_stderr` from the bootstrap interval.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from softeval._io import write_json_atomic, write_text_atomic
from softeval.reports.export_cells import (
    BOOTSTRAP_RESAMPLES,
    CI_METHOD,
    CONFIDENCE_LEVEL,
    GOLD_KEYS,
    Z_95,
    Cell,
    method_details,
    row_outcome,
    sha256_text,
    stderr,
)
from softeval.scoring import LOWER_IS_BETTER, METRICS


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
        "higher_is_better": {c.task: {m: True for m in METRICS} | {GOLD_KEYS[m].split(",")[0]: m not in LOWER_IS_BETTER for m in c.gold_metrics}
                             for c in group},
        "n-samples": {c.task: {"original": c.result.data.get("rows", len(c.result.samples)), "effective": len(c.result.samples)} for c in group},
        "config": {
            "model": "softeval",
            "model_args": {"pretrained": first.config["model"], "method": first.config["method"], "chat": bool(first.config.get("chat")),
                           **group[0].checkpoint},
            "model_num_parameters": first.model.get("n_parameters"),
            "model_dtype": first.model.get("dtype"),
            "model_revision": (first.identity.get("model") or {}).get("revision"),
            "model_sha": (first.identity.get("model") or {}).get("commit"),  # the hub commit, as lm-eval records it (None for local models)
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
    for metric in cell.gold_metrics:  # the gold answer's likelihood, by lm-eval's name where it has one
        name, context = GOLD_KEYS[metric].split(",")
        entry[GOLD_KEYS[metric]] = cell.result.metrics[metric].value
        entry[f"{name}_stderr,{context}"] = stderr(cell.result.metrics[metric])
    return entry


def lm_eval_task_config(cell: Cell) -> dict:
    config, data, spec = cell.result.config, cell.result.data, cell.spec
    task_config = {"task": cell.task, "test_split": config.get("eval_split") or data.get("split")}
    if spec is not None:
        ds = spec.dataset
        task_config |= {"dataset_path": ds.path, "dataset_name": ds.config, "doc_to_text": cell.prompt_template, "description": spec.instruction or None}
    return task_config | {
        "output_type": "generate_until",
        "generation_kwargs": {"until": config.get("stop"), "max_gen_toks": config["max_new_tokens"], "do_sample": False, "temperature": 0.0},
        "num_fewshot": config.get("k", 0),
        # no aggregation named: the values are softeval's, not lm-eval's mean with its standard error
        "metric_list": [{"metric": m, "higher_is_better": True} for m in METRICS]
        + [{"metric": GOLD_KEYS[m].split(",")[0], "higher_is_better": m not in LOWER_IS_BETTER} for m in cell.gold_metrics],
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
            c.task: {f"{m},{c.filter_of(m)}": c.result.metrics[m].model_dump() for m in METRICS}
            | {GOLD_KEYS[m]: c.result.metrics[m].model_dump() for m in c.gold_metrics} for c in group
        },
        "flags": {c.task: c.flags for c in group},
        "series": group[0].checkpoint or None,  # a checkpoint's recipe, checkpoint, step and tokens
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
