"""Continuous metrics: the gold answer's log-likelihood, bits per byte and option probability, each
recomputed here from the model's own forward pass on what the cell's sample log says it read."""

from __future__ import annotations

import json
import math

import pytest
import torch
import yaml
from conftest import prompt_ids, reference_loglikelihood, write_user_task

from softeval import evaluate, load_task
from softeval.scoring.likelihood import bits_per_byte, option_probability

# answers with two-, three- and four-byte UTF-8 characters: bits per byte counts bytes, not characters
CITIES = [("Switzerland", "Zürich"), ("Japan", "東京"), ("Iceland", "Reykjavík"), ("Emoji land", "🏙️ Metro"), ("France", "Paris")]


def _short_answer_task(tmp_path):
    rows = [{"q": f"Largest city of {country}?", "a": city} for country, city in CITIES]
    for split in ("test", "train"):
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    spec = {
        "name": "cities",
        "dataset": {"path": "local/cities", "eval_split": "test", "tune_split": "train", "fewshot_split": "train",
                    "data_files": {"test": "test.jsonl", "train": "train.jsonl"}},
        "answer_format": "short_answer",
        "fields": {"question": "q", "answer": "a", "aliases": "[a]"},
        "template": "Q: {{ question }}\nA:",
        "target": " {{ answer }}",
        "stop": ["\n"],
        "max_new_tokens": 6,
    }
    path = tmp_path / "cities.yaml"
    path.write_text(yaml.safe_dump(spec, allow_unicode=True), encoding="utf-8")
    return load_task(path)


@pytest.mark.parametrize("soft", [False, True], ids=["zero-shot", "soft-prompt"])
def test_bits_per_byte_equal_the_models_own_forward_on_multibyte_answers(tiny_llama, tmp_path, soft):
    spec = _short_answer_task(tmp_path)
    vectors = torch.randn(3, tiny_llama.model.config.hidden_size, generator=torch.Generator().manual_seed(0)) * 0.02 if soft else None
    method = "soft-prompt" if soft else "zero-shot"
    result = evaluate(tiny_llama, spec, method, soft_prompt=vectors, progress=False)
    expected = []
    for sample, (_, city) in zip(sorted(result.samples, key=lambda s: s.index), CITIES):
        target = " " + city
        ll = reference_loglikelihood(tiny_llama, prompt_ids(tiny_llama, sample.prompt), tiny_llama.encode(target), vectors)
        bpb = -ll / (math.log(2) * len(target.encode("utf-8")))
        assert sample.gold_logprob == pytest.approx(ll, abs=1e-3)
        assert sample.gold_bpb == pytest.approx(bpb, rel=1e-4)
        assert sample.gold_prob is None and sample.cloze_gold_bpb is None  # no options
        expected.append(bpb)
    assert any(len(city.encode()) > len(city) for _, city in CITIES)
    assert result.metrics["gold_bpb"].value == pytest.approx(sum(expected) / len(expected), abs=1e-5)
    assert result.metrics["gold_bpb"].ci_low <= result.metrics["gold_bpb"].value <= result.metrics["gold_bpb"].ci_high
    assert "gold_prob" not in result.metrics


def test_option_probabilities_are_the_models_own_and_sum_to_one(tiny_llama, tmp_path):
    rows = [{"q": "Capital of Österreich?", "a": "Wien", "b": "Zürich", "gold": 0}, {"q": "Capital of Italy?", "a": "Paris", "b": "Rome", "gold": 1},
            {"q": "Capital of Japan?", "a": "東京", "b": "Lima", "gold": 0}]
    spec = load_task(write_user_task(tmp_path, rows))
    result = evaluate(tiny_llama, spec, "zero-shot", progress=False)
    for sample in result.samples:
        row = rows[sample.index]
        context = prompt_ids(tiny_llama, sample.prompt)
        answers = [reference_loglikelihood(tiny_llama, context, tiny_llama.encode(f" {letter}")) for letter in "AB"]
        assert sample.prompt_option_loglikelihoods == pytest.approx(answers, abs=1e-3)
        shares = [option_probability(sample.prompt_option_loglikelihoods, i) for i in range(2)]
        assert sum(shares) == pytest.approx(1.0)
        assert sample.gold_prob == pytest.approx(math.exp(answers[row["gold"]]) / sum(map(math.exp, answers)), abs=1e-4)
        assert sample.prompt_knowledge_correct == (answers.index(max(answers)) == row["gold"])
        # the cloze context: knowledge's own log-likelihoods, the options' text with its leading space
        cloze = sample.option_loglikelihoods
        assert sum(option_probability(cloze, i) for i in range(2)) == pytest.approx(1.0)
        gold_text = " " + [row["a"], row["b"]][row["gold"]]
        assert sample.cloze_gold_bpb == pytest.approx(-cloze[row["gold"]] / (math.log(2) * len(gold_text.encode())), rel=1e-6)
    for name in ("gold_prob", "prompt_knowledge", "cloze_gold_prob", "cloze_gold_bpb", "gold_bpb", "gold_logprob"):
        assert result.metrics[name].value is not None, name


def test_cloze_bits_per_byte_count_every_byte_scored_when_the_context_ends_in_a_space(tiny_llama, tmp_path):
    """A cloze template ending in a space: the space moves into each option when encoded (as
    lm-evaluation-harness splits a pair), so an option's tokens encode that space and the
    delimiter before its text, and its bits per byte count both."""
    from softeval.tasks import PromptBuilder, load_examples

    rows = [{"q": "Capital of Österreich?", "a": "Wien", "b": "Zürich", "gold": 0}, {"q": "Capital of Italy?", "a": "Paris", "b": "Rome", "gold": 1}]
    spec = load_task(write_user_task(tmp_path, rows, cloze_template="Question: {{ question }}\nAnswer: "))
    builder = PromptBuilder(spec, tiny_llama)
    result = evaluate(tiny_llama, spec, "zero-shot", progress=False)
    for sample, example in zip(result.samples, load_examples(spec, "test", None)):
        row = rows[sample.index]
        scored = "  " + [row["a"], row["b"]][row["gold"]]  # the context's trailing space, then the delimiter
        assert tiny_llama.tokenizer.decode(builder.cloze(example).continuation_ids[row["gold"]]) == scored
        expected = -sample.option_loglikelihoods[row["gold"]] / (math.log(2) * len(scored.encode()))
        assert sample.cloze_gold_bpb == pytest.approx(expected, rel=1e-6)


def test_a_cell_whose_cloze_bytes_an_earlier_version_counted_short_is_evaluated_again(tiny_llama, tmp_path):
    """Judging a finished cell again cannot recount its cloze bits per byte (that needs the
    tokenizer): a cell an earlier version counted one byte short (no `cloze_bytes` in its
    versions, cloze contexts ending in a space) is refused, so the study evaluates it again."""
    from softeval.errors import SoftevalError
    from softeval.scoring import CLOZE_BYTES
    from softeval.study.evaluation import rejudge

    rows = [{"q": "Capital of France?", "a": "Paris", "b": "Rome", "gold": 0}, {"q": "Capital of Italy?", "a": "Paris", "b": "Rome", "gold": 1}]
    for template, refused in (("Question: {{ question }}\nAnswer: ", True), ("Question: {{ question }}\nAnswer:", False)):
        spec = load_task(write_user_task(tmp_path, rows, cloze_template=template))
        result = evaluate(tiny_llama, spec, "zero-shot", progress=False)
        assert result.versions["cloze_bytes"] == CLOZE_BYTES
        folder = result.save(tmp_path / "now")
        assert rejudge(folder, spec, data_dir=None, limit=None, seed=0) is None
        del result.versions["cloze_bytes"]  # as an earlier version recorded it
        folder = result.save(tmp_path / "earlier")
        if refused:
            with pytest.raises(SoftevalError, match="counted its cloze bits per byte one byte short"):
                rejudge(folder, spec, data_dir=None, limit=None, seed=0)
        else:
            assert rejudge(folder, spec, data_dir=None, limit=None, seed=0) is None


def test_a_target_that_does_not_name_its_option_scores_the_gold_target_alone(tiny_llama, tmp_path):
    rows = [{"q": "Capital of France?", "a": "Paris", "b": "Rome", "gold": 0}, {"q": "Capital of Italy?", "a": "Paris", "b": "Rome", "gold": 1}]
    spec = load_task(write_user_task(tmp_path, rows, target=" {{ q }}"))
    result = evaluate(tiny_llama, spec, "zero-shot", progress=False)
    # no option is likelier than another there: the gold target alone is scored
    for sample in result.samples:
        context = prompt_ids(tiny_llama, sample.prompt)
        target = " " + rows[sample.index]["q"]
        assert sample.gold_prob is None and sample.prompt_knowledge_correct is None
        assert sample.gold_logprob == pytest.approx(reference_loglikelihood(tiny_llama, context, tiny_llama.encode(target)), abs=1e-3)
    assert "gold_prob" not in result.metrics and result.metrics["gold_bpb"].value is not None
    assert result.metrics["cloze_gold_prob"].value is not None  # the cloze context names each option


def test_bits_per_byte_and_option_probability_by_hand():
    assert bits_per_byte(-math.log(2) * 6, "Zürich") == pytest.approx(6 / 7)  # "ü" takes two bytes
    assert bits_per_byte(float("-inf"), "x") is None and bits_per_byte(-1.0, "") is None
    assert option_probability([math.log(0.2), math.log(0.6)], 1) == pytest.approx(0.75)
    assert option_probability([float("-inf"), 0.0], 0) == 0.0
    assert option_probability([float("-inf"), float("-inf")], 0) is None
