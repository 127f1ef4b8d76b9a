"""The engine against plain transformers computations on tiny random llama and gemma3 models."""

from __future__ import annotations

import pytest
import torch

from softeval.engine import Engine
from softeval.prompts import Cloze

TEXTS = [
    "Question: Which gas do plants take in?\nAnswer:",
    "The capital of France is",
    "Q: 2 + 2 =",
    "A much longer prompt that goes on for a while, so that the batch needs left padding to line up. Answer:",
]


# prompts that start alike exercise the engine's shared-prefix path
SHARED = "Answer each of the following questions as briefly and as accurately as you can.\n\n"
PREFIXES = pytest.mark.parametrize("prefix", ["", SHARED], ids=["distinct", "shared-prefix"])


def _prompt_ids(lm, text):
    ids = lm.encode(text)
    return [lm.bos_token_id, *ids] if lm.bos_token_id is not None else ids


def _reference_greedy(lm, ids, n):
    """Greedy decoding by full forward passes without cache, one prompt at a time."""
    seq = list(ids)
    for _ in range(n):
        logits = lm.model(torch.tensor([seq])).logits[0, -1]
        seq.append(int(logits.argmax()))
    return seq[len(ids) :]


@PREFIXES
def test_generation_matches_uncached_reference(tiny_lm, prefix):
    # batches of 2: rows of the first batch still running are pooled with the second
    engine = Engine(tiny_lm, batch_size=2)
    prompts = [_prompt_ids(tiny_lm, prefix + t) for t in TEXTS]
    with torch.no_grad():
        expected = [_reference_greedy(tiny_lm, p, 6) for p in prompts]
    completions = engine.generate(prompts, stop=["\x00never"], max_new_tokens=6)
    for completion, tokens in zip(completions, expected):
        eos = [i for i, t in enumerate(tokens) if t in tiny_lm.eos_token_ids]
        tokens = tokens[: eos[0]] if eos else tokens
        assert completion.text == tiny_lm.tokenizer.decode(tokens, skip_special_tokens=True)


@PREFIXES
def test_generation_is_independent_of_batch(tiny_lm, prefix):
    prompts = [_prompt_ids(tiny_lm, prefix + t) for t in TEXTS]
    together = Engine(tiny_lm, batch_size=4).generate(prompts, stop=["\n"], max_new_tokens=8)
    pooled = Engine(tiny_lm, batch_size=2).generate(prompts, stop=["\n"], max_new_tokens=8)
    alone = Engine(tiny_lm, batch_size=1).generate(prompts, stop=["\n"], max_new_tokens=8)
    assert [c.text for c in together] == [c.text for c in alone] == [c.text for c in pooled]


def test_generation_cuts_at_stop_string(tiny_llama):
    engine = Engine(tiny_llama)
    prompt = _prompt_ids(tiny_llama, TEXTS[0])
    free = engine.generate([prompt], stop=["\x00never"], max_new_tokens=8)[0]
    assert free.stop_reason in ("length", "eos")
    if len(free.text) >= 2:  # stop at the completion's own second character
        stop = free.text[1]
        cut = engine.generate([prompt], stop=[stop], max_new_tokens=8)[0]
        assert cut.stop_reason == "stop"
        assert cut.text == free.text[: free.text.index(stop)]


def _reference_loglikelihood(lm, context, continuation):
    ids = torch.tensor([context + continuation])
    logprobs = torch.log_softmax(lm.model(ids).logits[0].float(), dim=-1)
    return sum(float(logprobs[len(context) - 1 + j, t]) for j, t in enumerate(continuation))


@PREFIXES
def test_loglikelihood_matches_full_forward(tiny_lm, prefix):
    clozes = [
        Cloze(_prompt_ids(tiny_lm, prefix + TEXTS[0]), [tiny_lm.encode(" carbon dioxide"), tiny_lm.encode(" oxygen"), tiny_lm.encode(" x")]),
        Cloze(_prompt_ids(tiny_lm, prefix + TEXTS[3]), [tiny_lm.encode(" yes"), tiny_lm.encode(" no, not at all really")]),
    ]
    got = Engine(tiny_lm, batch_size=2, logits_chunk=3).loglikelihood(clozes)
    with torch.no_grad():
        expected = [[_reference_loglikelihood(tiny_lm, c.context_ids, o) for o in c.continuation_ids] for c in clozes]
    for g_row, e_row in zip(got, expected):
        assert len(g_row) == len(e_row)
        for g, e in zip(g_row, e_row):
            assert abs(g - e) < 1e-3 * max(1.0, abs(e))


def test_rows_joining_a_running_pool_decode_as_if_alone(tiny_lm):
    """A pool that has decoded a few steps takes in a freshly encoded batch of another width."""
    from softeval.engine import _Decoder, _Pool

    engine = Engine(tiny_lm, batch_size=2)
    long_prompt, short_prompt = _prompt_ids(tiny_lm, TEXTS[3]), _prompt_ids(tiny_lm, TEXTS[2])
    expected = [engine.generate([p], stop=["\x00never"], max_new_tokens=6)[0].text for p in (long_prompt, short_prompt)]

    def pool_of(index, prompt):
        hidden, mask, positions, cache = engine._prefill([prompt], None)
        return _Pool([index], cache, mask, positions[:, -1:], engine.logits(hidden).argmax(-1))

    decoder = _Decoder(engine, ["\x00never"], 6, 2)
    with torch.inference_mode():
        pool = decoder.step(decoder.step(pool_of(0, long_prompt), lambda n: None), lambda n: None)  # two tokens ahead
        fits_window = engine.window is None or pool.mask.shape[1] + 6 <= engine.window
        pool = engine._merge(pool, pool_of(1, short_prompt), 6, decoder, lambda n: None)
        if fits_window:
            assert len(pool.rows) == 2 and pool.mask[1, 0] == 0  # the newcomer is padded on the left
        else:  # padding would take sliding-window slots: the old pool finished first
            assert pool.rows == [1] and decoder.results[0] is not None
        while pool is not None:
            pool = decoder.step(pool, lambda n: None)
    assert [c.text for c in decoder.results] == expected
