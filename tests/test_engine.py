"""The engine against plain transformers computations on tiny random llama and gemma3 models."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import SHARED, TEXTS, prompt_ids, reference_greedy, reference_loglikelihood

from softeval.engine import Engine, _Decoder, _Pool
from softeval.prompts import Cloze

PREFIXES = pytest.mark.parametrize("prefix", ["", SHARED], ids=["distinct", "shared-prefix"])


@PREFIXES
def test_generation_matches_uncached_reference(tiny_lm, prefix):
    # batches of 2: rows of the first batch still running are pooled with the second
    engine = Engine(tiny_lm, batch_size=2)
    prompts = [prompt_ids(tiny_lm, prefix + t) for t in TEXTS]
    expected = [reference_greedy(tiny_lm, p, 6) for p in prompts]
    completions = engine.generate(prompts, stop=["\x00never"], max_new_tokens=6)
    for completion, tokens in zip(completions, expected):
        eos = [i for i, t in enumerate(tokens) if t in tiny_lm.eos_token_ids]
        tokens = tokens[: eos[0]] if eos else tokens
        assert completion.text == tiny_lm.tokenizer.decode(tokens, skip_special_tokens=True)


@PREFIXES
def test_generation_is_independent_of_batch(tiny_lm, prefix):
    prompts = [prompt_ids(tiny_lm, prefix + t) for t in TEXTS]
    together = Engine(tiny_lm, batch_size=4).generate(prompts, stop=["\n"], max_new_tokens=8)
    pooled = Engine(tiny_lm, batch_size=2).generate(prompts, stop=["\n"], max_new_tokens=8)
    alone = Engine(tiny_lm, batch_size=1).generate(prompts, stop=["\n"], max_new_tokens=8)
    assert [c.text for c in together] == [c.text for c in alone] == [c.text for c in pooled]


def test_generation_cuts_at_stop_string(tiny_llama):
    engine = Engine(tiny_llama)
    prompt = prompt_ids(tiny_llama, TEXTS[0])
    free = engine.generate([prompt], stop=["\x00never"], max_new_tokens=8)[0]
    assert free.stop_reason in ("length", "eos") and len(free.text.strip()) >= 2
    # stop at the completion's own last character
    stop = free.text.strip()[-1]
    cut = engine.generate([prompt], stop=[stop], max_new_tokens=8)[0]
    assert cut.stop_reason == "stop"
    assert cut.text == free.text[: free.text.index(stop, len(free.text) - len(free.text.lstrip()))]
    assert cut.raw.startswith(cut.text + stop)  # the raw completion keeps what was cut


def _decode_from(engine, prompt, forced_first: list[int], stop, max_new_tokens):
    """Decode `prompt` greedily after forcing its first generated token: what the decoder does
    when the model itself picks that token."""
    hidden, mask, positions, cache = engine._prefill([prompt], None)
    pool = _Pool([0], cache, mask, positions[:, -1:], torch.tensor(forced_first))
    decoder = _Decoder(engine, stop, max_new_tokens, 1)
    with torch.inference_mode():
        while pool is not None:
            pool = decoder.step(pool, lambda n: None)
    return decoder.results[0]


def test_a_stop_string_before_any_text_does_not_end_generation(tiny_llama):
    """A base model that answers "\nParis" is judged on "Paris", not cut to nothing."""
    engine = Engine(tiny_llama)
    newline = tiny_llama.encode("\n")
    assert len(newline) == 1
    completion = _decode_from(engine, prompt_ids(tiny_llama, TEXTS[1]), newline, ["\n"], 8)
    assert completion.raw.startswith("\n") and completion.text.startswith("\n")
    assert completion.text.strip()  # generation went on past the leading newline
    assert "\n" not in completion.text.strip()
    assert len(completion.tokens) > 1


def test_stop_strings_apply_after_the_answer_begins():
    from softeval.engine import _first_stop

    assert _first_stop("\n\nB\nC", ["\n"]) == 3
    assert _first_stop("  \n", ["\n"]) is None
    assert _first_stop(" 42\n\nQuestion:", ["\n\n", "Question:"]) == 3


@PREFIXES
def test_loglikelihood_matches_full_forward(tiny_lm, prefix):
    clozes = [
        Cloze(prompt_ids(tiny_lm, prefix + TEXTS[0]), [tiny_lm.encode(" carbon dioxide"), tiny_lm.encode(" oxygen"), tiny_lm.encode(" x")]),
        Cloze(prompt_ids(tiny_lm, prefix + TEXTS[3]), [tiny_lm.encode(" yes"), tiny_lm.encode(" no, not at all really")]),
    ]
    got = Engine(tiny_lm, batch_size=2, logits_chunk=3).loglikelihood(clozes)
    with torch.no_grad():
        expected = [[reference_loglikelihood(tiny_lm, c.context_ids, o) for o in c.continuation_ids] for c in clozes]
    for g_row, e_row in zip(got, expected):
        assert len(g_row) == len(e_row)
        for g, e in zip(g_row, e_row):
            assert abs(g - e) < 1e-3 * max(1.0, abs(e))


def test_rows_joining_a_running_pool_decode_as_if_alone(tiny_lm):
    """A pool that has decoded a few steps takes in a freshly encoded batch of another width."""
    engine = Engine(tiny_lm, batch_size=2)
    long_prompt, short_prompt = prompt_ids(tiny_lm, TEXTS[3]), prompt_ids(tiny_lm, TEXTS[2])
    expected = [engine.generate([p], stop=["\x00never"], max_new_tokens=6)[0].text for p in (long_prompt, short_prompt)]

    def pool_of(index, prompt):
        hidden, mask, positions, cache = engine._prefill([prompt], None)
        return _Pool([index], cache, mask, positions[:, -1:], engine.logits(hidden).argmax(-1))

    decoder = _Decoder(engine, ["\x00never"], 6, 2)
    with torch.inference_mode():
        pool = decoder.step(decoder.step(pool_of(0, long_prompt), lambda n: None), lambda n: None)  # two tokens ahead
        pool = engine._merge(pool, pool_of(1, short_prompt), 6, decoder, lambda n: None)
        # the tiny gemma3 has a 32-token window that the long prompt outgrows: padding would take
        # window slots, so the old pool is finished first; the others join the pool, left-padded
        merged = engine.window != 32
        assert pool.rows == ([0, 1] if merged else [1])
        assert bool(pool.mask[-1, 0] == 0) == merged and (decoder.results[0] is None) == merged
        while pool is not None:
            pool = decoder.step(pool, lambda n: None)
    assert [c.text for c in decoder.results] == expected


def test_an_option_with_no_tokens_scores_minus_infinity(tiny_llama):
    context = prompt_ids(tiny_llama, TEXTS[0])
    option = tiny_llama.encode(" oxygen")
    scores = Engine(tiny_llama).loglikelihood([Cloze(context, [option, [], option])])[0]
    assert scores[1] == float("-inf")
    assert scores[0] == scores[2] == pytest.approx(reference_loglikelihood(tiny_llama, context, option), abs=1e-3)


def test_a_bfloat16_model_takes_a_float32_soft_prompt(tiny_model_dirs):
    """Every tensor the engine builds follows the model's dtype, the soft prompt included."""
    from softeval import load_model
    from softeval.softprompt import initial_vectors

    lm = load_model(str(tiny_model_dirs["llama"]), device="cpu", dtype=torch.bfloat16)
    soft = initial_vectors(lm, 3, "vocab").float()
    prompts = [prompt_ids(lm, t) for t in TEXTS]
    engine = Engine(lm, batch_size=2, soft_prompt=soft)
    completions = engine.generate(prompts, stop=["\n"], max_new_tokens=4)
    scores = engine.loglikelihood([Cloze(prompts[0], [lm.encode(" yes"), lm.encode(" no")])])
    assert len(completions) == 4 and all(math.isfinite(x) for x in scores[0])
