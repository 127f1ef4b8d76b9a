"""The engine against plain transformers computations on tiny random llama and gemma3 models."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import SHARED, TEXTS, prompt_ids, reference_greedy, reference_loglikelihood

from softeval.engine import Engine, _batches, _Decoder, _Pool
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


# --- a token budget per batch ------------------------------------------------------------------------


def test_a_long_row_sits_alone_and_short_rows_fill_batches():
    lengths = [12] * 20 + [240] + [30] * 9
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches = _batches(order, lengths, batch_size=8, token_budget=256)
    assert batches[0] == [20]
    assert [len(b) for b in batches[1:]] == [8, 8, 8, 5]
    assert [i for batch in batches for i in batch] == order  # consecutive, longest first
    assert all(len(b) * max(lengths[i] for i in b) <= 256 for b in batches)


def test_the_budget_cuts_batches_below_the_batch_size():
    assert _batches([0, 1, 2, 3, 4], [100] * 5, batch_size=8, token_budget=256) == [[0, 1], [2, 3], [4]]
    # a row wider than the budget still runs, alone
    assert _batches([0, 1, 2], [300, 10, 10], batch_size=8, token_budget=256) == [[0], [1, 2]]


def test_the_soft_prompt_counts_toward_the_budget(tiny_llama):
    hidden = tiny_llama.model.get_input_embeddings().weight.shape[1]
    plain = Engine(tiny_llama, batch_size=8, token_budget=256)
    soft = Engine(tiny_llama, batch_size=8, token_budget=256, soft_prompt=torch.zeros(16, hidden))
    assert plain._length_buckets([120, 10, 10]) == [[0, 1], [2]]
    assert soft._length_buckets([120, 10, 10]) == [[0], [1, 2]]


def _long_prompt(lm, n: int = 220) -> list[int]:
    """A prompt near the tiny models' 256-token context, leaving room for new tokens."""
    ids = prompt_ids(lm, " ".join([TEXTS[3]] * 12))
    assert len(ids) > n
    return ids[:n]


def _record_forwards(engine: Engine) -> list[int]:
    """Positions (rows x attended width, cache included) of every forward pass the engine runs."""
    seen: list[int] = []
    forward = engine._forward

    def recording(embeds, mask, positions, cache):
        seen.append(mask.shape[0] * mask.shape[1])
        return forward(embeds, mask, positions, cache)

    engine._forward = recording
    return seen


def test_one_long_prompt_costs_about_what_it_costs_alone(tiny_lm):
    """A prompt near the context length among short ones: the same results as batch size 1, for
    about the same work, instead of every row of its batch padded to its width."""
    prompts = [prompt_ids(tiny_lm, t) for t in TEXTS * 2]
    prompts.insert(3, _long_prompt(tiny_lm))
    options = [tiny_lm.encode(o) for o in (" yes", " no, not at all", " maybe so", " certainly not")]
    clozes = [Cloze(p, options) for p in prompts]
    alone = Engine(tiny_lm, batch_size=1)
    batched = Engine(tiny_lm, batch_size=4, token_budget=256)
    forwards = _record_forwards(batched)

    expected = alone.generate(prompts, stop=["\n"], max_new_tokens=8)
    completions = batched.generate(prompts, stop=["\n"], max_new_tokens=8)
    assert [c.text for c in completions] == [c.text for c in expected]
    assert [c.tokens for c in completions] == [c.tokens for c in expected]
    # padding to the long row would be 4 x 220 positions in its batch alone
    assert batched.positions_computed <= 1.2 * alone.positions_computed

    alone.positions_computed = batched.positions_computed = 0
    expected_scores = alone.loglikelihood(clozes)
    scores = batched.loglikelihood(clozes)
    for got, want in zip(scores, expected_scores):
        assert got == pytest.approx(want, rel=1e-4, abs=1e-4)
    assert batched.positions_computed <= 1.2 * alone.positions_computed
    assert max(forwards) <= 256  # prefills, decode steps and option groups alike


def test_a_long_row_finishes_before_short_rows_join_its_pool(tiny_llama):
    """Short rows do not join a pool holding a long row: their caches would be padded to its width."""
    engine = Engine(tiny_llama, batch_size=4, token_budget=256)
    long_prompt = _long_prompt(tiny_llama)
    shorts = [prompt_ids(tiny_llama, t) for t in TEXTS[:3]]
    expected = [engine.generate([p], stop=["\x00never"], max_new_tokens=6)[0].text for p in [long_prompt, *shorts]]

    decoder = _Decoder(engine, ["\x00never"], 6, 4)
    with torch.inference_mode():
        hidden, mask, positions, cache = engine._prefill([long_prompt], None)
        pool = _Pool([0], cache, mask, positions[:, -1:], engine.logits(hidden).argmax(-1))
        pool = decoder.step(pool, lambda n: None)
        hidden, mask, positions, cache = engine._prefill(shorts, None)
        arrivals = _Pool([1, 2, 3], cache, mask, positions[:, -1:], engine.logits(hidden).argmax(-1))
        pool = engine._merge(pool, arrivals, 6, decoder, lambda n: None)
        assert pool.rows == [1, 2, 3] and pool.mask.shape[1] < 64
        assert decoder.results[0] is not None  # the long row finished first
        while pool is not None:
            pool = decoder.step(pool, lambda n: None)
    assert [c.text for c in decoder.results] == expected
