"""Gemma 3 checkpoints of 4B and up load as the multimodal Gemma3ForConditionalGeneration, whose
config keeps the text settings (sliding window, context length, logit softcap) under text_config.

Its forward does not apply the text config's final softcap (Gemma3ForCausalLM's does). Released
checkpoints set none; here one is set, so the fast path, which applies it, computes other logits
than the model's own forward: the self-check sends the model to the reference path, whose scores
are the model's own. (Without a softcap it runs fast: see the conformance suite.)"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer, Gemma3Config, Gemma3ForConditionalGeneration, SiglipVisionConfig

from conftest import SHARED, TEXTS, prompt_ids, tiny_config
from softeval.engine import Engine, ReferenceEngine, start_engine
from softeval.engine.selfcheck import check_model
from softeval.models import load_model
from softeval.tasks import Cloze

WINDOW, CONTEXT, SOFTCAP = 32, 256, 10.0
NEW_TOKENS = 10
PREFIXES = pytest.mark.parametrize("prefix", ["", SHARED], ids=["distinct", "shared-prefix"])


@pytest.fixture(scope="module")
def multimodal_lm(tokenizer_dirs, tmp_path_factory):
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dirs["gemma3"])
    text = tiny_config("gemma3", len(tokenizer), tokenizer, WINDOW)
    text.final_logit_softcapping = SOFTCAP
    vision = SiglipVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=28, patch_size=14
    )
    config = Gemma3Config(text_config=text.to_dict(), vision_config=vision.to_dict(), mm_tokens_per_image=4)
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("tiny-gemma3-multimodal")
    Gemma3ForConditionalGeneration(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return load_model(str(folder), device="cpu")


def _reference_logits(lm, ids: list[int]) -> torch.Tensor:
    """The model's own full forward without cache."""
    return lm.model(torch.tensor([ids])).logits[0].float()


def test_text_settings_come_from_the_text_config(multimodal_lm):
    assert type(multimodal_lm.model) is Gemma3ForConditionalGeneration
    assert multimodal_lm.context_length == CONTEXT
    engine = Engine(multimodal_lm)
    assert engine.forward.window == WINDOW
    assert engine.forward.transform.softcap == SOFTCAP


def test_a_softcap_its_forward_does_not_apply_sends_it_to_the_reference_path(multimodal_lm):
    verdict = check_model(multimodal_lm)
    assert verdict.path == "reference"
    assert verdict.reason.startswith("the fast path's next-token log-probabilities differ from the model's own forward")
    assert isinstance(start_engine(multimodal_lm), ReferenceEngine)


def test_generation_matches_uncached_reference(multimodal_lm):
    lm = multimodal_lm
    prompts = [prompt_ids(lm, SHARED + t) for t in TEXTS]
    assert max(map(len, prompts)) > WINDOW
    expected = []
    with torch.no_grad():
        for p in prompts:
            seq = list(p)
            for _ in range(NEW_TOKENS):
                seq.append(int(_reference_logits(lm, seq)[-1].argmax()))
            expected.append(seq[len(p) :])
    completions = start_engine(lm, batch_size=2).generate(prompts, stop=["\x00never"], max_new_tokens=NEW_TOKENS)
    for completion, tokens in zip(completions, expected):
        eos = [i for i, t in enumerate(tokens) if t in lm.eos_token_ids]
        tokens = tokens[: eos[0]] if eos else tokens
        assert completion.text == lm.tokenizer.decode(tokens, skip_special_tokens=True)


@PREFIXES
def test_loglikelihood_matches_full_forward(multimodal_lm, prefix):
    lm = multimodal_lm
    clozes = [
        Cloze(prompt_ids(lm, prefix + TEXTS[0]), [lm.encode(" carbon dioxide"), lm.encode(" oxygen"), lm.encode(" x")]),
        Cloze(prompt_ids(lm, prefix + TEXTS[3]), [lm.encode(" yes"), lm.encode(" no, not at all really")]),
    ]
    got = start_engine(lm, batch_size=2).loglikelihood(clozes)
    with torch.no_grad():
        expected = []
        for c in clozes:
            row = []
            for option in c.continuation_ids:
                logprobs = torch.log_softmax(_reference_logits(lm, c.context_ids + option), dim=-1)
                row.append(sum(float(logprobs[len(c.context_ids) - 1 + j, t]) for j, t in enumerate(option)))
            expected.append(row)
    for g_row, e_row in zip(got, expected):
        assert len(g_row) == len(e_row)
        for g, e in zip(g_row, e_row):
            assert abs(g - e) < 1e-3 * max(1.0, abs(e))
