"""The self-check: the fast path serves a model only once it has been measured to compute what
the model's own forward computes, on the model's device and in its dtype.

The fast path (`softeval.engine.fast`) runs the decoder and the LM head apart: pooled decoding,
option scoring behind a tree mask, shared-prefix attention, a sliced head. An architecture whose
forward does something more (a position bias added to attention, a scale on the logits, a
state-space layer) could make it compute other numbers. So when the first engine starts on a
model, a short probe runs both ways: two prompts that share a prefix and differ in length (left
padding), behind a soft prompt. Compared against the model's own forward (`softeval.engine.reference`):

- the next-token log-probabilities of the 64 likeliest tokens after each prompt;
- the greedy continuation, pooled: at every step the fast path's token must be the reference's
  argmax, or within the tolerance of it (a near tie);
- option log-likelihoods, per token of the option (options packed at other columns than their
  positions);
- the tuning loss, per target token.

Where any differs by more than the dtype's tolerance, where the fast path fails on the probe, or
where the model has parts it does not know (no attention heads, ALiBi position biases,
state-space or linear-attention layers, another attention kernel than SDPA or eager), the model
runs on the reference path and one log line says why. There the same probe runs once more, its
rows batched as the reference path batches them (scoring padded on the right, generation padded
on the left with a mask), against each row alone: rows share forward passes only where their
results are those they have alone, within the tolerance; scoring and generation are judged
apart (left padding changes a Mamba layer's state; right padding changes nothing). Every result
records the verdict and its figures (`results.json`'s `engine`). A verdict is kept per model and
per set of module types (a model with LoRA layers injected is checked again), so later engines on
the same model cost nothing.
"""

from __future__ import annotations

import logging
import time
import weakref
from dataclasses import asdict, dataclass, field

import torch
from transformers import DynamicCache

from softeval.engine.fast import Engine
from softeval.engine.forward import TOKEN_BUDGET, alibi_slopes
from softeval.engine.reference import GENERATION_ROWS, ReferenceEngine
from softeval.errors import SoftevalError
from softeval.models import LoadedModel
from softeval.tasks import Cloze

log = logging.getLogger("softeval")

# The largest difference, in nats per token, the fast path may show against the reference (in
# next-token log-probabilities, greedy choices, option log-likelihoods and the tuning loss). In
# float32 the two paths' rounding differs by about 1e-5 on the offline models. Half precision
# defines a model's scores only so far: bfloat16 keeps 8 bits of mantissa, and on the offline
# models the two paths' rounding alone differs by up to 0.21 nats (the likeliest next tokens) and
# 0.08 nats a token (options); float16 keeps 11 bits.
TOLERANCES = {torch.float64: 1e-6, torch.float32: 1e-3, torch.float16: 0.1, torch.bfloat16: 0.5}

# the cache layers the fast path's decoding pools know how to hold
KNOWN_CACHE_LAYERS = {"DynamicLayer", "DynamicSlidingWindowLayer"}

# Two prompts of different lengths (left padding) after a shared prefix of at least the engine's
# MIN_SHARED_PREFIX tokens, behind a soft prompt of two vectors. The first is followed by options
# of four and two tokens, so that its second option, packed after the first's three, sits three
# columns past its positions (a bias by column, as MPT's ALiBi is, shows there); the second by
# options of one and four tokens. Short: the check's cost is its passes through the model, each
# a read of every weight, and their tokens.
PROBE_SHARED = "Answer in one word each time.\n\n"
PROBE_ROWS = ("Q: Sky?\nA:", "Q: Grass colour?\nA:")
PROBE_OPTIONS = ((" not at all really", " eight legs"), (" no", " not at all really"))
PROBE_SOFT_TOKENS = 2
PROBE_NEW_TOKENS = 2  # the first from the prompts' pass, the second from a decoding step
NEXT_TOKENS_COMPARED = 64  # the likeliest tokens whose next-token log-probabilities are compared

# what each figure compares, for the line that says why a model runs on the reference path
LABELS = {
    "next_token_logprob": "next-token log-probabilities",
    "greedy_margin": "greedy tokens",
    "option_logprob_per_token": "option log-likelihoods",
    "loss_per_token": "tuning losses",
}


@dataclass
class Verdict:
    """Which path a model runs on, why, and what the check measured."""

    path: str  # "fast" or "reference"
    reason: str  # why the reference path, or what the fast path passed
    figures: dict = field(default_factory=dict)  # the largest differences measured (see LABELS)
    tolerance: float = 0.0  # nats per token
    dtype: str = ""
    device: str = ""
    seconds: float = 0.0
    # on the reference path: whether rows share forward passes in scoring and in generation,
    # why not where they do not, and the largest differences batching showed
    batched: dict = field(default_factory=dict)
    batch_reason: str = ""
    batch_figures: dict = field(default_factory=dict)

    def record(self) -> dict:
        return asdict(self)


# model -> {(module types, dtype, device, attention kernel): verdict}; entries go with their model
_verdicts: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def start_engine(lm: LoadedModel, *, soft_prompt: torch.Tensor | None = None, batch_size: int | None = None) -> Engine | ReferenceEngine:
    """An engine for `lm`: the fast one where the self-check passed on this model, else the reference."""
    verdict = check_model(lm)
    if verdict.path == "fast":
        engine: Engine | ReferenceEngine = Engine(lm, batch_size=batch_size, soft_prompt=soft_prompt)
    else:
        scoring_rows = (batch_size or TOKEN_BUDGET) if verdict.batched.get("scoring") else 1
        generation_rows = (batch_size or GENERATION_ROWS) if verdict.batched.get("generation") else 1
        engine = ReferenceEngine(lm, soft_prompt=soft_prompt, scoring_rows=scoring_rows, generation_rows=generation_rows,
                                 shares_contexts=verdict.batched.get("shared_contexts", False))
    engine.check = verdict.record()
    return engine


def check_model(lm: LoadedModel) -> Verdict:
    """The model's verdict, measured when the first engine starts on it (and again once its
    modules change, as when LoRA layers are injected)."""
    model, parameter = lm.model, next(lm.model.parameters())
    attention = getattr(model.config, "_attn_implementation", None)
    signature = (frozenset(type(m).__qualname__ for m in model.modules()), str(parameter.dtype), str(parameter.device), attention)
    known = _verdicts.setdefault(model, {})
    if signature not in known:
        verdict = known[signature] = _check(lm)
        if verdict.path == "reference":
            log.warning("%s runs on the reference path (its own forward; slower): %s; %s", lm.name, verdict.reason, _batching_line(verdict))
        else:
            log.info("%s: the fast path matches the model's own forward (self-check %.2f s)", lm.name, verdict.seconds)
    return known[signature]


def reference_batching(lm: LoadedModel) -> dict:
    """How the reference path would batch rows of `lm` ({"scoring", "generation",
    "shared_contexts"}), measured as for a model the self-check sends there, whichever path
    `lm` takes: for running a fast-path model on the reference path, as the benchmarks do."""
    parameter = next(lm.model.parameters())
    return _batching(lm, _Probe.of(lm), TOLERANCES.get(parameter.dtype, TOLERANCES[torch.bfloat16]))[0]


def forget_verdicts(model) -> None:
    """Drop a model's verdicts: its next engine checks it again."""
    _verdicts.pop(model, None)


def fast_path_unsupported(model) -> str | None:
    """Why the fast path cannot run `model` at all, or None."""
    try:
        config = model.config.get_text_config()
        attention = model.get_decoder().config._attn_implementation
        if not getattr(config, "num_attention_heads", None):
            return "it has no attention heads (a state-space model)"
        if attention not in ("sdpa", "eager"):
            return f"its attention kernel is {attention!r}; the fast path runs SDPA or eager attention (load it with attn_implementation='sdpa')"
        if _alibi(config) and alibi_slopes(model.get_decoder()) is None:
            return ("its attention adds ALiBi position biases that the fast path cannot set (it sets them through the model's own "
                    "build_alibi_tensor, as BLOOM has), so its packed options and 4D masks would misplace them")
        layers = {type(layer).__name__ for layer in DynamicCache(config=config).layers}
    except Exception as exc:  # noqa: BLE001 - a model the fast path cannot even read
        return f"the fast path cannot read its structure ({type(exc).__name__}: {_first_line(exc)})"
    unknown = sorted(layers - KNOWN_CACHE_LAYERS)
    if unknown:
        return f"its cache holds {', '.join(unknown)} layers, which the fast path's pools do not (such as state-space or linear-attention layers)"
    return None


def _alibi(config) -> bool:
    """Whether attention adds ALiBi position biases (BLOOM; Falcon and MPT where set). Where
    the fast path cannot set them, their error there is small enough (a few hundredths of a nat
    a token on the check's probe) to hide in half precision's rounding, so those models are
    known rather than measured."""
    attn_config = getattr(config, "attn_config", None)  # MPT's: a config object or a dict
    mpt = attn_config.get("alibi") if isinstance(attn_config, dict) else getattr(attn_config, "alibi", False)
    return config.model_type == "bloom" or bool(getattr(config, "alibi", False)) or bool(mpt)


def _check(lm: LoadedModel) -> Verdict:
    parameter = next(lm.model.parameters())
    tolerance = TOLERANCES.get(parameter.dtype, TOLERANCES[torch.bfloat16])
    where = {"tolerance": tolerance, "dtype": str(parameter.dtype).removeprefix("torch."), "device": str(parameter.device)}
    started = time.perf_counter()
    probe = _Probe.of(lm)
    verdict = _path_verdict(lm, probe, tolerance, where)
    if verdict.path == "reference":
        verdict.batched, verdict.batch_reason, verdict.batch_figures = _batching(lm, probe, tolerance)
    verdict.seconds = _since(started)
    return verdict


def _path_verdict(lm: LoadedModel, probe: _Probe, tolerance: float, where: dict) -> Verdict:
    """The fast path's verdict: the reference path where the model has parts the fast path
    does not know, where it fails on the probe, or where any figure exceeds the tolerance."""
    # the model's own forward on every row of the probe in one right-padded pass (causal: as alone)
    reference = ReferenceEngine(lm, soft_prompt=probe.soft, scoring_rows=len(probe.prompts) + len(probe.pairs))
    unsupported = fast_path_unsupported(lm.model)
    if unsupported:
        _on_reference(lm, lambda: reference.last_logits(probe.prompts[0], 1))  # the path it will run on can
        return Verdict("reference", unsupported, **where)
    try:
        got = _fast(Engine(lm, soft_prompt=probe.soft), probe)
    except torch.cuda.OutOfMemoryError:
        raise  # a full device says nothing of the fast path: no verdict is kept
    except Exception as exc:  # noqa: BLE001 - the fast path failing on a model is a verdict, not an error
        _on_reference(lm, lambda: reference.last_logits(probe.prompts[0], 1))
        return Verdict("reference", f"the fast path failed on the probe ({type(exc).__name__}: {_first_line(exc)})", **where)
    figures = _compare(probe, _on_reference(lm, lambda: _reference(reference, probe, got.greedy)), got)
    failed = [name for name in LABELS if not figures[name] <= tolerance]  # NaN fails too
    if failed:
        name = failed[0]
        reason = f"the fast path's {LABELS[name]} differ from the model's own forward by {figures[name]:.3g} nats (tolerance {tolerance:g})"
        return Verdict("reference", reason, figures, **where)
    return Verdict("fast", "every probe within tolerance", figures, **where)


# the figures that judge each kind of batch on the reference path
BATCHED_FIGURES = {"scoring": ("option_logprob_per_token", "loss_per_token"), "generation": ("next_token_logprob", "greedy_margin")}


def _batching(lm: LoadedModel, probe: _Probe, tolerance: float) -> tuple[dict, str, dict]:
    """Whether the reference path may batch rows on this model: the probe's rows run together
    (of different lengths, so padded) against each row alone, generation first, then scoring,
    with each context encoded once where generation's left padding passed, else (or where that
    fails) each context and option as one right-padded row. Returns {"generation": bool,
    "scoring": bool, "shared_contexts": bool}, why rows run alone where they do, and the
    figures measured."""
    alone = ReferenceEngine(lm, soft_prompt=probe.soft)
    rows = {"scoring_rows": len(probe.pairs), "generation_rows": len(probe.prompts)}
    got = _Measures(torch.empty(0), [[] for _ in probe.prompts], [], 0.0)
    generation = _measured_together(ReferenceEngine(lm, soft_prompt=probe.soft, **rows), probe, got, _generated_together)
    expected = _reference(alone, probe, got.greedy)
    figures: dict = {}
    failures = {}
    if isinstance(generation, str):
        failures["generation"] = generation
    else:
        figures |= _generation_figures(probe, expected, got)
        failures |= _beyond(figures, "generation", tolerance)
    for shares in ([False] if "generation" in failures else [True, False]):
        engine = ReferenceEngine(lm, soft_prompt=probe.soft, shares_contexts=shares, **rows)
        why = _measured_together(engine, probe, got, _scored_together)
        if why is None:
            figures |= _scoring_figures(probe, expected, got)
            why = _beyond(figures, "scoring", tolerance).get("scoring")
        if why is None:
            break
        # a shared-context failure is said even where scoring then passes with whole rows
        failures["shared contexts" if shares else "scoring"] = why
    batched = {kind: kind not in failures for kind in BATCHED_FIGURES} | {"shared_contexts": shares and "scoring" not in failures}
    return batched, "; ".join(f"{kind}: {why}" for kind, why in failures.items()), figures


def _measured_together(engine: ReferenceEngine, probe: _Probe, got: _Measures, measure) -> str | None:
    """`measure(engine, probe, got)`; why it failed, if it did."""
    try:
        measure(engine, probe, got)
    except torch.cuda.OutOfMemoryError:
        raise
    except Exception as exc:  # noqa: BLE001 - a model whose forward cannot batch runs rows alone
        return f"its forward fails on rows together ({type(exc).__name__}: {_first_line(exc)})"
    return None


def _beyond(figures: dict, kind: str, tolerance: float) -> dict[str, str]:
    """{kind: why} where a figure judging that kind of batch exceeds the tolerance."""
    worst = next((name for name in BATCHED_FIGURES[kind] if not figures[name] <= tolerance), None)
    if worst is None:
        return {}
    return {kind: f"rows together differ from rows alone in {LABELS[worst]} by {figures[worst]:.3g} nats (tolerance {tolerance:g})"}


@torch.inference_mode()
def _generated_together(engine: ReferenceEngine, probe: _Probe, got: _Measures) -> None:
    """The probe's prompts as the reference path generates from them in a batch: left-padded
    next-token log-probabilities and greedy tokens."""
    got.next_token = engine.next_token_logprobs(probe.prompts).float().cpu()[None]
    got.greedy = [_tokens_with_end(c) for c in engine.generate(probe.prompts, [], PROBE_NEW_TOKENS)]


@torch.inference_mode()
def _scored_together(engine: ReferenceEngine, probe: _Probe, got: _Measures) -> None:
    """The probe's options and tuning loss as the reference path scores them in a batch."""
    got.options = [x for row in engine.loglikelihood([Cloze(p, o) for p, o in zip(probe.prompts, probe.options)]) for x in row]
    got.loss = float(engine.target_loss(probe.targets(got.greedy)))


def _batching_line(verdict: Verdict) -> str:
    """How rows run on the reference path, for the log line."""
    alone = [kind for kind in BATCHED_FIGURES if not verdict.batched[kind]]
    if len(alone) == len(BATCHED_FIGURES):
        return f"one row at a time ({verdict.batch_reason})"
    if not alone:
        return "rows run in batches (checked against rows alone)" + (f"; {verdict.batch_reason}" if verdict.batch_reason else "")
    return f"{alone[0]} one row at a time ({verdict.batch_reason}), the rest in batches"


@dataclass
class _Probe:
    prompts: list[list[int]]
    options: list[list[list[int]]]  # each prompt's options
    soft: torch.Tensor  # (PROBE_SOFT_TOKENS, hidden), on the model's device and in its dtype
    eos: set[int]

    @classmethod
    def of(cls, lm: LoadedModel) -> _Probe:
        bos = [] if lm.bos_token_id is None else [lm.bos_token_id]
        prompts = [bos + lm.encode(PROBE_SHARED + row) for row in PROBE_ROWS]
        options = [[lm.encode(option) for option in row] for row in PROBE_OPTIONS]
        embed = lm.model.get_input_embeddings()
        ids = torch.randint(0, min(5000, embed.weight.shape[0]), (PROBE_SOFT_TOKENS,), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            soft = embed(ids.to(embed.weight.device)).detach()
        return cls(prompts, options, soft, set(lm.eos_token_ids))

    @property
    def pairs(self) -> list[tuple[list[int], list[int]]]:
        """Every (prompt, option), whose log-likelihoods are compared."""
        return [(prompt, option) for prompt, options in zip(self.prompts, self.options) for option in options]

    def targets(self, greedy: list[list[int]]) -> list[tuple[list[int], list[int]]]:
        """(prompt, target) of the tuning loss: the fast path's greedy tokens (EOS left out), so
        that one reference pass serves the greedy check and the loss; a prompt's first option
        where its greedy tokens are only an EOS."""
        real = [[t for t in tokens if t != -1] for tokens in greedy]
        return [(prompt, tokens or options[0]) for prompt, tokens, options in zip(self.prompts, real, self.options)]


@dataclass
class _Measures:
    next_token: torch.Tensor  # (ways, prompts, vocabulary) log-probabilities; the fast path encodes prompts two ways
    greedy: list[list[int]]  # each prompt's greedy tokens, -1 for an EOS that ended it
    options: list[float]  # the log-likelihood of each (prompt, option) pair
    loss: float  # summed cross-entropy of the targets after their prompts
    step_logprobs: list[torch.Tensor] | None = None  # the reference's, before each greedy token


@torch.inference_mode()
def _fast(engine: Engine, probe: _Probe) -> _Measures:
    """The probe on the fast path: the prompts encoded together without and with their shared
    prefix kept apart (the two ways generation encodes prompts; the second as the greedy rows
    join their pool), greedy rows pooled, options packed behind a tree mask, the loss over a
    left-padded batch."""
    plain = engine.next_token_logprobs(probe.prompts).float().cpu()
    joined: dict[int, torch.Tensor] = {}

    def observe(rows: list[int], logits: torch.Tensor) -> None:
        joined.update(zip(rows, torch.log_softmax(logits, dim=-1).float().cpu()))

    engine.generation.observe_admission = observe
    greedy = [_tokens_with_end(c) for c in engine.generate(probe.prompts, [], PROBE_NEW_TOKENS)]
    engine.generation.observe_admission = None
    next_token = torch.stack([plain, torch.stack([joined[i] for i in range(len(probe.prompts))])])
    options = [x for row in engine.loglikelihood([Cloze(p, o) for p, o in zip(probe.prompts, probe.options)]) for x in row]
    loss = float(engine.target_loss(probe.targets(greedy)))
    return _Measures(next_token, greedy, options, loss)


@torch.inference_mode()
def _reference(engine: ReferenceEngine, probe: _Probe, greedy: list[list[int]]) -> _Measures:
    """The probe by the model's own forward, given the fast path's greedy tokens, in one pass
    (see `ReferenceEngine.logprobs_together`): each prompt followed by its greedy tokens, whose
    log-probabilities before each token give the next-token distribution, the greedy steps and
    the loss, and each prompt followed by each option."""
    targets = probe.targets(greedy)
    # A row holds the prompt and all but the last token it needs log-probabilities before: for
    # greedy tokens [a, b] (the token limit) those before a and b, the row prompt + [a]; for
    # [a, -1] (ended by EOS) those before a and the EOS, prompt + [a] again. The loss's target is
    # the real tokens, or an option where the greedy tokens are only an EOS: then the row holds
    # that option's tokens, and its first position serves the EOS.
    wanted = [max(len(tokens), len(target)) for (_, target), tokens in zip(targets, greedy)]
    fed = [prompt + target[: n - 1] for (prompt, target), n in zip(targets, wanted)]
    rows = engine.logprobs_together(fed + [p + o[:-1] for p, o in probe.pairs], wanted + [len(o) for _, o in probe.pairs])
    steps, option_rows = [row.cpu() for row in rows[: len(fed)]], rows[len(fed) :]
    loss = -sum(_picked(row[: len(target)], target) for row, (_, target) in zip(steps, targets))
    options = [_picked(row, option) for row, (_, option) in zip(option_rows, probe.pairs)]
    return _Measures(torch.stack([row[0] for row in steps])[None], greedy, options, loss, steps)


def _picked(logprobs: torch.Tensor, tokens: list[int]) -> float:
    """The summed log-probability of `tokens`, one per row of `logprobs`."""
    return float(logprobs.gather(1, torch.tensor(tokens, device=logprobs.device)[:, None]).sum())


def _tokens_with_end(completion) -> list[int]:
    """A completion's tokens, and -1 for the EOS token that ended it (which EOS id is not kept)."""
    return completion.tokens + ([-1] if completion.stop_reason == "eos" else [])


def _compare(probe: _Probe, expected: _Measures, got: _Measures) -> dict[str, float]:
    return _generation_figures(probe, expected, got) | {"greedy_tokens": sum(map(len, got.greedy))} | _scoring_figures(probe, expected, got)


def _generation_figures(probe: _Probe, expected: _Measures, got: _Measures) -> dict[str, float]:
    """The largest differences in next-token log-probabilities and greedy choices."""
    return {"next_token_logprob": _likeliest_difference(expected.next_token, got.next_token), "greedy_margin": _greedy_margin(probe, expected, got)}


def _scoring_figures(probe: _Probe, expected: _Measures, got: _Measures) -> dict[str, float]:
    """The largest differences in option log-likelihoods and the tuning loss, per token."""
    lengths = [len(option) for _, option in probe.pairs]
    n_targets = sum(len(target) for _, target in probe.targets(got.greedy))
    return {
        "option_logprob_per_token": _largest([abs(e - g) / n for e, g, n in zip(expected.options, got.options, lengths)]),
        "loss_per_token": abs(expected.loss - got.loss) / n_targets,
    }


def _likeliest_difference(expected: torch.Tensor, got: torch.Tensor) -> float:
    """The largest difference of next-token log-probabilities among each prompt's
    NEXT_TOKENS_COMPARED likeliest tokens (by the reference), over every way the fast path
    encoded the prompts. The tokens a greedy choice or a plausible answer takes are among them;
    far down the vocabulary, half precision's rounding alone moves a log-probability by more
    than the tolerance (0.3 nats in bfloat16 on the offline models)."""
    expected = expected.expand_as(got)
    top = expected.topk(min(NEXT_TOKENS_COMPARED, expected.shape[-1]), dim=-1).indices
    return float((expected.gather(-1, top) - got.gather(-1, top)).abs().max())  # NaN, if any, wins


def _greedy_margin(probe: _Probe, expected: _Measures, got: _Measures) -> float:
    """How much likelier the reference found its own choice than the fast path's greedy token,
    at the worst step: 0 where every token the fast path chose is the model's own argmax, a
    little above 0 at a near tie."""
    margins = [0.0]
    for tokens, steps in zip(got.greedy, expected.step_logprobs):
        for token, logprobs in zip(tokens, steps):
            chosen = max(float(logprobs[t]) for t in probe.eos) if token == -1 else float(logprobs[token])
            margins.append(float(logprobs.max()) - chosen)
    return _largest(margins)


def _largest(values: list[float]) -> float:
    """The largest value; NaN if any is (Python's max keeps a NaN only where it comes first)."""
    return float(torch.tensor(values, dtype=torch.float64).max())


def _on_reference(lm: LoadedModel, compute):
    """`compute()` on the reference path: a model whose own forward fails on the probe's input
    embeddings is an error that no path can help."""
    try:
        return compute()
    except torch.cuda.OutOfMemoryError:
        raise
    except Exception as exc:  # noqa: BLE001 - transformers raises many kinds
        raise SoftevalError(f"model {lm.name}'s own forward fails on input embeddings ({type(exc).__name__}: {_first_line(exc)}); "
                            "soft prompts and softeval's scoring need a causal LM whose forward takes inputs_embeds") from exc


def _since(started: float) -> float:
    return round(time.perf_counter() - started, 3)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
