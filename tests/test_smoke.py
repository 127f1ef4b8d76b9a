"""Smoke test: the real SmolLM2-135M-Instruct on 20 ARC-Easy rows of the benchmark mirror."""

from __future__ import annotations

import pytest

from softeval import evaluate, load_model, load_task

pytestmark = pytest.mark.smoke


@pytest.fixture(scope="module")
def smollm2():
    return load_model("smollm2-135m-instruct", device="cpu")


def test_smollm2_arc_easy_few_shot(smollm2, mirror):
    spec = load_task("arc_easy")
    batched = evaluate(smollm2, spec, "few-shot", limit=20, data_dir=mirror, batch_size=16, progress=False)
    single = evaluate(smollm2, spec, "few-shot", limit=20, data_dir=mirror, batch_size=1, progress=False)
    assert len(batched.samples) == 20 and batched.n_truncated == 0
    # the same completions and option scores whatever the batch
    assert [s["completion"] for s in batched.samples] == [s["completion"] for s in single.samples]
    for a, b in zip(batched.samples, single.samples):
        assert a["option_loglikelihoods"] == pytest.approx(b["option_loglikelihoods"], abs=1e-3)
    # with demonstrations the instruct model answers with a letter
    assert batched.metrics["format_following"].value >= 0.8
    assert all(s["n_demos"] == 5 for s in batched.samples)


def test_smollm2_arc_easy_zero_shot_chat(smollm2, mirror):
    result = evaluate(smollm2, load_task("arc_easy"), "zero-shot", chat=True, limit=20, data_dir=mirror, progress=False)
    assert all("<|im_start|>assistant" in s["prompt"] for s in result.samples)
    m = result.metrics
    assert m["task_accuracy"].value <= m["format_following"].value
    assert 0.0 <= m["knowledge"].value <= 1.0


def test_smollm2_soft_prompt_is_independent_of_batch(smollm2, mirror):
    from softeval.softprompt import initial_vectors

    spec = load_task("arc_easy")
    soft = initial_vectors(smollm2, 10, "vocab", seed=0)
    batched = evaluate(smollm2, spec, "soft-prompt", soft_prompt=soft, limit=12, data_dir=mirror, batch_size=12, progress=False)
    single = evaluate(smollm2, spec, "soft-prompt", soft_prompt=soft, limit=12, data_dir=mirror, batch_size=1, progress=False)
    assert [s["completion"] for s in batched.samples] == [s["completion"] for s in single.samples]
    for a, b in zip(batched.samples, single.samples):
        assert a["option_loglikelihoods"] == pytest.approx(b["option_loglikelihoods"], abs=1e-3)
