"""Smoke tests: the real offline models on a few ARC-Easy rows of the benchmark mirror."""

from __future__ import annotations

import pytest

from softeval import evaluate, load_examples, load_model, load_task

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
    assert [s.raw_completion for s in batched.samples] == [s.raw_completion for s in single.samples]
    for a, b in zip(batched.samples, single.samples):
        assert a.option_loglikelihoods == pytest.approx(b.option_loglikelihoods, abs=1e-3)
    # with demonstrations the instruct model answers with a letter
    assert batched.metrics["format_following"].value >= 0.8
    assert all(s.n_demos == 5 for s in batched.samples)


def test_smollm2_arc_easy_zero_shot_chat(smollm2, mirror):
    result = evaluate(smollm2, load_task("arc_easy"), "zero-shot", chat=True, limit=20, data_dir=mirror, progress=False)
    assert all(s.prompt.endswith("<|im_start|>assistant\n") and s.n_demos == 0 for s in result.samples)
    # the diagnostics count what the samples say
    assert sum(result.diagnostics.answer_distribution.values()) == 20
    assert result.diagnostics.chance == pytest.approx(sum(1 / len(s.choices) for s in result.samples) / 20)


def test_gemma_answers_after_a_leading_newline_are_judged(mirror):
    """gemma-3-270m zero-shot opens these ARC-Easy answers with a newline: they are judged on what
    follows it (row 1066 writes letter A with option B's text, row 1466 answers A), not cut to nothing."""
    from softeval.engine import Engine
    from softeval.tasks import PromptBuilder

    gemma = load_model("gemma-3-270m", device="cpu")
    spec = load_task("arc_easy")
    rows = {e.index: e for e in load_examples(spec, "test", mirror)}
    examples = [rows[1066], rows[1466]]
    builder = PromptBuilder(spec, gemma, reserve=spec.max_new_tokens)
    completions = Engine(gemma).generate([builder.generation(e).ids for e in examples], spec.stop, spec.max_new_tokens)
    assert [c.raw for c in completions] == ["\nA. a medium.\n", "\nA. mean.\n"]
    assert [c.text for c in completions] == ["\nA. a medium.", "\nA. mean."]
    conflict = spec.format.strict(completions[0].text, examples[0])
    assert (conflict.answer, conflict.status, conflict.note) == (None, "conflict", "letter A but the text of option B")
    assert spec.format.strict(completions[1].text, examples[1]).answer == "A"


def test_smollm2_soft_prompt_is_independent_of_batch(smollm2, mirror):
    from softeval.tuning import initial_vectors

    spec = load_task("arc_easy")
    soft = initial_vectors(smollm2, 10, "vocab", seed=0)
    batched = evaluate(smollm2, spec, "soft-prompt", soft_prompt=soft, limit=12, data_dir=mirror, batch_size=12, progress=False)
    single = evaluate(smollm2, spec, "soft-prompt", soft_prompt=soft, limit=12, data_dir=mirror, batch_size=1, progress=False)
    assert [s.raw_completion for s in batched.samples] == [s.raw_completion for s in single.samples]
    for a, b in zip(batched.samples, single.samples):
        assert a.option_loglikelihoods == pytest.approx(b.option_loglikelihoods, abs=1e-3)
