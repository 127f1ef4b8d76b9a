"""The engine against plain transformers computations on tiny random llama and gemma3 models."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from conftest import SHARED, TEXTS, prompt_ids, reference_greedy, reference_loglikelihood
from softeval.engine import Engine
from softeval.engine import decoding as engine_decoding
from softeval.engine import forward as engine_forward
from softeval.engine import generation as engine_generation
from softeval.engine import text as engine_text
from softeval.engine.decoding import Decoder
from softeval.engine.forward import PADDING_SLACK, cut_batches
from softeval.engine.generation import kv_cache_budget
from softeval.engine.logits import LogitTransform
from softeval.errors import SoftevalError
from softeval.models import load_model
from softeval.tasks import Cloze, load_task

PREFIXES = pytest.mark.parametrize("prefix", ["", SHARED], ids=["distinct", "shared-prefix"])


@PREFIXES
def test_generation_matches_uncached_reference(tiny_lm, prefix, loose_padding):
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
def test_generation_is_independent_of_batch(tiny_lm, prefix, loose_padding):
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
    decoder = Decoder(engine.forward, engine.generation.drafts, [prompt], stop, max_new_tokens)
    with torch.inference_mode():
        pool = engine.generation._admit(None, [[0]], [prompt], None, room=max_new_tokens, needed=1)
        pool.next_tokens[:] = torch.tensor(forced_first)
        decoder.record(pool, lambda n: None)
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
    from softeval.engine.text import _first_stop

    assert _first_stop("\n\nB\nC", ["\n"]) == 3
    assert _first_stop("  \n", ["\n"]) is None
    assert _first_stop(" 42\n\nQuestion:", ["\n\n", "Question:"]) == 3


def test_gsm8k_reasoning_in_paragraphs_is_not_cut_before_its_answer():
    from softeval.engine.text import _first_stop

    stop = load_task("gsm8k").stop
    reasoning = " Step 1: 48 / 2 = 24.\n\nStep 2: 48 + 24 = 72.\n#### 72"
    assert _first_stop(reasoning, stop) is None
    assert _first_stop(reasoning + "\n\nQuestion: next", stop) == len(reasoning)
    assert _first_stop(reasoning + " Question: next", stop) == len(reasoning) + 1


def test_a_completion_that_starts_the_next_question_is_cut_to_nothing():
    """Every built-in template asks with "Question:" (or "Problem:"): a model that echoes that
    pattern instead of answering has given no answer, and its echo is never parsed as one."""
    from softeval.engine.text import _first_stop
    from softeval.tasks import builtin_tasks

    for name in builtin_tasks():
        spec = load_task(name)
        label = "Problem:" if "Problem:" in spec.template else "Question:"
        echo = f"\n\n{label} What is the capital of France?\nAnswer: Paris"
        cut = _first_stop(echo, spec.stop)
        assert cut is not None and not echo[:cut].strip(), name


LONG_OPTION = " no, not at all really, not even a little bit, and certainly never on a Sunday afternoon"


def _clozes(lm, prefix: str) -> list[Cloze]:
    """Contexts with options of zero, one and several tokens. Some rows outgrow gemma3's window;
    in the last, a long option comes first, so the next one lies past the window in columns
    but within it in positions, where it would be alone after its context."""
    encode = lm.encode
    return [
        Cloze(prompt_ids(lm, prefix + TEXTS[0]), [encode(" carbon dioxide"), encode(" oxygen"), encode(" x")]),
        Cloze(prompt_ids(lm, prefix + TEXTS[3]), [encode(" yes"), encode(LONG_OPTION)]),
        Cloze(prompt_ids(lm, prefix + TEXTS[1]), [encode(" Paris"), [], encode(" Paris"), encode(" the city of Lyon")]),
        Cloze(prompt_ids(lm, prefix + TEXTS[2]), [encode(LONG_OPTION), encode(" four, or so I was told")]),
    ]


@pytest.fixture
def loose_padding(monkeypatch):
    """Batches that take rows of any width, so the tests' few short rows share padded batches."""
    monkeypatch.setattr(engine_forward, "PADDING_SLACK", 10.0)


def _assert_reference_scores(lm, clozes: list[Cloze], got: list[list[float]], soft: torch.Tensor | None = None):
    with torch.no_grad():
        expected = [[reference_loglikelihood(lm, c.context_ids, o, soft) if o else -math.inf for o in c.continuation_ids] for c in clozes]
    for g_row, e_row in zip(got, expected):
        assert len(g_row) == len(e_row)
        for g, e in zip(g_row, e_row):
            assert g == e if e == -math.inf else abs(g - e) < 1e-3 * max(1.0, abs(e))


@PREFIXES
@pytest.mark.parametrize("with_soft_prompt", [False, True], ids=["plain", "soft-prompt"])
def test_loglikelihood_matches_full_forward(tiny_lm, prefix, with_soft_prompt, loose_padding):
    """Options packed after their context under a tree-shaped mask, in left-padded batches of
    two rows, score as each option does alone after its context in one unpadded forward pass."""
    clozes = _clozes(tiny_lm, prefix)
    soft = torch.randn(3, tiny_lm.model.config.hidden_size, generator=torch.Generator().manual_seed(0)) if with_soft_prompt else None
    batches: list[int] = []
    got = Engine(tiny_lm, batch_size=2, logits_chunk=3, soft_prompt=soft).loglikelihood(clozes, advance=batches.append)
    _assert_reference_scores(tiny_lm, clozes, got, soft)
    assert batches == [2, 2]  # rows of different widths, padded together


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_option_scores_hold_under_eager_attention(tiny_model_dirs, arch, loose_padding):
    """Eager attention adds its mask to the scores: the packed tree mask goes to it as an additive one."""
    lm = load_model(str(tiny_model_dirs[arch]), device="cpu")
    lm.model.set_attn_implementation("eager")
    clozes = _clozes(lm, SHARED)
    _assert_reference_scores(lm, clozes, Engine(lm, batch_size=2).loglikelihood(clozes))


def test_an_attention_kernel_that_ignores_custom_masks_is_refused(tiny_model_dirs):
    lm = load_model(str(tiny_model_dirs["llama"]), device="cpu")
    lm.model.config._attn_implementation_internal = "flash_attention_2"
    with pytest.raises(SoftevalError, match="attention implementation 'flash_attention_2' is not supported; load the model with 'sdpa' or 'eager'"):
        Engine(lm)


def test_rows_joining_a_running_pool_decode_as_if_alone(tiny_lm):
    """A pool that has decoded a few steps takes in a prompt of another width, in a slot of its
    own; on the tiny gemma3 the long prompt has outgrown the 32-token sliding window, which the
    repacked cache's masks still keep exact."""
    engine = Engine(tiny_lm, batch_size=2)
    long_prompt, short_prompt = prompt_ids(tiny_lm, TEXTS[3]), prompt_ids(tiny_lm, TEXTS[2])
    prompts = [long_prompt, short_prompt]
    expected = [engine.generate([p], stop=["\x00never"], max_new_tokens=6)[0] for p in prompts]
    decoder = Decoder(engine.forward, engine.generation.drafts, prompts, ["\x00never"], 6)
    with torch.inference_mode():
        pool = engine.generation._admit(None, [[0]], prompts, None, room=6, needed=1)
        decoder.record(pool, lambda n: None)
        pool = decoder.step(decoder.step(pool, lambda n: None), lambda n: None)  # two tokens ahead
        pool = engine.generation._admit(pool, [[1]], prompts, None, room=6, needed=1)  # no idle slot: repacked
        decoder.record(pool, lambda n: None, rows={1})
        assert pool.rows == [0, 1] and bool(pool.mask[1, 0] == 0)  # the short row is left-padded
        while pool is not None:
            pool = decoder.step(pool, lambda n: None)
    assert [(c.text, c.tokens) for c in decoder.results] == [(c.text, c.tokens) for c in expected]


@PREFIXES
def test_rows_encoded_into_freed_slots_decode_as_if_alone(tiny_lm, prefix):
    """Rows that join a pool with idle slots are encoded straight into them, into scattered
    slots and into a run of slots alike, over what earlier rows left there; the pool's buffer
    is not copied, a shared prefix is not copied into it, and every row's tokens are its tokens
    alone."""
    prompts = [prompt_ids(tiny_lm, prefix + t) for t in TEXTS]
    engine = Engine(tiny_lm)
    expected = [engine.generate([p], stop=["\x00never"], max_new_tokens=6)[0] for p in prompts]
    shared = engine.forward.encode_prefix(prompts, within_window=None)
    assert (shared is not None) == bool(prefix)
    decoder = Decoder(engine.forward, engine.generation.drafts, prompts, ["\x00never"], 6, shared)

    def step(pool):
        return decoder.step(pool, lambda n: None)

    def admit(pool, rows):
        pool = engine.generation._admit(pool, [rows], prompts, shared, room=16, needed=1)
        decoder.record(pool, lambda n: None, rows=set(rows))
        return pool

    with torch.inference_mode():
        pool = admit(None, [3, 0, 1])  # the longest first
        buffer = pool.cache.layers[0].key_room
        # a shared prefix is kept once, apart: the pool holds each row's own tokens only
        assert pool.width == len(prompts[3]) - (0 if shared is None else shared.length)
        pool = step(step(pool))
        # rows 3 and 1 give up their slots 0 and 2 after two tokens, to start again later
        for slot in (0, 2):
            decoder.texts[pool.rows[slot]] = engine_text.TextStream(tiny_lm.tokenizer, ["\x00never"])
            pool.rows[slot] = None
        pool = admit(pool, [1, 2])  # scattered slots
        assert pool.rows == [1, 0, 2]
        while pool.rows[1] is not None:  # until row 0 has its six tokens
            pool = step(pool)
        pool = admit(pool, [3])  # a run of one slot
        assert pool.rows == [1, 3, 2] and pool.cache.layers[0].key_room is buffer
        while pool is not None:
            pool = step(pool)
    assert [(c.text, c.tokens) for c in decoder.results] == [(c.text, c.tokens) for c in expected]


def _greedy_until_eos(lm, prompt: list[int], n: int, soft: torch.Tensor | None = None) -> list[int]:
    """Uncached greedy decoding's tokens, up to the end of sequence (which a completion omits)."""
    tokens = reference_greedy(lm, prompt, n, soft)
    ends = [i for i, t in enumerate(tokens) if t in lm.eos_token_ids]
    return tokens[: ends[0]] if ends else tokens


def test_a_shared_prefix_longer_than_a_sliding_window(tiny_lm):
    """Rows after a shared prefix longer than the tiny gemma3's 32-token window (its sliding
    layers keep the prefix's last slots only) decode as plain greedy decoding does."""
    prompts = [prompt_ids(tiny_lm, SHARED * 3 + t) for t in TEXTS]
    engine = Engine(tiny_lm)
    assert engine.forward.encode_prefix(prompts, within_window=None).length > 32
    completions = engine.generate(prompts, stop=["\x00never"], max_new_tokens=8)
    expected = [_greedy_until_eos(tiny_lm, p, 8) for p in prompts]
    assert [c.tokens for c in completions] == expected


def test_a_soft_prompt_after_a_shared_prefix_with_drafts_decodes_as_greedy_decoding(tiny_lm, monkeypatch):
    """A soft prompt inside a shared prefix longer than the tiny gemma3's window, rows growing
    further past it, drafts kept and rejected: every completion is uncached greedy decoding's."""
    from softeval.tuning import initial_vectors

    soft = initial_vectors(tiny_lm, 3, "vocab")
    prompts = [prompt_ids(tiny_lm, SHARED * 3 + t) for t in TEXTS]
    expected = [_greedy_until_eos(tiny_lm, p, 24, soft) for p in prompts]
    _oracle_drafts(monkeypatch, tiny_lm, prompts, 24, soft)
    engine = Engine(tiny_lm, soft_prompt=soft)
    assert engine.forward.encode_prefix(prompts, within_window=None).length > 32
    completions = engine.generate(prompts, stop=["\x00never"], max_new_tokens=24)
    assert [c.tokens for c in completions] == expected
    assert 0 < engine.generation.drafts.accepted < engine.generation.drafts.proposed


def test_capped_attention_scores_keep_the_shared_prefix_in_each_row(tokenizer_dirs, tmp_path):
    """Gemma 2 caps its attention scores, so it runs eager attention (transformers' SDPA cannot
    cap them), and the shared-prefix attention does not cap either: its rows keep the prefix in
    their own caches, and decode as plain greedy decoding does."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, Gemma2Config

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dirs["gemma3"])
    config = Gemma2Config(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16, sliding_window=32, attn_logit_softcapping=50.0,
        initializer_range=0.3, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    lm = load_model(str(tmp_path), device="cpu")
    prompts = [prompt_ids(lm, SHARED + t) for t in TEXTS]
    engine = Engine(lm)
    assert not engine.generation.prefix_apart and engine.forward.encode_prefix(prompts, within_window=None) is not None
    completions = engine.generate(prompts, stop=["\x00never"], max_new_tokens=6)
    expected = [_greedy_until_eos(lm, p, 6) for p in prompts]
    assert [c.tokens for c in completions] == expected


def _oracle_drafts(monkeypatch, lm, prompts: list[list[int]], n: int, soft: torch.Tensor | None = None) -> None:
    """Drafts taken from each row's true greedy continuation (end of sequence included), with
    a wrong token halfway into every other draft: the engine must keep exactly the right ones."""
    truth = {tuple(p): reference_greedy(lm, p, n, soft) for p in prompts}

    def draft(self, completion: list[int], k: int) -> list[int]:
        tokens = truth[tuple(self.sequence[: self.prompt_length])][len(completion) : len(completion) + k]
        if len(completion) % 2 and len(tokens) > 1:
            tokens[len(tokens) // 2] = (tokens[len(tokens) // 2] + 1) % len(lm.tokenizer)
        return tokens

    monkeypatch.setattr(engine_decoding._PromptLookup, "draft", draft)


def test_drafted_decoding_keeps_the_greedy_tokens(tiny_lm, monkeypatch):
    """Once the queue is drained, decode steps also run draft tokens and keep those the model
    confirms: whichever drafts come, every completion equals uncached greedy decoding, token for
    token. Here drafts are partly right, so some are kept and some rejected (their masked
    columns are dropped later); on the tiny gemma3, rows grow past the 32-token sliding window."""
    prompts = [prompt_ids(tiny_lm, t) for t in TEXTS]
    _oracle_drafts(monkeypatch, tiny_lm, prompts, 24)
    engine = Engine(tiny_lm)
    completions = engine.generate(prompts, stop=["\x00never"], max_new_tokens=24)
    expected = [_greedy_until_eos(tiny_lm, p, 24) for p in prompts]
    assert [c.tokens for c in completions] == expected
    assert 0 < engine.generation.drafts.accepted < engine.generation.drafts.proposed


def test_drafts_end_a_completion_where_plain_decoding_ends_it(tiny_llama, monkeypatch):
    """A stop string, the end of sequence or the token limit inside a run of confirmed drafts
    ends the completion there, as it does one token at a time."""
    prompts = [prompt_ids(tiny_llama, t) for t in TEXTS]
    _oracle_drafts(monkeypatch, tiny_llama, prompts, 24)
    for stop, limit in ((list("aeiou"), 24), (["\x00never"], 13)):
        monkeypatch.setattr(engine_decoding, "DRAFT_POSITIONS", 0)
        plain = Engine(tiny_llama).generate(prompts, stop=stop, max_new_tokens=limit)
        monkeypatch.setattr(engine_decoding, "DRAFT_POSITIONS", 64)
        engine = Engine(tiny_llama)
        drafted = engine.generate(prompts, stop=stop, max_new_tokens=limit)
        assert engine.generation.drafts.accepted > 0
        assert [(c.text, c.tokens, c.stop_reason) for c in drafted] == [(c.text, c.tokens, c.stop_reason) for c in plain]


def test_prompt_lookup_drafts_are_confirmed_on_a_repeating_model(tiny_model_dirs):
    """The tiny gemma3 repeats itself, as small models do on long generations: drafts looked up
    in a row's own text are confirmed, and the completions are plain greedy decoding's."""
    lm = load_model(str(tiny_model_dirs["gemma3-wide"]), device="cpu")
    prompts = [prompt_ids(lm, t) for t in TEXTS]
    engine = Engine(lm)
    completions = engine.generate(prompts, stop=["\x00never"], max_new_tokens=40)
    assert [c.tokens for c in completions] == [reference_greedy(lm, p, 40) for p in prompts]
    assert engine.generation.drafts.accepted > len(prompts) * 10


def test_prompt_lookup_drafts_continue_the_latest_match():
    from softeval.engine.decoding import _PromptLookup

    lookup = _PromptLookup([1, 2, 3, 4])
    assert lookup.draft([1, 2], 5) == [3, 4, 1, 2, 3]  # after "1 2": "3 4", then the pattern again
    assert lookup.draft([1, 2, 9], 3) == []  # 9 never came before
    assert _PromptLookup([5]).draft([5, 5], 4) == [5, 5, 5, 5]
    # the longest match wins: "2 3" last came before 7, "3" last before 8
    assert _PromptLookup([2, 3, 7, 3, 8, 2]).draft([3], 2) == [7, 3]


def _one_at_a_time(monkeypatch, lm, prompts: list[list[int]], stop: list[str], max_new_tokens: int):
    """Each prompt's completion generated alone, without drafts: what pooled rows must reproduce."""
    with monkeypatch.context() as plain:
        plain.setattr(engine_decoding, "DRAFT_POSITIONS", 0)
        return [Engine(lm, batch_size=1).generate([p], stop=stop, max_new_tokens=max_new_tokens)[0] for p in prompts]


def _record_pools(monkeypatch) -> list[tuple[int, int, int, int]]:
    """(rows finished, live rows, slots, KV positions held) at every decode step of any engine."""
    seen: list[tuple[int, int, int, int]] = []
    step = Decoder.step

    def recording(self, pool, advance, speculate=False):
        room = pool.cache.layers[0].key_room.shape[2]
        finished = sum(r is not None for r in self.results)
        seen.append((finished, pool.live, len(pool.rows), len(pool.rows) * room))
        return step(self, pool, advance, speculate)

    monkeypatch.setattr(Decoder, "step", recording)
    return seen


@pytest.mark.parametrize("stop", [list("aeiou"), ["\x00never"]], ids=["stops", "length"])
def test_rows_join_as_others_finish_without_changing_outputs(tiny_lm, stop, monkeypatch):
    """Continuous batching: with a pool of 4 rows, each freed slot is refilled at once, so every
    decode step runs 4 rows until the queue drains; every row's tokens equal its tokens alone."""
    prompts = [prompt_ids(tiny_lm, t) for t in TEXTS * 3]
    alone = _one_at_a_time(monkeypatch, tiny_lm, prompts, stop, max_new_tokens=9)
    steps = _record_pools(monkeypatch)
    pooled = Engine(tiny_lm, batch_size=4).generate(prompts, stop=stop, max_new_tokens=9)
    assert [(c.text, c.tokens, c.stop_reason) for c in pooled] == [(c.text, c.tokens, c.stop_reason) for c in alone]
    queued = [live for finished, live, _, _ in steps if finished + live < len(prompts)]
    assert all(live == 4 for live in queued)
    if stop == ["\x00never"]:  # every row takes 9 tokens: steps run while rows wait
        assert queued
    else:  # rows stopped at different steps, and others took their slots
        assert len({len(c.tokens) for c in alone}) > 1
        assert len(steps) < sum(len(c.tokens) for c in alone) / 2


def test_rows_that_end_at_their_first_token_take_no_decode_step(tiny_lm, monkeypatch):
    """A letter answer often ends at its first token, chosen from the prompt's encoding: such
    rows free their slot at once for the next prompts, and no decode step runs for them."""
    prompts = [prompt_ids(tiny_lm, t) for t in TEXTS * 3]
    alone = _one_at_a_time(monkeypatch, tiny_lm, prompts, ["\x00never"], max_new_tokens=1)
    steps = _record_pools(monkeypatch)
    pooled = Engine(tiny_lm, batch_size=4).generate(prompts, stop=["\x00never"], max_new_tokens=1)
    assert [(c.tokens, c.stop_reason) for c in pooled] == [(c.tokens, c.stop_reason) for c in alone]
    assert all(len(c.tokens) == 1 for c in alone) and steps == []


def test_rows_take_the_slots_of_rows_that_ended_at_their_first_token(tiny_lm, monkeypatch):
    """Some prompts end at their first token (a stop string is its text), others run on: the
    slots the first free are filled before the next decode step, so every step while prompts
    are queued runs a full pool, and every row's tokens are its tokens alone."""
    prompts = [prompt_ids(tiny_lm, t) for t in TEXTS * 3]
    free = _one_at_a_time(monkeypatch, tiny_lm, prompts[:4], ["\x00never"], max_new_tokens=9)
    firsts = [tiny_lm.tokenizer.decode(c.tokens[:1]).strip() for c in free]
    stop = [next(text for text in firsts if text)]
    alone = _one_at_a_time(monkeypatch, tiny_lm, prompts, stop, max_new_tokens=9)
    lengths = [len(c.tokens) for c in alone]
    assert 1 in lengths and max(lengths) > 1  # rows of both kinds
    steps = _record_pools(monkeypatch)
    pooled = Engine(tiny_lm, batch_size=4).generate(prompts, stop=stop, max_new_tokens=9)
    assert [(c.text, c.tokens, c.stop_reason) for c in pooled] == [(c.text, c.tokens, c.stop_reason) for c in alone]
    queued = [live for finished, live, _, _ in steps if finished + live < len(prompts)]
    assert queued and all(live == 4 for live in queued)


def test_a_head_that_is_not_a_plain_linear_layer_computes_its_own_logits(tiny_llama):
    """A hooked (or quantized) LM head is run as a module, not sliced by its weight."""
    engine = Engine(tiny_llama)
    head = tiny_llama.model.get_output_embeddings()
    hidden = torch.randn(3, head.in_features)
    target = torch.tensor([5, 6, 7])
    hook = head.register_forward_hook(lambda module, args, out: torch.nn.functional.one_hot(target, out.shape[-1]).to(out.dtype) * 1e4)
    try:
        with torch.inference_mode():
            assert engine.forward.greedy(hidden).tolist() == [5, 6, 7]
    finally:
        hook.remove()
    with torch.inference_mode():
        assert engine.forward.greedy(hidden).tolist() == head(hidden).argmax(-1).tolist()


def test_idle_slots_are_dropped_and_the_cache_stays_in_budget(tiny_llama, monkeypatch):
    prompts = [prompt_ids(tiny_llama, t) for t in TEXTS * 4]
    steps = _record_pools(monkeypatch)
    idle_positions_moved = []
    step = Decoder.step

    def checking(self, pool, advance, speculate=False):
        idle = [slot for slot, row in enumerate(pool.rows) if row is None]
        before = pool.positions.clone()
        fed = []  # the positions the step runs the model at
        forward = self.forward.run
        with monkeypatch.context() as spying:
            spying.setattr(self.forward, "run", lambda *args: fed.append(args[2]) or forward(*args))
            after = step(self, pool, advance, speculate)
        if idle:  # an idle slot's position stays: only live rows advance
            idle_positions_moved.append(bool((fed[0][idle] != before[idle]).any()))
            if after is not None:
                idle_positions_moved.append(bool((after.positions[idle] != before[idle]).any()))
        return after

    monkeypatch.setattr(Decoder, "step", checking)
    monkeypatch.setattr(engine_generation, "JOIN_SHARE", 2 / 3)  # slots idle while rows wait to join
    engine = Engine(tiny_llama, batch_size=8)
    engine.generation.kv_positions = 4 * (max(map(len, prompts)) + 8)  # about four rows
    alone = _one_at_a_time(monkeypatch, tiny_llama, prompts, ["."], max_new_tokens=8)
    completions = engine.generate(prompts, stop=["."], max_new_tokens=8)
    assert [c.tokens for c in completions] == [c.tokens for c in alone]
    assert max(held for *_, held in steps) <= engine.generation.kv_positions
    assert max(slots for _, _, slots, _ in steps) > 1
    # once the queue is drained, a pool is never more than half idle
    drained = [(live, slots) for finished, live, slots, _ in steps if finished + live == len(prompts)]
    assert drained and all(slots - live <= live for live, slots in drained)
    assert idle_positions_moved and not any(idle_positions_moved)


def test_the_kv_budget_follows_the_memory_free_on_the_machine(tiny_llama, monkeypatch):
    prompts = [prompt_ids(tiny_llama, t) for t in TEXTS * 4]
    alone = _one_at_a_time(monkeypatch, tiny_llama, prompts, ["."], max_new_tokens=8)
    config = tiny_llama.model.config  # keys and values of every layer's key/value heads, in fp32
    token_bytes = 2 * config.num_hidden_layers * config.num_key_value_heads * (config.hidden_size // config.num_attention_heads) * 4
    per_row = (max(map(len, prompts)) + 8 + 8) * token_bytes
    monkeypatch.setattr(engine_generation, "KV_CACHE_BYTES_MIN", 1)
    monkeypatch.setattr(engine_generation, "kept_free_bytes", lambda: 0)
    widest = {}
    for rows in (3, 12):  # the pool the free memory allows: a quarter of it holds `rows` rows
        free = SimpleNamespace(available=4 * rows * per_row)
        monkeypatch.setattr(engine_generation.psutil, "virtual_memory", lambda: free)
        engine = Engine(tiny_llama)
        assert engine.generation.kv_cache_bytes == rows * per_row
        steps = _record_pools(monkeypatch)
        completions = engine.generate(prompts, stop=["."], max_new_tokens=8)
        assert [c.tokens for c in completions] == [c.tokens for c in alone]
        widest[rows] = max(slots for _, _, slots, _ in steps)
    assert widest[3] == 3 and widest[12] == 12
    # bounds: a machine short of memory still decodes rows, a large one does not hand them all
    monkeypatch.setattr(engine_generation.psutil, "virtual_memory", lambda: SimpleNamespace(available=0))
    assert kv_cache_budget(torch.device("cpu")) == engine_generation.KV_CACHE_BYTES_MIN
    monkeypatch.setattr(engine_generation.psutil, "virtual_memory", lambda: SimpleNamespace(available=1 << 50))
    assert kv_cache_budget(torch.device("cpu")) == engine_generation.KV_CACHE_BYTES_MAX


def test_a_gpu_budget_counts_the_blocks_pytorch_keeps_cached_as_free(monkeypatch):
    # 8 GiB free on the device, of which PyTorch holds 6 GiB reserved with 2 GiB in use
    gib = 1 << 30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (8 * gib, 80 * gib))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 6 * gib)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 2 * gib)
    assert kv_cache_budget(torch.device("cuda", 0)) == 3 * gib  # a quarter of 8 + 4


def test_a_pool_keeps_its_slots_while_prompts_are_queued(tiny_llama, monkeypatch):
    """A pool whose cache runs out of room is repacked with new room; while prompts are still
    queued, it keeps its idle slots for them (too few to join yet), so the pool does not shrink
    at every repack."""
    monkeypatch.setattr(engine_generation, "DECODE_ROOM", 3)
    # numbered prompts stop one by one ("x" is rare), copies of a prompt all at once
    prompts = [prompt_ids(tiny_llama, f"{i}. {TEXTS[i % len(TEXTS)]}") for i in range(96)]
    alone = _one_at_a_time(monkeypatch, tiny_llama, prompts, ["x"], max_new_tokens=24)
    steps = _record_pools(monkeypatch)
    completions = Engine(tiny_llama, batch_size=64).generate(prompts, stop=["x"], max_new_tokens=24)
    assert [c.tokens for c in completions] == [c.tokens for c in alone]
    queued = [(live, slots) for finished, live, slots, _ in steps if finished + live < len(prompts)]
    assert any(live < slots for live, slots in queued)  # idle slots waited for rows to join
    assert all(slots == 64 for _, slots in queued)

def test_streamed_text_is_the_decoding_of_all_tokens(tokenizer_dirs):
    """The incremental text equals a full decode after every token, on random token streams that
    include byte pieces (characters split across tokens) and special tokens, for both real
    tokenizers; a stop string ends the stream exactly where a full decode first shows it."""
    import random

    from transformers import AutoTokenizer

    from softeval.engine.text import TextStream, _first_stop

    rng = random.Random(0)
    for folder in tokenizer_dirs.values():
        tokenizer = AutoTokenizer.from_pretrained(folder)
        pieces = tokenizer.encode("Paris\n\nQuestion: 42 café — 東京 😀 x=1.5", add_special_tokens=False)
        pool = pieces + list(tokenizer.all_special_ids) + [rng.randrange(len(tokenizer)) for _ in range(50)]
        for _ in range(40):
            stream = TextStream(tokenizer, ["\n\n", "Question:"])
            for _ in range(60):
                stopped = stream.append(rng.choice(pool))
                full = tokenizer.decode(stream.tokens, skip_special_tokens=True)
                assert stream.latest == full
                assert stopped == (_first_stop(full, ["\n\n", "Question:"]) is not None)
                if stopped:
                    break


def test_an_option_with_no_tokens_scores_minus_infinity(tiny_llama):
    context = prompt_ids(tiny_llama, TEXTS[0])
    option = tiny_llama.encode(" oxygen")
    scores = Engine(tiny_llama).loglikelihood([Cloze(context, [option, [], option])])[0]
    assert scores[1] == float("-inf")
    assert scores[0] == scores[2] == pytest.approx(reference_loglikelihood(tiny_llama, context, option), abs=1e-3)


def test_a_bfloat16_model_takes_a_float32_soft_prompt(tiny_model_dirs):
    """Every tensor the engine builds follows the model's dtype, the soft prompt included."""
    from softeval import load_model
    from softeval.tuning import initial_vectors

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
    batches = cut_batches(order, lengths, batch_size=8, token_budget=256)
    assert batches[0] == [20]
    # the last row of 30 tokens does not pad rows of 12 to its width
    assert [len(b) for b in batches[1:]] == [8, 1, 8, 8, 4]
    assert [i for batch in batches for i in batch] == order  # consecutive, longest first
    assert all(len(b) * max(lengths[i] for i in b) <= 256 for b in batches)


def test_batches_waste_little_on_padding():
    lengths = list(range(100, 20, -1))
    batches = cut_batches(list(range(len(lengths))), lengths, batch_size=1000, token_budget=10**6)
    for batch, after in zip(batches, batches[1:] + [[]]):
        padded, tokens = len(batch) * max(lengths[i] for i in batch), sum(lengths[i] for i in batch)
        assert padded <= (1 + PADDING_SLACK) * tokens
        if after:  # a batch ends only where the next row would pad it too much
            assert (len(batch) + 1) * lengths[batch[0]] > (1 + PADDING_SLACK) * (tokens + lengths[after[0]])


def test_the_budget_cuts_batches_below_the_batch_size():
    assert cut_batches([0, 1, 2, 3, 4], [100] * 5, batch_size=8, token_budget=256) == [[0, 1], [2, 3], [4]]
    # a row wider than the budget still runs, alone
    assert cut_batches([0, 1, 2], [300, 10, 10], batch_size=8, token_budget=256) == [[0], [1, 2]]


def test_the_soft_prompt_counts_toward_the_budget(tiny_llama):
    hidden = tiny_llama.model.get_input_embeddings().weight.shape[1]
    plain = Engine(tiny_llama, batch_size=8, token_budget=256)
    soft = Engine(tiny_llama, batch_size=8, token_budget=256, soft_prompt=torch.zeros(16, hidden))
    assert plain.forward.length_buckets([120, 118, 110]) == [[0, 1], [2]]
    assert soft.forward.length_buckets([120, 118, 110]) == [[0], [1], [2]]


def _long_prompt(lm, n: int = 220) -> list[int]:
    """A prompt near the tiny models' 256-token context, leaving room for new tokens."""
    ids = prompt_ids(lm, " ".join([TEXTS[3]] * 12))
    assert len(ids) > n
    return ids[:n]


def _record_forwards(engine: Engine) -> list[int]:
    """Positions (rows x attended width, cache included) of every forward pass the engine runs on
    more than one new token per row: prefills and option batches (decode steps have a KV budget)."""
    seen: list[int] = []
    forward = engine.forward.run

    def recording(embeds, mask, positions, cache, prefix=None, **options):
        if embeds.shape[1] > 1:
            keys = next(iter(mask.values())) if isinstance(mask, dict) else mask  # (rows, [1, queries,] keys)
            seen.append(keys.shape[0] * keys.shape[-1])
        return forward(embeds, mask, positions, cache, prefix, **options)

    engine.forward.run = recording
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
    assert batched.forward.positions_computed <= 1.2 * alone.forward.positions_computed

    alone.forward.positions_computed = batched.forward.positions_computed = 0
    expected_scores = alone.loglikelihood(clozes)
    scores = batched.loglikelihood(clozes)
    for got, want in zip(scores, expected_scores):
        assert got == pytest.approx(want, rel=1e-4, abs=1e-4)
    assert batched.forward.positions_computed <= 1.2 * alone.forward.positions_computed
    assert max(forwards) <= 256  # prefills and option batches alike


def _record_steps(monkeypatch) -> list[SimpleNamespace]:
    """At every decode step of any engine: the live rows, the pool's width, whether drafts run
    and how many rows have finished."""
    seen: list[SimpleNamespace] = []
    step = Decoder.step

    def recording(self, pool, advance, speculate=False):
        rows = [row for row in pool.rows if row is not None]
        finished = sum(r is not None for r in self.results)
        seen.append(SimpleNamespace(rows=rows, width=pool.width, speculate=speculate, finished=finished))
        return step(self, pool, advance, speculate)

    monkeypatch.setattr(Decoder, "step", recording)
    return seen


def test_short_rows_do_not_decode_in_a_long_rows_pool(tiny_lm, monkeypatch):
    """Every row of a pool holds the pool's width: short prompts wait for a pool of their own
    rather than join one many times as wide as they can ever grow (POOL_WIDTH_RATIO), and decode
    as they would alone."""
    prompts = [prompt_ids(tiny_lm, t) for t in TEXTS * 2]
    prompts.insert(3, _long_prompt(tiny_lm))
    alone = _one_at_a_time(monkeypatch, tiny_lm, prompts, ["\x00never"], max_new_tokens=8)
    steps = _record_steps(monkeypatch)
    completions = Engine(tiny_lm, batch_size=4).generate(prompts, stop=["\x00never"], max_new_tokens=8)
    assert [c.tokens for c in completions] == [c.tokens for c in alone]
    own = {i: len(p) + 8 for i, p in enumerate(prompts)}  # the most columns each row can take
    assert 4 * max(own[i] for i in range(len(prompts)) if i != 3) < own[3]  # no short row fits with it
    with_long = [step.rows for step in steps if 3 in step.rows]
    assert with_long and all(rows == [3] for rows in with_long)
    assert all(step.width <= engine_generation.POOL_WIDTH_RATIO * min(own[i] for i in step.rows) + 8 for step in steps)
    assert any(len(step.rows) == 4 for step in steps)  # the short rows still share pools


def test_a_pool_no_queued_prompt_may_join_runs_drafts(tiny_lm, monkeypatch):
    """While the queued prompts are too narrow to join it, a long row's pool decodes as if the
    queue were drained: its steps run drafts, and the completions stay greedy decoding's."""
    prompts = [prompt_ids(tiny_lm, t) for t in TEXTS]
    prompts.insert(1, _long_prompt(tiny_lm))
    _oracle_drafts(monkeypatch, tiny_lm, prompts, 10)
    steps = _record_steps(monkeypatch)
    completions = Engine(tiny_lm, batch_size=4).generate(prompts, stop=["\x00never"], max_new_tokens=10)
    assert [c.tokens for c in completions] == [_greedy_until_eos(tiny_lm, p, 10) for p in prompts]
    long_steps = [step for step in steps if 1 in step.rows]
    assert long_steps and all(step.speculate for step in long_steps)
    assert all(step.finished == 0 for step in long_steps)  # the short prompts were still queued


def test_a_long_row_that_ends_at_its_first_token_leaves_no_empty_pool(tiny_lm, monkeypatch):
    """Rows that end at their first token leave their pool empty; a pool the next queued prompt
    may not join is dropped, and the short prompts get one of their own."""
    prompts = [prompt_ids(tiny_lm, t) for t in TEXTS * 2]
    prompts.insert(3, _long_prompt(tiny_lm))
    alone = _one_at_a_time(monkeypatch, tiny_lm, prompts, ["\x00never"], max_new_tokens=1)
    completions = Engine(tiny_lm, batch_size=4).generate(prompts, stop=["\x00never"], max_new_tokens=1)
    assert [c.tokens for c in completions] == [c.tokens for c in alone]


@pytest.mark.parametrize("transform", [LogitTransform(), LogitTransform(softcap=2.0), LogitTransform(scale=0.25, softcap=2.0)],
                         ids=["plain", "softcapped", "scaled-and-softcapped"])
def test_greedy_tokens_by_vocabulary_slices_are_the_full_argmax(monkeypatch, transform):
    """Slice by slice, the LM head picks what the argmax of its full logits picks, the first
    index among equal logits included (here across slices, and where a softcap saturates)."""
    from softeval.engine.forward import _argmax_by_vocab_chunks

    monkeypatch.setattr(engine_forward, "VOCAB_CHUNK", 16)
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 50, bias=True)  # 50 entries: three full slices and a short one
    with torch.no_grad():
        head.weight[40] = head.weight[3]  # equal logits in two slices
        head.bias[40] = head.bias[3]
    hidden = torch.cat([torch.randn(6, 8), torch.zeros(1, 8), 100 * head.weight[3:4]])
    logits = head(hidden) * transform.scale
    if transform.softcap:
        logits = torch.tanh(logits / transform.softcap) * transform.softcap
    expected = logits.argmax(-1)
    assert _argmax_by_vocab_chunks(hidden, head, transform).tolist() == expected.tolist()
    assert expected[-1] == 3  # the tie went to the first
