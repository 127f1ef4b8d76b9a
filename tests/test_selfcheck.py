"""The self-check at engine start: a model runs on the fast path only once the fast path has
matched its own forward on a probe, and every result says which path it ran on and why."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from transformers import AutoTokenizer

import softeval.engine.selfcheck as selfcheck
from architectures import loaded
from conftest import ROWS, write_user_task
from softeval.engine import Engine, ReferenceEngine, start_engine
from softeval.engine.logits import LogitTransform
from softeval.engine.selfcheck import check_model
from softeval.errors import SoftevalError
from softeval.study import evaluate
from softeval.tasks import Cloze, load_task
from softeval.tuning import lora_applied
from softeval.tuning.lora import lora_config


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dirs):
    return AutoTokenizer.from_pretrained(tokenizer_dirs["llama"])


def _scaled_forward(lm, factor: float):
    """The model's forward with its logits multiplied by `factor`: a transform of the logits the
    fast path does not know of (as Cohere's and Granite's were)."""
    forward = lm.model.forward

    def scaled(*args, **kwargs):
        out = forward(*args, **kwargs)
        out.logits = out.logits * factor
        return out

    lm.model.forward = scaled


def test_a_model_passing_the_check_runs_fast(tokenizer, monkeypatch):
    lm = loaded("llama", tokenizer)
    engine = start_engine(lm)
    assert isinstance(engine, Engine)
    assert engine.check["path"] == "fast" and engine.check["dtype"] == "float32" and engine.check["tolerance"] == 1e-3
    assert 0 <= engine.check["figures"]["next_token_logprob"] < 1e-4
    # the verdict is kept: a later engine on the same model does not check again
    monkeypatch.setattr(selfcheck, "_check", lambda lm: pytest.fail("checked twice"))
    assert isinstance(start_engine(lm), Engine)


def test_an_injected_discrepancy_sends_the_model_to_the_reference_path(tokenizer, caplog):
    lm = loaded("llama", tokenizer)
    _scaled_forward(lm, 1.5)
    with caplog.at_level(logging.WARNING, logger="softeval"):
        engine = start_engine(lm)
    assert isinstance(engine, ReferenceEngine)
    assert engine.check["path"] == "reference"
    assert engine.check["reason"].startswith("the fast path's next-token log-probabilities differ from the model's own forward by")
    assert engine.check["figures"]["next_token_logprob"] > 0.01
    lines = [r.getMessage() for r in caplog.records if "reference path" in r.getMessage()]
    assert len(lines) == 1 and engine.check["reason"] in lines[0]
    # the reference path scores as the (scaled) model does
    context, option = lm.encode("The capital of France is"), lm.encode(" Paris")
    with torch.no_grad():
        logprobs = torch.log_softmax(lm.model(torch.tensor([context + option])).logits[0].float(), -1)
    expected = sum(float(logprobs[len(context) - 1 + j, t]) for j, t in enumerate(option))
    assert engine.loglikelihood([Cloze(context, [option])])[0][0] == pytest.approx(expected, abs=1e-4)


def test_a_fast_path_that_fails_on_the_probe_sends_the_model_to_the_reference(tokenizer, monkeypatch):
    lm = loaded("llama", tokenizer)

    def broken(self, *args, **kwargs):
        raise ValueError("too many values to unpack (expected 2)")

    monkeypatch.setattr(Engine, "loglikelihood", broken)
    verdict = check_model(lm)
    assert verdict.path == "reference"
    assert verdict.reason == "the fast path failed on the probe (ValueError: too many values to unpack (expected 2))"


def test_a_model_that_cannot_take_input_embeddings_is_an_error(tokenizer, monkeypatch):
    lm = loaded("llama", tokenizer)

    def no_embeddings(*args, inputs_embeds=None, **kwargs):
        raise ValueError("inputs_embeds is not supported")

    lm.model.forward = no_embeddings
    with pytest.raises(SoftevalError, match=r"^model llama's own forward fails on input embeddings \(ValueError: inputs_embeds is not supported\)"):
        start_engine(lm)


def test_a_model_with_lora_layers_is_checked_again(tokenizer, monkeypatch):
    lm = loaded("llama", tokenizer)
    checks = []
    real = selfcheck._check
    monkeypatch.setattr(selfcheck, "_check", lambda lm: checks.append(1) or real(lm))
    start_engine(lm)
    with lora_applied(lm, lora_config(4, 8, ["q_proj", "v_proj"])):
        start_engine(lm)
    start_engine(lm)  # the plain model again: its verdict is kept
    assert len(checks) == 2


def test_a_half_precision_model_is_checked_in_its_dtype(tokenizer):
    lm = loaded("llama", tokenizer)
    lm.model.to(torch.bfloat16)
    verdict = check_model(lm)
    assert verdict.dtype == "bfloat16" and verdict.tolerance == selfcheck.TOLERANCES[torch.bfloat16]
    assert verdict.path == "fast", verdict.reason


def test_results_record_the_path_and_the_figures(tmp_path, tokenizer):
    spec = load_task(write_user_task(tmp_path, ROWS * 2))
    plain = loaded("llama", tokenizer)
    result = evaluate(plain, spec, limit=2, progress=False)
    saved = json.loads((result.save(tmp_path / "fast") / "results.json").read_text())
    assert saved["engine"]["path"] == "fast" and saved["engine"]["figures"]["loss_per_token"] < 1e-3
    scaled = loaded("llama", tokenizer)
    _scaled_forward(scaled, 2.0)
    saved = json.loads((evaluate(scaled, spec, limit=2, progress=False).save(tmp_path / "reference") / "results.json").read_text())
    assert saved["engine"]["path"] == "reference" and "differ from the model's own forward" in saved["engine"]["reason"]


@pytest.mark.parametrize("name", ["mpt", "bloom"])
def test_alibi_models_fail_the_measured_check_without_the_engines_biases(tokenizer, monkeypatch, name):
    """MPT goes to the reference path by its config, and BLOOM takes the fast path with ALiBi
    biases the engine sets; were neither known, the probe would send them to the reference
    path: MPT's bias follows key columns, where packed options sit apart from their positions,
    and BLOOM's builder cannot read the fast path's 4D masks."""
    import softeval.engine.forward as engine_forward

    monkeypatch.setattr(selfcheck, "_alibi", lambda config: False)
    monkeypatch.setattr(engine_forward, "alibi_slopes", lambda decoder: None)
    verdict = check_model(loaded(name, tokenizer))
    assert verdict.path == "reference"
    expected = {"mpt": "the fast path's option log-likelihoods differ", "bloom": "the fast path failed on the probe (ValueError"}[name]
    assert verdict.reason.startswith(expected), verdict.reason


def test_a_state_space_model_runs_on_the_reference_path_and_says_why(tokenizer):
    verdict = check_model(loaded("mamba", tokenizer))
    assert (verdict.path, verdict.reason) == ("reference", "it has no attention heads (a state-space model)")


@pytest.mark.parametrize(
    ("name", "expected"),
    [("cohere", LogitTransform(scale=0.0625)), ("granite", LogitTransform(scale=1 / 8)), ("gemma2", LogitTransform(softcap=30.0)),
     ("mpt", LogitTransform()), ("llama", LogitTransform())],
)
def test_logit_transforms_are_read_off_the_config(tokenizer, name, expected):
    """Cohere multiplies by logit_scale, Granite divides by logits_scaling, Gemma 2 softcaps;
    MPT's config has a logit_scale its forward does not use."""
    assert LogitTransform.of(loaded(name, tokenizer).model) == expected
