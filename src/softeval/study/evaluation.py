"""One evaluation cell: a model, a task and a method, from examples to metrics and sample logs.

    spec -> examples -> prompts -> engine (generate, loglikelihood) -> answer format -> metrics -> files
"""

from __future__ import annotations

import logging
import time
from contextlib import nullcontext
from pathlib import Path

import torch

from softeval.engine import start_engine
from softeval.errors import SoftevalError
from softeval.models import LoadedModel
from softeval.progress import progress_bars
from softeval.scoring import CLOZE_BYTES, INTERVALS, EvalResult, package_versions, parsers_version, run_examples, score_sample, scores
from softeval.tasks import PromptBuilder, TaskSpec, choose_demos, cloze_context_ends_in_space, data_identity, load_examples, with_answer_words
from softeval.tuning import METHODS, identity_keys, Adapter, Method, SoftPrompt, check_made_for, lora_applied

log = logging.getLogger("softeval")


def evaluate(
    lm: LoadedModel,
    spec: TaskSpec,
    method: Method = "zero-shot",
    *,
    chat: bool = False,
    k: int = 5,
    soft_prompt: SoftPrompt | torch.Tensor | None = None,
    adapter: Adapter | None = None,
    limit: int | None = None,
    seed: int = 0,
    data_dir: str | Path | None = None,
    batch_size: int | None = None,  # the most rows of a batch; None: the engine's budgets decide
    role: str | None = None,  # "base" or "post-trained", as a study declares the model
    chat_too: bool = False,  # the command evaluates this model's chat-template cell as well
    progress: bool = True,
) -> EvalResult:
    """Evaluate one (model, task, method) cell generatively, plus cloze loglikelihoods for
    multiple-choice knowledge. `soft-prompt` needs a tuned prompt in `soft_prompt`: a `SoftPrompt`
    (checked against the model, task and chat mode) or bare vectors (recorded by their hash);
    `lora` needs a tuned `adapter`, applied for this cell only."""
    if method not in METHODS:
        raise SoftevalError(f"unknown method '{method}'; choose one of: {', '.join(METHODS)}")
    if (method == "lora") != (adapter is not None):
        raise SoftevalError("the lora method needs a tuned LoRA adapter, and only it takes one")
    if chat and not lm.post_trained:
        raise SoftevalError(f"model {lm.name} has no chat template; drop --chat")
    if batch_size is not None and batch_size < 1:
        raise SoftevalError(f"batch size {batch_size}: use a batch size of at least 1")
    if k < 0:
        raise SoftevalError(f"k {k}: use k of at least 0 demonstrations")
    if (method == "soft-prompt") != (soft_prompt is not None):
        raise SoftevalError("the soft-prompt method needs a tuned prompt (--prompt PATH), and only it takes one")
    if isinstance(soft_prompt, torch.Tensor):
        soft_prompt = SoftPrompt(soft_prompt, {})  # bare vectors: no provenance to check
        soft_prompt.check_shape(lm)
    elif soft_prompt is not None:
        soft_prompt.check(lm, spec, chat)
    if adapter is not None:
        check_made_for(f"LoRA adapter {adapter.path}", adapter.metadata, lm, spec, chat)
    vectors = None if soft_prompt is None else soft_prompt.vectors
    started = time.perf_counter()
    spec = with_answer_words(spec, data_dir)
    examples = load_examples(spec, spec.dataset.eval_split, data_dir, limit=limit, seed=seed)
    eval_data = data_identity(spec, spec.dataset.eval_split, data_dir)
    shots = k if method == "few-shot" else 0
    demos = choose_demos(spec, load_examples(spec, spec.dataset.fewshot_split, data_dir), shots, seed) if shots else []
    picked = demos[:shots]  # (a row among them is shown the spare demonstration instead)
    answers = {d.answer for d in picked}
    if len(picked) > 1 and spec.format.has_options and len(answers) == 1:
        log.warning("the %d demonstrations of %s all answer %s: few-shot answers may copy that letter (watch the collapse flag, or try another --seed)",
                    len(picked), spec.name, answers.pop())
    n_soft = 0 if vectors is None else vectors.shape[0]
    builder = PromptBuilder(spec, lm, demos=demos, k=shots, chat=chat, reserve=spec.max_new_tokens + n_soft)
    applied = lora_applied(lm, adapter.peft_config(), adapter.weights) if adapter else nullcontext()
    with applied, progress_bars(progress) as bars:
        engine = start_engine(lm, batch_size=batch_size, soft_prompt=vectors)
        samples, timings = run_examples(spec, examples, builder, engine, bars, f"{lm.name} {spec.name} {method}")
    n_truncated = sum(s.truncated for s in samples)
    if n_truncated:
        log.warning("%d of %d prompts were longer than the context and were shortened", n_truncated, len(samples))
    timings["total"] = time.perf_counter() - started
    facts = model_facts(lm, role)
    config = {
        "model": lm.identity["spec"],
        **facts,
        "task": spec.name,
        "method": method,
        "chat": chat,
        "k": shots,
        "soft_prompt_length": n_soft,
        "soft_prompt": None if soft_prompt is None else soft_prompt.identity(),
        "adapter": None if adapter is None else adapter.identity(),
        "limit": effective_limit(limit, eval_data),
        "seed": seed,
        "batch_size": batch_size,
        "eval_split": spec.dataset.eval_split,
        "max_new_tokens": spec.max_new_tokens,
        "stop": spec.stop,
    }
    if spec.answer_format == "short_answer":  # the rule a strict answer followed
        config["max_answer_words"], config["max_answer_words_from"] = spec.answer_words
    if spec.is_multiple_choice:  # how knowledge compared the options: per character (acc_norm) or summed (acc)
        config["cloze_normalization"] = spec.cloze_normalization
    tuned = soft_prompt or adapter
    # a chat template is unused where no cell of the command runs it (advice fits the command's own settings)
    unused = template_unused(facts, chat) and not chat_too
    context = {"chat_template_unused": unused, "tuned_on_eval_rows": bool(tuned and tuned.metadata.get("eval_rows_in_tuning"))}
    metrics, diagnostics = scores(spec, examples, samples, seed, **context)
    if diagnostics.mostly_empty:
        hint = "; it has a chat template: --chat runs it with it" if diagnostics.chat_template_unused else ""
        log.warning("%s %s %s: %.0f%% of the completions are empty%s", lm.name, spec.name, method, 100 * diagnostics.empty_share, hint)
    return EvalResult(
        config=config,
        metrics=metrics,
        samples=samples,
        model=lm.identity,
        data=eval_data,
        timings={k: round(v, 3) for k, v in timings.items()},
        n_truncated=n_truncated,
        diagnostics=diagnostics,
        versions=package_versions(),
        identity=cell_identity(lm, spec, method, chat=chat, k=shots, limit=limit, seed=seed, data_dir=data_dir, tuned=tuned),
        tuning=None if tuned is None else tuning_record(tuned),
        engine=engine.check,
    )


def model_facts(lm: LoadedModel, role: str | None = None) -> dict:
    """What a cell records of its model's kind: whether it has a chat template (`post_trained`),
    and its role with where that came from (a study's declaration, the model registry, or
    nothing: the findings then only guess it from the chat template)."""
    known = role or lm.role
    return {"post_trained": lm.post_trained, "role": known, "role_from": ("study" if role else "registry") if known else None}


def template_unused(facts: dict, chat: bool) -> bool:
    """A chat template a cell could have used and did not: not for a model known to be base."""
    return bool(facts.get("post_trained")) and not chat and facts.get("role") != "base"


def _cloze_bytes_short(result: EvalResult, spec: TaskSpec, examples: list) -> bool:
    """Whether a cell's cloze bits per byte were counted by the rule that left out the space a
    plain cloze context ends in. A chat context ends in the chat template's generation prompt,
    which cannot be told here without the tokenizer (and is not known to end in a space)."""
    if not spec.is_multiple_choice or result.config.get("chat") or result.versions.get("cloze_bytes") == CLOZE_BYTES:
        return False
    return any(cloze_context_ends_in_space(spec, example) for example in examples)


def rejudge(folder: Path, spec: TaskSpec, *, data_dir, limit: int | None, seed: int, facts: dict | None = None, chat_too: bool = False) -> int | None:
    """Judge a finished cell's completions again by this version's parsers, which may read them
    otherwise than the version that evaluated the cell, and rewrite the cell if anything it
    records changed: a reused cell is scored by the rules of the cells evaluated beside it.
    `facts` (see `model_facts`) are the model's as the run knows them, recorded afresh.
    Returns how many completions are judged differently; None when nothing changed."""
    try:
        result = EvalResult.load(folder)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:  # a file cut short or edited by hand
        reason = (str(exc).splitlines() or [""])[0][:120]
        raise SoftevalError(f"{folder}: its results cannot be read ({type(exc).__name__}: {reason})") from exc
    spec = with_answer_words(spec, data_dir)
    examples = load_examples(spec, spec.dataset.eval_split, data_dir, limit=limit, seed=seed)
    by_index = {e.index: e for e in examples}
    if sorted(s.index for s in result.samples) != sorted(by_index):
        raise SoftevalError(f"{folder}: its samples are not the rows of task {spec.name}'s data")
    if _cloze_bytes_short(result, spec, examples):
        raise SoftevalError(f"{folder}: an earlier softeval counted its cloze bits per byte one byte short (its cloze contexts end in a space)")
    answer_format = spec.format
    samples = []
    for s in result.samples:
        loglikelihoods = None if s.option_loglikelihoods is None else [float("-inf") if x is None else x for x in s.option_loglikelihoods]
        judgement = score_sample(answer_format, by_index[s.index], s.completion, loglikelihoods, cut=s.stop_reason == "length",
                                 raw=s.raw_completion)
        samples.append(s.model_copy(update=judgement.model_dump()))
    known = result.diagnostics  # what the samples cannot tell, as the cell recorded it
    unused = template_unused(facts, bool(result.config.get("chat"))) and not chat_too if facts is not None else bool(known and known.chat_template_unused)
    context = {"chat_template_unused": unused, "tuned_on_eval_rows": bool(known and known.tuned_on_eval_rows)}
    metrics, diagnostics = scores(spec, [by_index[s.index] for s in samples], samples, result.config["seed"], **context)
    config = result.config | (facts or {})
    if spec.answer_format == "short_answer":
        config |= dict(zip(("max_answer_words", "max_answer_words_from"), spec.answer_words))
    if spec.is_multiple_choice:
        config["cloze_normalization"] = spec.cloze_normalization
    same_code = result.versions.get("parsers") == parsers_version()
    if same_code and samples == result.samples and metrics == result.metrics and diagnostics == result.diagnostics and config == result.config:
        return None
    changed = sum(new != old for new, old in zip(samples, result.samples))
    if result.versions.get("intervals") != INTERVALS and metrics != result.metrics:
        log.info("%s: its intervals are computed again from its samples by this version's rule (%s percentiles: each bound a value "
                 "some resample took)", folder, INTERVALS)
    result.samples, result.metrics, result.diagnostics, result.config = samples, metrics, diagnostics, config
    # the cloze byte rule is recorded where the cell's byte counts are known to follow it: a
    # plain cell that passed `_cloze_bytes_short`, or one without options
    counted = {} if spec.is_multiple_choice and result.config.get("chat") else {"cloze_bytes": CLOZE_BYTES}
    result.versions = result.versions | {"parsers": parsers_version(), "intervals": INTERVALS} | counted
    result.write(folder)
    return changed


def cell_identity(lm: LoadedModel, spec: TaskSpec, method: str, *, chat: bool, k: int, limit: int | None, seed: int,
                  data_dir, tuned: SoftPrompt | Adapter | None) -> dict:
    """Everything a cell's results depend on: the model, the task spec, the data, the method and its
    settings, and the tuned prompt or adapter. A finished cell with the same identity is not redone;
    the batch size is left out, since a row's output does not depend on its batch."""
    ds = spec.dataset
    splits = [ds.eval_split] + ([ds.fewshot_split] if method == "few-shot" else [])
    data = [data_identity(spec, split, data_dir) for split in splits]
    return {
        # the dtype too: the same model in bf16 on a GPU and in fp32 on a CPU gives other outputs
        "model": {key: lm.identity.get(key) for key in (*identity_keys(lm.identity), "dtype")},
        "task_spec_sha256": spec.sha256(),
        "data": [[d["split"], d.get("sha256") or d["source"], d["rows"]] for d in data],
        "method": method,
        "chat": chat,
        "k": k if method == "few-shot" else 0,
        "limit": effective_limit(limit, data[0]),
        "seed": seed,
        "tuned_sha256": None if tuned is None else tuned.sha256,
    }


def effective_limit(limit: int | None, eval_data: dict) -> int | None:
    """The limit as the rows it keeps: None where it reaches the whole (filtered) split, so a
    limit above the split's size and no limit are the same cell."""
    kept = eval_data["rows"] - eval_data["filtered_out"]
    return limit if limit is not None and limit < kept else None


def identity_difference(old: dict, new: dict) -> str:
    """What changed between two cell identities, for the line that says a cell is redone."""
    scalar = lambda v: v is None or isinstance(v, (str, int, float, bool))  # noqa: E731
    shown = lambda v: "none" if v is None else str(v)[:12]  # noqa: E731 - a hash's first digits tell it apart
    changed = []
    for key in new:
        before, after = old.get(key), new[key]
        if before == after:
            continue
        if isinstance(before, dict) and isinstance(after, dict):  # the model: which of its facts
            changed += [f"{key} {sub} {shown(before.get(sub))} -> {shown(after.get(sub))}" for sub in after if before.get(sub) != after[sub]] or [key]
        else:
            changed.append(f"{key} {shown(before)} -> {shown(after)}" if scalar(before) and scalar(after) else key)
    return ", ".join(changed) or "record format"


def tuning_record(tuned: SoftPrompt | Adapter) -> dict:
    """The cost of a tuned method beside its score: trainable parameters and tuning time."""
    meta = tuned.metadata
    n = tuned.n_parameters if isinstance(tuned, Adapter) else tuned.vectors.numel()
    return {
        "trainable_parameters": meta.get("trainable_parameters", n),
        "tuning_seconds": meta.get("tuning_seconds"),
        "steps": meta.get("steps"),
        "stopped_early": meta.get("stopped_early"),  # adaptive tuning (patience): where it stopped
        "batch_size": meta.get("config", {}).get("batch_size"),  # the step's examples: the findings' budget of steps
        "engine_path": (meta.get("engine") or {}).get("path"),  # the path the tuning ran on
    }


