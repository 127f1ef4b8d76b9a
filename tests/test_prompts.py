"""Prompt rendering: demonstrations, chat templates, context overflow."""

from __future__ import annotations

import dataclasses
import random

import pytest

from conftest import ROWS as ROWS_MC
from conftest import mc_example, reference_loglikelihood, write_user_task
from softeval import SoftevalError, evaluate, load_examples, load_task
from softeval.formats import Example
from softeval.tasks import Cloze, PromptBuilder, choose_demos
from softeval.tasks.prompts import Prompt


def test_zero_shot_prompt_is_instruction_then_question(tiny_llama, mirror):
    spec = load_task("arc_easy")
    example = load_examples(spec, "test", mirror, limit=1)[0]
    prompt = PromptBuilder(spec, tiny_llama).generation(example)
    assert prompt.text.startswith(spec.instruction + "\n\n")
    assert prompt.text.endswith("Answer:") and prompt.n_demos == 0 and not prompt.truncated
    assert prompt.ids == tiny_llama.encode(prompt.text)  # SmolLM2 uses no BOS


def test_bos_is_prepended_where_the_tokenizer_uses_one(tiny_gemma, mirror):
    spec = load_task("arc_easy")
    example = load_examples(spec, "test", mirror, limit=1)[0]
    prompt = PromptBuilder(spec, tiny_gemma).generation(example)
    assert tiny_gemma.bos_token_id is not None
    assert prompt.ids[0] == tiny_gemma.bos_token_id and prompt.ids[1] != tiny_gemma.bos_token_id


def test_few_shot_never_shows_the_evaluated_example(tiny_llama, mirror):
    # mmlu draws demos from dev; evaluate on dev too, so demos and examples overlap
    spec = load_task("mmlu")
    spec = spec.model_copy(update={"dataset": spec.dataset.model_copy(update={"eval_split": "dev"})})
    pool = load_examples(spec, "dev", mirror)
    demos = choose_demos(spec, pool, 3, seed=0)
    roomy = dataclasses.replace(tiny_llama, context_length=4096)
    builder = PromptBuilder(spec, roomy, demos=demos, k=3)
    for example in demos:  # each demo, evaluated itself
        prompt = builder.generation(example)
        assert prompt.n_demos == 3
        assert prompt.text.count(example.question) == 1
        assert prompt.text.count("Answer: ") == 3  # three answered demos, then the open cue


def test_chat_template_wraps_demos_as_turns(tiny_llama, mirror):
    spec = load_task("triviaqa")
    pool = load_examples(spec, "train", mirror, limit=10)
    builder = PromptBuilder(spec, tiny_llama, demos=choose_demos(spec, pool, 2, 0), k=2, chat=True)
    prompt = builder.generation(load_examples(spec, "validation", mirror, limit=1)[0])
    assert prompt.text.count("<|im_start|>assistant") == 3
    assert prompt.text.endswith("<|im_start|>assistant\n")
    assert spec.instruction in prompt.text


def test_long_prompts_lose_demos_first_then_tokens(tiny_llama, mirror):
    spec = load_task("boolq")
    pool = load_examples(spec, "train", mirror, limit=20)
    example = load_examples(spec, "validation", mirror, limit=1)[0]
    demos = choose_demos(spec, pool, 5, 0)
    full = PromptBuilder(spec, tiny_llama, demos=demos, k=5).generation(example)
    zero = PromptBuilder(spec, tiny_llama).generation(example)
    short = dataclasses.replace(tiny_llama, context_length=len(full.ids) - 1)
    fewer = PromptBuilder(spec, short, demos=demos, k=5).generation(example)
    assert fewer.n_demos < 5 and fewer.truncated and len(fewer.ids) <= short.context_length
    tiny = dataclasses.replace(tiny_llama, context_length=len(zero.ids) - 10)
    cut = PromptBuilder(spec, tiny, demos=demos, k=5).generation(example)
    assert cut.n_demos == 0 and cut.truncated and len(cut.ids) == tiny.context_length
    assert cut.ids[-5:] == zero.ids[-5:]  # the answer cue survives; the oldest tokens go


def test_cloze_splits_like_lm_eval(tiny_llama, mirror):
    spec = load_task("arc_easy")
    example = load_examples(spec, "test", mirror, limit=1)[0]
    cloze = PromptBuilder(spec, tiny_llama).cloze(example)
    context = f"Question: {example.question}\nAnswer:"
    assert cloze.context_ids == tiny_llama.encode(context)
    for choice, ids in zip(example.choices, cloze.continuation_ids):
        assert tiny_llama.encode(context + " " + choice) == cloze.context_ids + ids


def test_a_shortened_prompt_is_logged_as_fed(tiny_llama, mirror):
    spec = load_task("boolq")
    example = load_examples(spec, "validation", mirror, limit=1)[0]
    zero = PromptBuilder(spec, tiny_llama).generation(example)
    tiny = dataclasses.replace(tiny_llama, context_length=len(zero.ids) - 10)
    cut = PromptBuilder(spec, tiny).generation(example)
    assert cut.truncated and len(cut.ids) < len(zero.ids)
    assert cut.text == tiny_llama.tokenizer.decode(cut.ids) and cut.text != zero.text
    assert zero.text.endswith(cut.text)


def _hand_built_chat_cloze(lm, spec, demos, example) -> tuple[list[int], list[list[int]]]:
    """The knowledge context written out by hand: demonstrations as chat turns answered with the
    gold option's text, then the question; each option's text follows the assistant cue."""
    messages = []
    for demo in demos:
        messages += [
            {"role": "user", "content": f"Question: {demo.question}\nAnswer:"},
            {"role": "assistant", "content": demo.choices[demo.answer_index]},
        ]
    messages.append({"role": "user", "content": f"Question: {example.question}\nAnswer:"})
    context = lm.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    context_ids = lm.encode(context)
    options = [lm.encode(context + choice)[len(context_ids) :] for choice in example.choices]
    return context_ids, options


@pytest.mark.parametrize("shortened", [False, True], ids=["with-demos", "truncated"])
def test_cloze_knowledge_with_chat_demos_and_truncation_matches_a_hand_built_reference(tiny_llama, mirror, shortened):
    """Roomy: two demonstrations as chat turns. Short: the demonstrations are dropped and then the
    oldest tokens, until the longest option fits."""
    spec = load_task("arc_easy")
    examples = load_examples(spec, "test", mirror, limit=3, seed=1)
    demos = choose_demos(spec, load_examples(spec, "train", mirror), 2, seed=1)[:2]  # as evaluate picks them
    references = [_hand_built_chat_cloze(tiny_llama, spec, [] if shortened else demos, e) for e in examples]
    shortest = min(len(c) for c, _ in references)
    lm = dataclasses.replace(tiny_llama, context_length=shortest - 1 + spec.max_new_tokens if shortened else 4096)
    result = evaluate(lm, spec, "few-shot", chat=True, k=2, limit=3, seed=1, data_dir=mirror, progress=False)
    for sample, example, (context, options) in zip(result.samples, examples, references):
        keep = lm.context_length - spec.max_new_tokens - max(map(len, options))
        assert (len(context) > keep) == shortened
        expected = [reference_loglikelihood(tiny_llama, context[-keep:], option) for option in options]
        assert sample.option_loglikelihoods == pytest.approx(expected, abs=1e-3)
        per_char = [ll / len(c) for ll, c in zip(expected, example.choices)]
        assert sample.knowledge_correct == (per_char.index(max(per_char)) == example.answer_index)


# --- fitting demonstrations into the context ---------------------------------------------------------

WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "seven", "owls", "watch"]


def _varied_examples(n: int, seed: int = 0) -> list[Example]:
    """Multiple-choice examples whose questions range from a few words to a few dozen."""
    rng = random.Random(seed)
    examples = []
    for i in range(n):
        question = " ".join(rng.choices(WORDS, k=rng.randint(1, 30))) + "?"
        choices = [" ".join(rng.choices(WORDS, k=rng.randint(1, 4))) for _ in range(4)]
        examples.append(dataclasses.replace(mc_example(choices, i % 4), index=i, question=question))
    return examples


def _build(builder: PromptBuilder, example: Example, cloze: bool) -> Prompt | Cloze:
    return builder.cloze(example) if cloze else builder.generation(example)


def _size(built: Prompt | Cloze) -> int:
    return len(built.context_ids if isinstance(built, Cloze) else built.ids)


def _drop_one_at_a_time(builder: PromptBuilder, example: Example, cloze: bool) -> Prompt | Cloze:
    """The plain rule: all demonstrations, then drop the oldest and re-tokenise until the prompt fits."""
    demos = builder._demos_for(example)
    while True:
        text = builder._assemble(example, demos, cloze=cloze)
        if not cloze:
            ids = builder._tokens(text)
            if len(ids) <= builder.budget or not demos:
                dropped = len(demos) < min(builder.k, len(builder.demo_pool))
                return builder._fit(Prompt(text, ids, len(demos)), dropped=dropped)
        else:
            delimiter = "" if builder.chat else " "
            pairs = [builder._encode_pair(text, delimiter + c) for c in example.choices]
            overflow = max(len(c) + len(o) for c, o in pairs) - builder.budget
            if overflow <= 0 or not demos:
                keep = 1 if builder.lm.bos_token_id is not None else 0
                context = pairs[0][0]
                if overflow > 0:
                    context = context[:keep] + context[keep + overflow :]
                scored = [(" " if text.endswith(" ") else "") + delimiter + c for c in example.choices]  # what the option tokens encode
                return Cloze(context, [o for _, o in pairs], truncated=overflow > 0, n_demos=len(demos), continuation_texts=scored)
        demos = demos[1:]


@pytest.mark.parametrize("cloze", [False, True], ids=["generation", "cloze"])
# gemma-3-270m ships no chat template; its tokenizer adds the BOS case
@pytest.mark.parametrize(("model", "chat"), [("tiny_llama", False), ("tiny_llama", True), ("tiny_gemma", False)])
def test_fitting_demos_matches_dropping_them_one_at_a_time(request, model, chat, cloze):
    lm = request.getfixturevalue(model)
    spec = load_task("arc_easy")
    demos, examples = _varied_examples(10), _varied_examples(2, seed=1)
    roomy = dataclasses.replace(lm, context_length=100_000)
    bare = min(_size(_build(PromptBuilder(spec, lm, chat=chat), e, cloze)) for e in examples)
    full = max(_size(_build(PromptBuilder(spec, roomy, demos=demos, k=10, chat=chat), e, cloze)) for e in examples)
    # from below the bare prompt (no demo fits, tokens go) to above the full one (all fit)
    shown = set()
    for budget in range(bare - 5, full + 20, (full - bare) // 15):
        builder = PromptBuilder(spec, dataclasses.replace(lm, context_length=budget), demos=demos, k=10, chat=chat)
        for example in examples:  # one builder for several examples: its demo costs are reused
            got = _build(builder, example, cloze)
            assert got == _drop_one_at_a_time(builder, example, cloze)
            shown.add(getattr(got, "n_demos", None))
    assert cloze or ({0, 10} < shown and len(shown) > 5)


def _counting_encodes(lm) -> tuple[object, list[str]]:
    """A copy of `lm` that records every text it tokenises."""
    calls = []
    counted = dataclasses.replace(lm)
    counted.encode = lambda text: calls.append(text) or lm.encode(text)
    return counted, calls


@pytest.mark.parametrize("chat", [False, True], ids=["plain", "chat"])
def test_fitting_demos_tokenises_a_few_times_per_example_however_many_demos(tiny_llama, chat):
    spec = load_task("arc_easy")
    examples = _varied_examples(4, seed=1)
    per_prompt = 2 * len(examples[0].choices)  # a cloze prompt encodes each option with and without it
    for k in (300, 1000):
        lm, calls = _counting_encodes(tiny_llama)
        builder = PromptBuilder(spec, lm, demos=_varied_examples(k), k=k, chat=chat)
        generation, cloze = [], []
        for example in examples:
            before = len(calls)
            prompt = builder.generation(example)
            generation.append(len(calls) - before)
            assert 0 < prompt.n_demos < 100 and prompt.truncated  # most demonstrations dropped
        for example in examples:
            before = len(calls)
            builder.cloze(example)
            cloze.append(len(calls) - before)
        # the first prompt of each kind also measures every demonstration once; later ones build
        # and tokenise a few candidate prompts
        assert generation[0] <= k + 5 and max(generation[1:]) <= 3
        assert cloze[0] <= k + 1 + 3 * per_prompt and max(cloze[1:]) <= 3 * per_prompt


# --- partial scoring (fill in the blank) --------------------------------------------------------------

WINO = [
    {"sentence": "The trophy does not fit in the suitcase because _ is too big.", "option1": "the trophy", "option2": "the suitcase", "answer": "1"},
    {"sentence": "The cat chased the mouse until _ was tired of running.", "option1": "the cat", "option2": "the mouse", "answer": "2"},
]
PARTIAL = {
    "fields": {
        "question": "sentence",
        "choices": "[option1, option2]",
        "answer": "answer | int - 1",
        "cloze_contexts": "[sentence.split('_')[0] ~ option1, sentence.split('_')[0] ~ option2]",
        "cloze_continuation": "sentence.split('_')[1]",
    },
    "template": "{{ question }}\nA. {{ choices[0] }}\nB. {{ choices[1] }}\nAnswer:",
    "cloze_template": "{{ cloze_context }}",
}


def test_partial_scoring_scores_the_continuation_after_each_option(tmp_path, tiny_llama):
    from softeval.engine import Engine

    spec = load_task(write_user_task(tmp_path, WINO, **PARTIAL))
    example = load_examples(spec, "test")[0]
    requests = PromptBuilder(spec, tiny_llama).cloze_requests(example)
    assert len(requests) == 2
    for request, option in zip(requests, ["the trophy", "the suitcase"]):
        context = tiny_llama.tokenizer.decode(request.context_ids, skip_special_tokens=True)
        (continuation,) = request.continuation_ids
        assert context == f"The trophy does not fit in the suitcase because {option}"
        assert tiny_llama.tokenizer.decode(continuation) == " is too big."
    scores = Engine(tiny_llama).loglikelihood(requests)
    for request, (score,) in zip(requests, scores):
        reference = reference_loglikelihood(tiny_llama, request.context_ids, request.continuation_ids[0])
        assert abs(score - reference) < 1e-4


def test_partial_scoring_end_to_end(tmp_path, tiny_llama):
    spec = load_task(write_user_task(tmp_path, WINO, **PARTIAL))
    result = evaluate(tiny_llama, spec, "few-shot", k=1, progress=False)
    for sample in result.samples:
        assert len(sample.option_loglikelihoods) == 2
        best = max(range(2), key=lambda i: sample.option_loglikelihoods[i])
        assert sample.knowledge_correct == (best == ["A", "B"].index(sample.gold))


def test_partial_scoring_spec_passes_the_checks_before_work(tmp_path):
    from softeval.study.preflight import check_task

    spec = load_task(write_user_task(tmp_path, WINO, **PARTIAL))
    assert check_task(spec, ["test"], None) == {"test": 2}


def test_partial_scoring_fields_are_checked(tmp_path):
    fields = {**PARTIAL["fields"], "cloze_contexts": "[sentence]"}
    spec = load_task(write_user_task(tmp_path, WINO, **{**PARTIAL, "fields": fields}))
    with pytest.raises(SoftevalError, match=r"test\.jsonl:1: field 'cloze_contexts' must be a list of 2 non-empty texts"):
        load_examples(spec, "test")


def test_partial_scoring_demonstrations_show_their_gold_context(tmp_path, tiny_llama):
    spec = load_task(write_user_task(tmp_path, WINO, **PARTIAL))
    cat, trophy = load_examples(spec, "test")[1], load_examples(spec, "test")[0]
    (first, second) = PromptBuilder(spec, tiny_llama, demos=[trophy], k=1).cloze_requests(cat)
    shown = tiny_llama.tokenizer.decode(first.context_ids, skip_special_tokens=True)
    assert shown == "The trophy does not fit in the suitcase because the trophy is too big.\n\nThe cat chased the mouse until the cat"
    assert first.n_demos == second.n_demos == 1


def test_partial_scoring_scores_every_option_under_the_same_demonstrations(tmp_path, tiny_llama):
    rows = [WINO[0], {**WINO[1], "option2": "the very small grey mouse that lived under the old wooden floor"}]
    spec = load_task(write_user_task(tmp_path, rows, **PARTIAL))
    trophy, cat = load_examples(spec, "test")
    builder = PromptBuilder(spec, tiny_llama, demos=[trophy], k=1)
    short_option = builder.cloze(cat, cat.cloze_contexts[0])
    builder.budget = len(short_option.context_ids) + len(short_option.continuation_ids[0])  # the long option's demo no longer fits
    assert builder.cloze(cat, cat.cloze_contexts[1]).n_demos == 0
    requests = builder.cloze_requests(cat)
    assert [r.n_demos for r in requests] == [0, 0]


def test_cloze_context_outside_partial_scoring_is_an_error_before_work(tmp_path):
    from softeval.study.preflight import check_task

    spec = load_task(write_user_task(tmp_path, ROWS_MC, cloze_template="{{ cloze_context }} Answer:"))
    with pytest.raises(SoftevalError, match=r"cloze_template cannot be rendered for .*test\.jsonl:1: 'cloze_context' is undefined"):
        check_task(spec, ["test"], None)


def test_partial_scoring_template_must_use_the_option_context(tmp_path):
    from softeval.study.preflight import check_task

    spec = load_task(write_user_task(tmp_path, WINO, **{**PARTIAL, "cloze_template": "{{ question }}"}))
    with pytest.raises(SoftevalError, match=r"renders the same text for every option of .*test\.jsonl:1; use \{\{ cloze_context \}\} in it"):
        check_task(spec, ["test"], None)
