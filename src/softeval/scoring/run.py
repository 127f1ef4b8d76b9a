"""Running an engine over examples and scoring what it produced:

    examples -> prompts -> engine (generate, loglikelihood) -> answer format -> samples -> metrics

shared by a cell's evaluation (`softeval.study.evaluation`) and the tuner's validation.
"""

from __future__ import annotations

import functools
import hashlib
import platform
import time
from importlib.metadata import version
from pathlib import Path

from softeval.engine import Engine, ReferenceEngine
from softeval.formats import Example
from softeval.progress import Bars
from softeval.scoring.likelihood import CLOZE_BYTES, gold_aggregate, gold_fields
from softeval.scoring.metrics import INTERVALS, Diagnostics, Metric, Sample, aggregate, diagnose, score_sample
from softeval.tasks import PromptBuilder, TaskSpec


def scores(
    spec: TaskSpec, examples: list[Example], samples: list[Sample], seed: int, *, chat_template_unused: bool = False, tuned_on_eval_rows: bool = False
) -> tuple[dict[str, Metric], Diagnostics]:
    """A cell's metrics with their intervals, and the diagnostics that say when they mean little
    (with what the cell's samples cannot tell: that the model's chat template went unused, that
    what it evaluates was tuned on its rows)."""
    metrics = aggregate(samples, seed=seed)
    metrics |= gold_aggregate(samples, seed=seed)
    answer_format = spec.format
    chance = sum(answer_format.chance(e) for e in examples) / len(examples) if answer_format.has_options else None
    diagnostics = diagnose(samples, metrics["task_accuracy"], chance, answer_last=answer_format.answer_last)
    diagnostics.chat_template_unused, diagnostics.tuned_on_eval_rows = chat_template_unused, tuned_on_eval_rows
    return metrics, diagnostics


def run_examples(
    spec: TaskSpec, examples: list[Example], builder: PromptBuilder, engine: Engine | ReferenceEngine, bars: Bars, label: str,
    *, gold: bool = True,
) -> tuple[list[Sample], dict[str, float]]:
    """Generate and score every example; returns the sample records and the time each stage took.
    `gold`: also score the gold answer after each prompt (the continuous metrics, see
    `likelihood`), one teacher-forced pass per row on the engine's option-scoring path."""
    tick = time.perf_counter()
    prompts = [builder.generation(ex) for ex in examples]
    requests = [builder.cloze_requests(ex) for ex in examples] if spec.is_multiple_choice else None
    timings = {"prepare": time.perf_counter() - tick}
    tick = time.perf_counter()
    advance = bars.row(f"{label}: generate", len(prompts))
    completions = engine.generate([p.ids for p in prompts], spec.stop, spec.max_new_tokens, advance)
    timings["generate"] = time.perf_counter() - tick
    loglikelihoods = None
    if requests is not None:
        tick = time.perf_counter()
        flat = [cloze for per_example in requests for cloze in per_example]
        scores = engine.loglikelihood(flat, bars.row(f"{label}: score options", len(flat)))
        # back to one list of option scores per example: partial scoring sends one request per option
        loglikelihoods, start = [], 0
        for per_example in requests:
            loglikelihoods.append([x for request in scores[start : start + len(per_example)] for x in request])
            start += len(per_example)
        timings["loglikelihood"] = time.perf_counter() - tick
    answers = _gold_loglikelihoods(examples, prompts, builder, engine, bars, label, timings) if gold else [None] * len(examples)

    answer_format = spec.format
    samples = []
    for i, (example, prompt, completion) in enumerate(zip(examples, prompts, completions)):
        judgement = score_sample(answer_format, example, completion.text, loglikelihoods[i] if loglikelihoods else None,
                                 cut=completion.stop_reason == "length", raw=completion.raw)
        sample = Sample(
            index=example.index,
            source=example.source,
            prompt=prompt.text,
            n_demos=prompt.n_demos,
            truncated=prompt.truncated or bool(requests and any(c.truncated for c in requests[i])),
            raw_completion=completion.raw,
            completion=completion.text,
            stop_reason=completion.stop_reason,
            gold=example.answer,
            choices=example.choices,
            **judgement.model_dump(),
            **gold_fields(example, *(answers[i] or (None, None)), loglikelihoods[i] if loglikelihoods else None,
                          [text for cloze in requests[i] for text in cloze.continuation_texts] if requests else None),
        )
        samples.append(sample)
    return samples, timings


def _gold_loglikelihoods(examples: list[Example], prompts: list, builder: PromptBuilder, engine: Engine | ReferenceEngine,
                         bars: Bars, label: str, timings: dict) -> list[tuple[list[float], list[str]] | None]:
    """Per example, the log-likelihood of each answer text after its generation prompt with the
    texts (see `PromptBuilder.answer_request`), or None where the answers cannot be scored."""
    tick = time.perf_counter()
    room = builder.lm.context_length - engine.n_soft
    requests = [builder.answer_request(example, prompt, room) for example, prompt in zip(examples, prompts)]
    asked = [r for r in requests if r is not None]
    scores = iter(engine.loglikelihood([cloze for cloze, _ in asked], bars.row(f"{label}: score gold answers", len(asked))))
    timings["gold"] = time.perf_counter() - tick
    return [None if r is None else (next(scores), r[1]) for r in requests]


def package_versions() -> dict:
    return dict(_package_versions())


@functools.cache  # read once per process: what runs is what was imported, whatever is installed later
def _package_versions() -> dict:
    names = ("softeval", "torch", "transformers", "datasets")
    return {"python": platform.python_version(), **{n: version(n) for n in names}, "parsers": parsers_version(), "cloze_bytes": CLOZE_BYTES,
            "intervals": INTERVALS}


@functools.cache
def parsers_version() -> str:
    """A hash of the code that judges completions (the `formats` package and `scoring/metrics.py`):
    the package's version number does not change with every fix of a parser, this does."""
    from softeval import formats
    from softeval.scoring import metrics

    digest = hashlib.sha256()
    for path in [*sorted(Path(formats.__file__).parent.glob("*.py")), Path(metrics.__file__)]:
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]
